// Hugging Face loader: config.json plus model.safetensors (or shards listed in
// model.safetensors.index.json). Matrices are zero-copy views into the mapped files in the
// file's dtype (an FP8 checkpoint's linear weights widened to owned bf16, worker/model/fp8.h);
// norm weights and biases are converted to owned fp32.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/json_limits.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/model/file_storage.h"
#include "worker/model/finite.h"
#include "worker/model/fp8.h"
#include "worker/model/half.h"
#include "worker/model/loader.h"
#include "worker/model/random_model.h"
#include "worker/model/safetensors.h"

namespace recall::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// Where each tensor lives: one file, or shards named by an index's weight_map.
class TensorSource {
 public:
  absl::Status Open(const std::string& dir) {
    const std::string single = dir + "/" + kSingleFile;
    const std::string index = dir + "/" + kIndexFile;
    if (Exists(single)) {
      RECALL_ASSIGN_OR_RETURN(files_[kSingleFile], SafetensorsFile::Open(single));
      single_ = files_[kSingleFile].get();
      return absl::OkStatus();
    }
    if (!Exists(index)) {
      return absl::NotFoundError(absl::StrCat(dir, ": no ", kSingleFile, " and no ", kIndexFile));
    }
    RECALL_RETURN_IF_ERROR(ReadIndex(index));
    for (const auto& [name, shard] : weight_map_) {
      if (files_.count(shard)) continue;
      RECALL_ASSIGN_OR_RETURN(files_[shard], SafetensorsFile::Open(dir + "/" + shard));
    }
    return absl::OkStatus();
  }

  // The tensor, or nullptr if the model does not have it. `file` gets the file to blame.
  absl::StatusOr<const SafetensorsTensor*> Find(const std::string& name, std::string* file) const {
    if (single_ != nullptr) {
      *file = single_->path();
      return single_->Find(name);
    }
    auto it = weight_map_.find(name);
    if (it == weight_map_.end()) {
      *file = index_path_;
      return nullptr;
    }
    const SafetensorsFile& shard = *files_.at(it->second);
    *file = shard.path();
    const SafetensorsTensor* t = shard.Find(name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(index_path_, ": tensor \"", name, "\" is mapped to ",
                                              shard.path(), ", which does not contain it"));
    }
    return t;
  }

  // Records that the model reads tensor `name` (CheckAllUsed passes it).
  void MarkUsed(const std::string& name) { used_.insert(name); }
  bool Used(const std::string& name) const { return used_.count(name) > 0; }

  // Every tensor of the checkpoint (the index's and its shards'), by name, with its file.
  std::map<std::string, std::string> AllTensors() const {
    std::map<std::string, std::string> all;
    for (const auto& [shard, file] : files_) {
      for (const auto& [name, t] : file->tensors()) all.emplace(name, file->path());
    }
    for (const auto& [name, shard] : weight_map_) all.emplace(name, index_path_);
    return all;
  }

  void MoveStorageInto(Model* model) {
    for (auto& [name, file] : files_) model->storage.push_back(file->ReleaseStorage());
  }

 private:
  absl::Status ReadIndex(const std::string& path) {
    index_path_ = path;
    RECALL_RETURN_IF_ERROR(CheckRegularFile(path));
    RECALL_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile("", path, size_t{64} << 20));
    if (absl::Status s = json_limits::CheckJsonFile(text); !s.ok()) return Annotate(s, path);
    try {
      const json j = json::parse(text);
      if (!j.is_object()) return absl::InvalidArgumentError(path + ": not a JSON object");
      auto wm = j.find("weight_map");
      if (wm == j.end()) {
        return absl::InvalidArgumentError(path + ": missing object \"weight_map\"");
      }
      if (!wm->is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": field \"weight_map\" is not an object (got ", wm->dump(), ")"));
      }
      for (const auto& [name, shard] : wm->items()) {
        if (!shard.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": weight_map entry \"", name, "\" is not a file name"));
        }
        const std::string file = shard.get<std::string>();
        if (file.empty() || file.find_first_of(std::string("/\0", 2)) != std::string::npos ||
            file == "." || file == "..") {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": weight_map entry \"", name, "\" names an invalid shard \"", file, "\""));
        }
        weight_map_[name] = file;
      }
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
    }
    return absl::OkStatus();
  }

  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  const SafetensorsFile* single_ = nullptr;
  std::string index_path_;
  std::map<std::string, std::string> weight_map_;
  std::set<std::string> used_;
};

std::string Shape(std::initializer_list<int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Builds the Model's views, checking every tensor against the config.
class Builder {
 public:
  Builder(TensorSource& source, Model* model, bool keep_fp8)
      : source_(source), model_(model), keep_fp8_(keep_fp8) {}

  // A [rows, cols] matrix in the file's dtype; a view unless the data is misaligned. An FP8
  // one is widened to bf16, or kept as FP8 when it is a layer's linear weight and the loader
  // keeps FP8.
  absl::StatusOr<kernels::Matrix> Matrix(const std::string& name, int64_t rows, int64_t cols,
                                         bool linear = false) {
    std::string file;
    RECALL_ASSIGN_OR_RETURN(const SafetensorsTensor* t,
                            Get(name, {rows, cols}, &file, /*fp8=*/true));
    if (t->e4m3) return Fp8Matrix(name, *t, rows, cols, linear && keep_fp8_);
    RECALL_RETURN_IF_ERROR(CheckFinite(file, name, t->data, t->dtype, rows, cols));
    kernels::Matrix m;
    m.dtype = t->dtype;
    m.rows = rows;
    m.cols = cols;
    m.data = t->data;
    if (reinterpret_cast<uintptr_t>(t->data) % kernels::DTypeSize(t->dtype) != 0) {
      RECALL_ASSIGN_OR_RETURN(std::unique_ptr<HeapStorage> copy, HeapStorage::Create(t->bytes));
      std::memcpy(copy->MutableData(), t->data, t->bytes);
      m.data = copy->data();
      model_->storage.push_back(std::move(copy));
    }
    elements_[static_cast<int>(t->dtype)] += t->numel();
    return m;
  }

  // An FP8 weight and its scales, widened to an owned bf16 matrix or kept (fp8.h).
  absl::StatusOr<kernels::Matrix> Fp8Matrix(const std::string& name, const SafetensorsTensor& t,
                                            int64_t rows, int64_t cols, bool keep) {
    std::string file;
    RECALL_ASSIGN_OR_RETURN(const SafetensorsTensor* scale,
                            source_.Find(name + "_scale_inv", &file));
    if (scale == nullptr) {
      return absl::NotFoundError(absl::StrCat(file, ": missing tensor \"", name,
                                              "_scale_inv\" (the scales of F8_E4M3 \"", name,
                                              "\")"));
    }
    source_.MarkUsed(name + "_scale_inv");
    const int(&block)[2] = model_->config.fp8_block;
    RECALL_ASSIGN_OR_RETURN(kernels::Matrix m,
                            keep ? KeepFp8(file, name, t, *scale, rows, cols, block, *model_)
                                 : WidenFp8(file, name, t, *scale, rows, cols, block, *model_));
    elements_[static_cast<int>(m.dtype)] += t.numel();
    return m;
  }

  // A [n] vector converted to an owned fp32 [1, n] matrix.
  absl::StatusOr<kernels::Matrix> Vector(const std::string& name, int64_t n) {
    std::string file;
    RECALL_ASSIGN_OR_RETURN(const SafetensorsTensor* t, Get(name, {n}, &file));
    RECALL_RETURN_IF_ERROR(CheckFinite(file, name, t->data, t->dtype, 1, n));
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<HeapStorage> out,
                            HeapStorage::Create(static_cast<size_t>(n) * sizeof(float)));
    float* dst = static_cast<float*>(out->MutableData());
    for (int64_t i = 0; i < n; ++i) dst[i] = LoadAsF32(t->data, t->dtype, i);
    kernels::Matrix m{out->data(), kernels::DType::kF32, 1, n};
    model_->storage.push_back(std::move(out));
    return m;
  }

  // Whether the checkpoint holds `name`; `file` gets the file that holds it, or would.
  absl::StatusOr<bool> Has(const std::string& name, std::string* file) const {
    RECALL_ASSIGN_OR_RETURN(const SafetensorsTensor* t, source_.Find(name, file));
    return t != nullptr;
  }

  bool Kept(kernels::DType dtype) const { return elements_[static_cast<int>(dtype)] > 0; }

  // The dtype holding most matrix elements.
  kernels::DType MainDType() const {
    int best = 0;
    for (int i = 1; i < kDTypes; ++i) {
      if (elements_[i] > elements_[best]) best = i;
    }
    return static_cast<kernels::DType>(best);
  }

 private:
  // fp8: whether the tensor may be F8_E4M3 (a linear weight of an FP8 checkpoint). `file`
  // gets the file that holds it.
  absl::StatusOr<const SafetensorsTensor*> Get(const std::string& name,
                                               std::initializer_list<int64_t> shape,
                                               std::string* file_out, bool fp8 = false) {
    std::string& file = *file_out;
    RECALL_ASSIGN_OR_RETURN(const SafetensorsTensor* t, source_.Find(name, &file));
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(file, ": missing tensor \"", name, "\""));
    }
    source_.MarkUsed(name);
    if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor \"", name, "\" has shape ",
                                                     t->ShapeString(), ", expected ", Shape(shape),
                                                     " from config.json"));
    }
    if (t->e4m3 && !(fp8 && model_->config.fp8)) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": tensor \"", name, "\" is F8_E4M3, ",
          model_->config.fp8 ? "which only linear weights may be"
                             : "but config.json has no quantization_config with quant_method "
                               "\"fp8\""));
    }
    return t;
  }

  static constexpr int kDTypes = static_cast<int>(kernels::DType::kF8E4M3) + 1;
  TensorSource& source_;
  Model* model_;
  bool keep_fp8_;
  int64_t elements_[kDTypes] = {};
};

absl::Status LoadLayer(Builder& b, const ModelConfig& c, int l, LayerWeights& w) {
  constexpr bool kLinear = true;
  const std::string p = absl::StrCat("model.layers.", l, ".");
  const int64_t D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const int64_t q = c.n_heads * hd, kv = c.n_kv_heads * hd;
  RECALL_ASSIGN_OR_RETURN(w.attn_norm, b.Vector(p + "input_layernorm.weight", D));
  RECALL_ASSIGN_OR_RETURN(w.wq, b.Matrix(p + "self_attn.q_proj.weight", q, D, kLinear));
  RECALL_ASSIGN_OR_RETURN(w.wk, b.Matrix(p + "self_attn.k_proj.weight", kv, D, kLinear));
  RECALL_ASSIGN_OR_RETURN(w.wv, b.Matrix(p + "self_attn.v_proj.weight", kv, D, kLinear));
  RECALL_ASSIGN_OR_RETURN(w.wo, b.Matrix(p + "self_attn.o_proj.weight", D, q, kLinear));
  if (c.qkv_bias) {
    RECALL_ASSIGN_OR_RETURN(w.bq, b.Vector(p + "self_attn.q_proj.bias", q));
    RECALL_ASSIGN_OR_RETURN(w.bk, b.Vector(p + "self_attn.k_proj.bias", kv));
    RECALL_ASSIGN_OR_RETURN(w.bv, b.Vector(p + "self_attn.v_proj.bias", kv));
  }
  if (c.qk_norm) {
    RECALL_ASSIGN_OR_RETURN(w.q_norm, b.Vector(p + "self_attn.q_norm.weight", hd));
    RECALL_ASSIGN_OR_RETURN(w.k_norm, b.Vector(p + "self_attn.k_norm.weight", hd));
  }
  RECALL_ASSIGN_OR_RETURN(w.ffn_norm, b.Vector(p + "post_attention_layernorm.weight", D));
  RECALL_ASSIGN_OR_RETURN(w.w_gate, b.Matrix(p + "mlp.gate_proj.weight", H, D, kLinear));
  RECALL_ASSIGN_OR_RETURN(w.w_up, b.Matrix(p + "mlp.up_proj.weight", H, D, kLinear));
  RECALL_ASSIGN_OR_RETURN(w.w_down, b.Matrix(p + "mlp.down_proj.weight", D, H, kLinear));
  return absl::OkStatus();
}

// Why config `c` reads no tensor `name` (which the loader did not read).
std::string WhyUnused(const ModelConfig& c, absl::string_view name) {
  const std::string arch = ArchName(c.arch);
  if (absl::string_view rest = name; absl::ConsumePrefix(&rest, "model.layers.")) {
    int layer = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer) && layer >= c.n_layers) {
      return absl::StrCat("num_hidden_layers ", c.n_layers);
    }
  }
  if (absl::EndsWith(name, "q_proj.bias") || absl::EndsWith(name, "k_proj.bias") ||
      absl::EndsWith(name, "v_proj.bias")) {
    return absl::StrCat("architecture ", arch, " without attention_bias takes no q/k/v bias");
  }
  if (absl::EndsWith(name, ".bias"))
    return absl::StrCat("architecture ", arch, " takes no such bias");
  if (absl::EndsWith(name, "q_norm.weight") || absl::EndsWith(name, "k_norm.weight")) {
    return absl::StrCat("architecture ", arch, " has no q/k norm");
  }
  if (absl::EndsWith(name, "_scale_inv")) {
    return c.fp8 ? "the weight it scales is not F8_E4M3"
                 : "no quantization_config with quant_method \"fp8\"";
  }
  return absl::StrCat("architecture ", arch, " has no such tensor");
}

// Refuses a checkpoint holding a tensor the model did not read: weights left out silently (a
// layer past num_hidden_layers, a bias the architecture has none of) mean the config does
// not describe the file. Accepted unread: lm_head.weight of a tied model (Hugging Face ties
// the head over whatever is stored) and rotary inv_freq buffers (computed from the config).
absl::Status CheckAllUsed(const TensorSource& source, const ModelConfig& c) {
  for (const auto& [name, file] : source.AllTensors()) {
    if (source.Used(name)) continue;
    if (name == "lm_head.weight" && c.tied_embeddings) continue;
    if (absl::EndsWith(name, "rotary_emb.inv_freq")) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": tensor \"", name, "\" is not used by config.json (", WhyUnused(c, name), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadHuggingFace(const std::string& dir, bool keep_fp8) {
  if (!IsDirectory(dir)) return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  const std::string config_path = dir + "/config.json";
  if (!Exists(config_path)) {
    return absl::NotFoundError(absl::StrCat(config_path,
                                            ": missing (a Hugging Face model "
                                            "directory needs config.json)"));
  }
  auto model = std::make_unique<Model>();
  RECALL_ASSIGN_OR_RETURN(model->config, ReadHfConfig(config_path));
  ModelConfig& c = model->config;

  TensorSource source;
  RECALL_RETURN_IF_ERROR(source.Open(dir));
  Builder b(source, model.get(), keep_fp8);
  RECALL_ASSIGN_OR_RETURN(model->tok_embeddings,
                          b.Matrix("model.embed_tokens.weight", c.vocab_size, c.dim));
  model->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    RECALL_RETURN_IF_ERROR(LoadLayer(b, c, l, model->layers[l]));
  }
  RECALL_ASSIGN_OR_RETURN(model->final_norm, b.Vector("model.norm.weight", c.dim));
  std::string head_file;
  RECALL_ASSIGN_OR_RETURN(bool has_lm_head, b.Has("lm_head.weight", &head_file));
  if (!has_lm_head) {
    // Without the key, a checkpoint lacking the head is tied; an explicit false is not.
    if (c.tie_given && !c.tied_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_path, ": field \"tie_word_embeddings\" is false, but ", head_file,
          " has no tensor \"lm_head.weight\" (set it true to use the embeddings as the head)"));
    }
    c.tied_embeddings = true;
  }
  if (c.tied_embeddings) {
    model->lm_head = model->tok_embeddings;
  } else {
    RECALL_ASSIGN_OR_RETURN(model->lm_head, b.Matrix("lm_head.weight", c.vocab_size, c.dim));
  }
  // A model whose linear weights were kept in FP8 runs only where FP8 matmuls do, whatever
  // the embeddings' share of the elements.
  RECALL_RETURN_IF_ERROR(CheckAllUsed(source, c));
  c.weight_dtype = b.Kept(kernels::DType::kF8E4M3) ? kernels::DType::kF8E4M3 : b.MainDType();
  model->source = dir;
  source.MoveStorageInto(model.get());
  return model;
}

}  // namespace recall::model
