#include "fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/chat_template.h"

namespace recall::fuzz {
namespace {

void RemoveScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(ScratchDir(), ec);
}

bool InsideStorage(const model::Model& m, const kernels::Matrix& x) {
  const char* begin = static_cast<const char*>(x.data);
  for (const auto& s : m.storage) {
    const char* base = static_cast<const char*>(s->data());
    if (begin >= base && begin + x.bytes() <= base + s->size()) return true;
  }
  return false;
}

void CheckMatrix(const model::Model& m, const kernels::Matrix& x, int64_t rows, int64_t cols,
                 const char* name) {
  Require(x.rows == rows && x.cols == cols,
          absl::StrCat(name, " is [", x.rows, ", ", x.cols, "], the config implies [", rows, ", ",
                       cols, "]"));
  Require(x.data != nullptr && InsideStorage(m, x),
          absl::StrCat(name, " does not lie inside the model's storage"));
}

}  // namespace

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* env = std::getenv("RECALL_FUZZ_SCRATCH");
    const char* root = env != nullptr && *env != '\0'              ? env
                       : std::filesystem::is_directory("/dev/shm") ? "/dev/shm"
                                                                   : "/tmp";
    std::string pattern = absl::StrCat(root, "/recall_fuzz_XXXXXX");
    Require(mkdtemp(pattern.data()) != nullptr, "cannot create a scratch directory");
    auto* d = new std::string(pattern);
    std::atexit(RemoveScratchDir);
    return d;
  }();
  return *dir;
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  Require(out.good(), absl::StrCat("cannot write ", path));
}

void WriteFile(const std::string& path, std::string_view bytes) {
  WriteFile(path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

void Require(bool condition, std::string_view what) {
  if (condition) return;
  std::fprintf(stderr, "recall fuzz: broken promise: %.*s\n", static_cast<int>(what.size()),
               what.data());
  std::abort();
}

void CheckModel(const model::Model& m) {
  const model::ModelConfig& c = m.config;
  Require(c.Validate().ok(),
          absl::StrCat("loaded config fails Validate: ", c.Validate().message()));
  const int64_t D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const int64_t q = c.n_heads * hd, kv = c.n_kv_heads * hd;
  CheckMatrix(m, m.tok_embeddings, c.vocab_size, D, "tok_embeddings");
  CheckMatrix(m, m.lm_head, c.vocab_size, D, "lm_head");
  CheckMatrix(m, m.final_norm, 1, D, "final_norm");
  Require(static_cast<int64_t>(m.layers.size()) == c.n_layers, "layer count != n_layers");
  for (const model::LayerWeights& w : m.layers) {
    CheckMatrix(m, w.attn_norm, 1, D, "attn_norm");
    CheckMatrix(m, w.wq, q, D, "wq");
    CheckMatrix(m, w.wk, kv, D, "wk");
    CheckMatrix(m, w.wv, kv, D, "wv");
    CheckMatrix(m, w.wo, D, q, "wo");
    CheckMatrix(m, w.ffn_norm, 1, D, "ffn_norm");
    CheckMatrix(m, w.w_gate, H, D, "w_gate");
    CheckMatrix(m, w.w_up, H, D, "w_up");
    CheckMatrix(m, w.w_down, D, H, "w_down");
    if (c.qkv_bias) {
      CheckMatrix(m, w.bq, 1, q, "bq");
      CheckMatrix(m, w.bk, 1, kv, "bk");
      CheckMatrix(m, w.bv, 1, kv, "bv");
    }
    if (c.qk_norm) {
      CheckMatrix(m, w.q_norm, 1, hd, "q_norm");
      CheckMatrix(m, w.k_norm, 1, hd, "k_norm");
    }
  }
}

void ExerciseTokenizer(const model::Tokenizer& tok) {
  const int n = tok.vocab_size();
  Require(n >= 1, absl::StrCat("a loaded tokenizer has vocab_size ", n));
  for (int32_t id : {tok.bos_id(), tok.eos_id()}) {
    Require(id >= -1 && id < n, absl::StrCat("special id ", id, " outside [0, ", n, ")"));
  }
  std::string bytes;
  for (int b = 1; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  std::vector<std::string> texts = {"", " ", bytes, "Once upon a time, 42 <s>cats</s>\n\t  ",
                                    "\xE2\x96\x81\xE2\x96\x81x \xC3\xA9\xCC\x81 <|im_end|>"};
  for (model::ChatFormat f :
       {model::ChatFormat::kChatML, model::ChatFormat::kLlama2, model::ChatFormat::kLlama3}) {
    auto text = model::RenderChat(f, {{"system", "S"}, {"user", "Hi!"}}, true);
    if (text.ok()) texts.push_back(*text);
  }
  for (const std::string& text : texts) {
    for (bool add_bos : {false, true}) {
      for (bool special : {false, true}) {
        const std::vector<int32_t> ids = tok.Encode(text, add_bos, special);
        for (int32_t id : ids) {
          Require(id >= 0 && id < n, absl::StrCat("Encode gave id ", id, " outside [0, ", n, ")"));
        }
        tok.Decode(ids, /*skip_special=*/false);
        tok.Decode(ids, /*skip_special=*/true);
        model::TokenStreamDecoder stream(tok);
        for (int32_t id : ids) stream.Next(id);
        stream.Flush();
      }
    }
  }
  // Ids a model with a larger vocabulary may sample: ignored, never read.
  std::vector<int32_t> outside = {-1, n, n + 1, 0x7fffffff};
  for (int32_t id = 0; id < n && id < 64; ++id) outside.push_back(id);
  tok.Decode(outside, false);
  model::TokenStreamDecoder stream(tok);
  for (int32_t id : outside) stream.Next(id);
  stream.Flush();
  for (const char* piece : {"<s>", "</s>", "<unk>", "<|im_end|>", "", " "}) {
    if (std::optional<int32_t> id = tok.PieceToId(piece)) {
      Require(*id >= 0 && *id < n, absl::StrCat("PieceToId gave id ", *id));
    }
  }
}

}  // namespace recall::fuzz
