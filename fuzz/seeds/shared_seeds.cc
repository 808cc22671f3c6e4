// Seeds derived at run time from the real files in shared/. Whole files where a load is
// cheap (stories260K.bin, tok512.bin, SmolLM2's config.json); cut down where a whole file
// would cost milliseconds per execution (the 32k tokenizer.bin and tokenizer.model keep
// their first 1000 tokens, SmolLM2's tokenizer.json its first 1000 tokens and the merges
// among them); and stories260K's weights rewritten as a safetensors file with Hugging Face
// names (no such real file is in shared/).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/seeds/seeds.h"
#include "fuzz/seeds/sentencepiece_proto.h"
#include "nlohmann/json.hpp"
#include "tests/worker/model/test_files.h"

namespace recall::fuzz {
namespace {

using nlohmann::json;
namespace test = model::test;

bool Read(const std::string& path, std::string* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "recall_fuzz_seeds: shared file missing, skipped: %s\n", path.c_str());
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  *bytes = ss.str();
  return true;
}

// stories260K.bin's weights as model.safetensors tensors (f32) and a matching config.json.
void StoriesAsHf(const std::string& checkpoint, const std::string& out) {
  int32_t h[7];
  std::memcpy(h, checkpoint.data(), sizeof(h));
  const int64_t D = h[0], H = h[1], L = h[2], V = h[5], kv = h[4] * (D / h[3]);
  size_t pos = sizeof(h);
  auto take = [&](std::vector<int64_t> shape) {
    test::TestTensor t;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.values.resize(static_cast<size_t>(n));
    std::memcpy(t.values.data(), checkpoint.data() + pos, static_cast<size_t>(n) * 4);
    pos += static_cast<size_t>(n) * 4;
    return t;
  };
  test::SafetensorsWriter w;
  w.Add("model.embed_tokens.weight", take({V, D}));
  const char* kinds[] = {
      "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.down_proj.weight",    "mlp.up_proj.weight"};
  const std::vector<int64_t> shapes[] = {{D}, {D, D}, {kv, D}, {kv, D}, {D, D},
                                         {D}, {H, D}, {D, H},  {H, D}};
  for (int k = 0; k < 9; ++k) {  // llama2.c stores each kind for all layers together
    for (int64_t l = 0; l < L; ++l)
      w.Add(absl::StrCat("model.layers.", l, ".", kinds[k]), take(shapes[k]));
  }
  w.Add("model.norm.weight", take({D}));
  std::string header, data;
  w.Build(&header, &data);
  WriteSeed(out, "safetensors", "stories260K.safetensors",
            test::SafetensorsBytes(header, data, header.size()));
  const json config = {{"architectures", {"LlamaForCausalLM"}},
                       {"hidden_size", D},
                       {"intermediate_size", H},
                       {"num_hidden_layers", L},
                       {"num_attention_heads", h[3]},
                       {"num_key_value_heads", h[4]},
                       {"vocab_size", V},
                       {"max_position_embeddings", h[6]},
                       {"rms_norm_eps", 1e-5},
                       {"tie_word_embeddings", true}};
  WriteSeed(out, "hf_config", "stories260K_config.json", config.dump());
}

// The header and first `keep` tokens of a llama2.c tokenizer.bin ("" if it is shorter).
std::string CutLlama2cTokenizer(const std::string& bytes, int keep) {
  size_t pos = 4;
  for (int i = 0; i < keep; ++i) {
    int32_t len = 0;
    if (bytes.size() < pos + 8) return "";
    std::memcpy(&len, bytes.data() + pos + 4, 4);
    if (len < 0 || bytes.size() - pos - 8 < static_cast<size_t>(len)) return "";
    pos += 8 + static_cast<size_t>(len);
  }
  return bytes.substr(0, pos);
}

// The first `keep` tokens of a tokenizer.json, the merges among them and its added tokens.
std::string CutTokenizerJson(const std::string& text, int keep) {
  json root = json::parse(text);
  json& model = root["model"];
  json vocab = json::object();
  for (const auto& [token, id] : model["vocab"].items()) {
    if (id.get<int>() < keep) vocab[token] = id;
  }
  json merges = json::array();
  for (const json& m : model["merges"]) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      a = s.substr(0, s.find(' '));
      b = s.substr(s.find(' ') + 1);
    } else {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(m);
  }
  model["vocab"] = vocab;
  model["merges"] = merges;
  json added = json::array();
  for (const json& a : root["added_tokens"]) {
    if (a["id"].get<int>() < keep) added.push_back(a);
  }
  root["added_tokens"] = added;
  return root.dump();
}

}  // namespace

int WriteSharedSeeds(const std::string& shared, const std::string& out) {
  int n = 0;
  std::string bytes;
  if (Read(shared + "/models/stories260K/stories260K.bin", &bytes)) {
    WriteSeed(out, "llama2c_model", "stories260K.bin", bytes);
    StoriesAsHf(bytes, out);
    n += 3;
  }
  if (Read(shared + "/models/stories260K/tok512.bin", &bytes)) {
    WriteSeed(out, "llama2c_tokenizer", "tok512.bin", bytes);
    ++n;
  }
  if (Read(shared + "/tokenizers/llama2-32k/tokenizer.bin", &bytes)) {
    const std::string cut = CutLlama2cTokenizer(bytes, 1000);
    if (!cut.empty()) {
      WriteSeed(out, "llama2c_tokenizer", "llama2_32k_first1000.bin", cut);
      ++n;
    }
  }
  if (Read(shared + "/tokenizers/llama2-32k/tokenizer.model", &bytes)) {
    const std::string cut = sp::KeepFirstPieces(bytes, 1000);
    if (!cut.empty()) {
      WriteSeed(out, "sentencepiece", "llama2_32k_first1000.model", cut);
      ++n;
    }
  }
  if (Read(shared + "/tokenizers/smollm2/config.json", &bytes)) {
    WriteSeed(out, "hf_config", "smollm2_config.json", bytes);
    ++n;
  }
  if (Read(shared + "/tokenizers/smollm2/tokenizer.json", &bytes)) {
    WriteSeed(out, "hf_tokenizer", "smollm2_first1000.json", CutTokenizerJson(bytes, 1000));
    ++n;
  }
  return n;
}

}  // namespace recall::fuzz
