// Helpers for the loader tests: write raw files, safetensors files and tiny synthetic
// Hugging Face model directories into a temp dir.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/tensor.h"
#include "worker/model/half.h"

namespace recall::model::test {

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The value the synthetic files store at element i of the tensor with index `salt`.
inline float TestValue(int salt, int64_t i) {
  return static_cast<float>((salt * 131 + i * 7) % 97 - 48) / 64.0f;
}

inline std::string Encode(const std::vector<float>& v, kernels::DType dtype) {
  std::string out;
  for (float f : v) {
    if (dtype == kernels::DType::kF32) {
      out.append(reinterpret_cast<const char*>(&f), 4);
    } else {
      const uint16_t h = dtype == kernels::DType::kF16 ? F32ToF16(f) : F32ToBf16(f);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

inline const char* SafetensorsDType(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return "F32";
    case kernels::DType::kF16:
      return "F16";
    case kernels::DType::kBF16:
      return "BF16";
    case kernels::DType::kI8:
      return "I8";
    case kernels::DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

// The 8-byte little-endian length, the header and the data.
inline std::string SafetensorsBytes(const std::string& header, const std::string& data,
                                    uint64_t header_len_field) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header_len_field >> (8 * i)) & 0xff);
  return out + header + data;
}

struct TestTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
  kernels::DType dtype = kernels::DType::kF32;
  // When set, written as these bytes with this safetensors dtype (e.g. "F8_E4M3") instead.
  std::string raw;
  std::string raw_dtype;
};

// A tiny safetensors writer. Tensors are written in name order.
class SafetensorsWriter {
 public:
  void Add(const std::string& name, const TestTensor& t) { tensors_[name] = t; }
  std::map<std::string, TestTensor>& tensors() { return tensors_; }

  // Header JSON and data section; `pad` keeps the data 8-byte aligned like real files.
  void Build(std::string* header, std::string* data, bool pad = true) const {
    std::vector<std::string> entries = {"\"__metadata__\":{\"format\":\"pt\"}"};
    for (const auto& [name, t] : tensors_) {
      const std::string bytes = t.raw_dtype.empty() ? Encode(t.values, t.dtype) : t.raw;
      const char* dtype = t.raw_dtype.empty() ? SafetensorsDType(t.dtype) : t.raw_dtype.c_str();
      entries.push_back(absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":[",
                                     absl::StrJoin(t.shape, ","), "],\"data_offsets\":[",
                                     data->size(), ",", data->size() + bytes.size(), "]}"));
      *data += bytes;
    }
    *header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
    while (pad && header->size() % 8 != 0) *header += ' ';
  }

  void Write(const std::string& path, bool pad = true) const {
    std::string header, data;
    Build(&header, &data, pad);
    WriteFile(path, SafetensorsBytes(header, data, header.size()));
  }

 private:
  std::map<std::string, TestTensor> tensors_;
};

// Shape of a tiny synthetic HF model.
struct TinyHf {
  std::string architecture = "LlamaForCausalLM";
  int dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 16, seq = 32;
  int head_dim = 4;  // written to config.json only when explicit_head_dim
  bool explicit_head_dim = false;
  bool qkv_bias = false;
  bool qk_norm = false;
  bool lm_head = true;
  kernels::DType dtype = kernels::DType::kF32;

  std::string ConfigJson() const {
    std::string j =
        absl::StrCat("{\"architectures\":[\"", architecture, "\"],\"hidden_size\":", dim,
                     ",\"intermediate_size\":", hidden, ",\"num_hidden_layers\":", layers,
                     ",\"num_attention_heads\":", heads, ",\"num_key_value_heads\":", kv_heads,
                     ",\"vocab_size\":", vocab, ",\"max_position_embeddings\":", seq,
                     ",\"rope_theta\":500000.0,\"rms_norm_eps\":1e-6,\"tie_word_embeddings\":",
                     lm_head ? "false" : "true", ",\"bos_token_id\":3,\"eos_token_id\":[4,5]");
    if (explicit_head_dim) absl::StrAppend(&j, ",\"head_dim\":", head_dim);
    return j + "}";
  }

  // Every tensor the model needs, with TestValue contents.
  SafetensorsWriter Tensors() const {
    SafetensorsWriter w;
    int salt = 0;
    auto add = [&](const std::string& name, std::vector<int64_t> shape) {
      TestTensor t;
      t.shape = shape;
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      for (int64_t i = 0; i < n; ++i) t.values.push_back(TestValue(salt, i));
      t.dtype = dtype;
      ++salt;
      w.Add(name, t);
    };
    const int64_t q = int64_t{heads} * head_dim, kv = int64_t{kv_heads} * head_dim;
    add("model.embed_tokens.weight", {vocab, dim});
    for (int l = 0; l < layers; ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".");
      add(p + "input_layernorm.weight", {dim});
      add(p + "self_attn.q_proj.weight", {q, dim});
      add(p + "self_attn.k_proj.weight", {kv, dim});
      add(p + "self_attn.v_proj.weight", {kv, dim});
      add(p + "self_attn.o_proj.weight", {dim, q});
      if (qkv_bias) {
        add(p + "self_attn.q_proj.bias", {q});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.bias", {kv});
      }
      if (qk_norm) {
        add(p + "self_attn.q_norm.weight", {head_dim});
        add(p + "self_attn.k_norm.weight", {head_dim});
      }
      add(p + "post_attention_layernorm.weight", {dim});
      add(p + "mlp.gate_proj.weight", {hidden, dim});
      add(p + "mlp.up_proj.weight", {hidden, dim});
      add(p + "mlp.down_proj.weight", {dim, hidden});
    }
    add("model.norm.weight", {dim});
    if (lm_head) add("lm_head.weight", {vocab, dim});
    return w;
  }

  void WriteConfig(const std::string& dir) const { WriteFile(dir + "/config.json", ConfigJson()); }
  void Write(const std::string& dir) const {
    WriteConfig(dir);
    Tensors().Write(dir + "/model.safetensors");
  }
};

// The number of fp32 values after a llama2.c header {dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, seq_len} (vocab_size < 0: an untied classifier follows).
inline int64_t Llama2cFloats(const std::vector<int32_t>& h) {
  const int64_t dim = h[0], hidden = h[1], layers = h[2], head_dim = h[0] / h[3];
  const int64_t kv_dim = h[4] * head_dim, vocab = h[5] < 0 ? -int64_t{h[5]} : h[5];
  const int64_t per_layer = 2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * hidden * dim;
  return vocab * dim + layers * per_layer + dim + int64_t{h[6]} * head_dim +
         (h[5] < 0 ? vocab * dim : 0);
}

// A llama2.c checkpoint exactly as long as `header` implies; weight k is TestValue(0, k).
inline std::string Llama2cCheckpoint(const std::vector<int32_t>& header) {
  std::string out(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  const int64_t floats = Llama2cFloats(header);
  for (int64_t k = 0; k < floats; ++k) {
    const float f = TestValue(0, k);
    out.append(reinterpret_cast<const char*>(&f), 4);
  }
  return out;
}

// The first `vocab` pieces of a llama2.c tokenizer.bin laid out as a SentencePiece export:
// <unk>, <s>, </s>, <0x00>..<0xFF> (ids 3..258, run.c's byte fallback), then " ", the
// letters, and " " + each letter, scored so that longer pieces merge first.
inline std::string Llama2cTokenizerBytes(int vocab) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    pieces.push_back(hex);
  }
  pieces.push_back(" ");
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(std::string(1, c));
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(std::string(" ") + c);
  std::string out;
  const int32_t max_len = 6;
  out.append(reinterpret_cast<const char*>(&max_len), 4);
  for (int id = 0; id < vocab; ++id) {
    const std::string& p = pieces.at(static_cast<size_t>(id));
    const float score = static_cast<float>(p.size()) - id * 1e-3f;
    const int32_t len = static_cast<int32_t>(p.size());
    out.append(reinterpret_cast<const char*>(&score), 4);
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += p;
  }
  return out;
}
inline constexpr int kLlama2cTokenizerMaxVocab = 3 + 256 + 1 + 26 + 26;

// A byte-level BPE tokenizer.json with one token per byte (id = byte value) and no merges.
inline std::string ByteLevelTokenizerJson() {
  std::string vocab;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : 256 + extra++;
    std::string utf8;  // cp < 0x800: one or two bytes
    if (cp < 0x80) {
      utf8 = std::string(1, static_cast<char>(cp));
    } else {
      utf8 = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    if (utf8 == "\"" || utf8 == "\\") utf8 = "\\" + utf8;
    absl::StrAppend(&vocab, b > 0 ? "," : "", "\"", utf8, "\":", b);
  }
  return absl::StrCat(
      "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,"
      "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
      "\"trim_offsets\":true,\"use_regex\":true},\"post_processor\":null,"
      "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{",
      vocab, "},\"merges\":[]}}");
}

}  // namespace recall::model::test
