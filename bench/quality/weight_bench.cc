// Weight types against f32 on the real stories260K (issue 31): teacher-forced over the quality
// benchmark's texts (eval_set.h, sampled by the f32 model), the mean KL(f32 || variant) of
// the next-token distributions and the top-1 agreement, for
//   - int8 as `--weight-dtype int8` runs it (kernels/cpu/int8.h: per output channel, the LM
//     head and embeddings too), and with the LM head or the embeddings left in f32;
//   - the weight error alone, computed in f32 (weights rounded and widened back):
//     int8 per output channel against int8 per block of 32 or 128 input columns;
//   - FP8 checkpoints written by tools/convert_llama2c_to_hf.py --dtype fp8 (E4M3, block
//     scales of 32 and 128) and loaded by the FP8 loader (worker/model/fp8.h), as loaded
//     (bf16) and requantized to int8.
//
// usage: recall_weight_quality_bench [--model PATH] [--tokenizer PATH] [--texts N]
//                                    [--seed S] [--threads N] [--tmp DIR]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/quality/eval_set.h"
#include "bench/quality/report.h"
#include "cache/block_pool.h"
#include "cache/sequence_cache.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/int8.h"
#include "kernels/half.h"
#include "worker/model/file_storage.h"
#include "worker/model/loader.h"
#include "worker/model/quantize.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {
namespace {

struct Flags {
  std::string model =
      std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/stories260K.bin";
  std::string tokenizer = std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/tok512.bin";
  std::string tool = std::string(RECALL_SOURCE_DIR) + "/tools/convert_llama2c_to_hf.py";
  std::string tmp;  // empty: the temporary directory ($TMPDIR or /tmp)
  int texts = 16;
  int64_t seed = 1;
  int threads = 0;
};

const flags::FlagSet<Flags>& WeightFlags() {
  static const flags::FlagSet<Flags> f = [] {
    flags::FlagSet<Flags> s;
    s.String(
         "model", "PATH",
         "(default " RECALL_SHARED_DIR_DEFAULT
         "/models/stories260K/stories260K.bin;\n"
         "skipped when the default is missing)",
         [](auto& o) -> auto& { return o.model; })
        .String(
            "tokenizer", "PATH",
            "(default " RECALL_SHARED_DIR_DEFAULT "/models/stories260K/tok512.bin)",
            [](auto& o) -> auto& { return o.tokenizer; })
        .Int(
            "texts", "N", "texts (default 16)", [](auto& o) -> auto& { return o.texts; }, 1, 100000)
        .Int(
            "seed", "S", "the texts' seed (default 1)", [](auto& o) -> auto& { return o.seed; }, 0,
            std::numeric_limits<int64_t>::max())
        .Int(
            "threads", "N", "CPU threads (default 0: all cores)",
            [](auto& o) -> auto& { return o.threads; }, 0, 4096)
        .String(
            "tmp", "DIR",
            "an existing directory in which the FP8 checkpoints are written, in a new\n"
            "directory recall_weight_quality_bench.XXXXXX removed at the end; nothing\n"
            "else in DIR is touched (default: the temporary directory, $TMPDIR or /tmp)",
            [](auto& o) -> auto& { return o.tmp; });
    return s;
  }();
  return f;
}

// The next-token log-probabilities after every token of every text (one decode step each).
std::vector<std::vector<float>> TeacherForced(const model::Model& m, kernels::Backend& backend,
                                              const std::vector<EvalText>& texts) {
  const model::ModelConfig& c = m.config;
  auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16},
                                       c.n_layers * (c.max_seq_len / 16 + 2));
  if (!pool.ok()) std::exit(Fail(pool.status()));
  runtime::ForwardPass forward(m, backend, runtime::ForwardOptions{16});
  std::vector<std::vector<float>> out;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  for (const EvalText& text : texts) {
    cache::SequenceCache seq(pool->get());
    for (size_t i = 0; i + 1 < text.tokens.size(); ++i) {
      runtime::BatchItem item{&seq, &text.tokens[i], 1};
      if (absl::Status s = forward.Run({&item, 1}, logits.data()); !s.ok()) std::exit(Fail(s));
      double most = logits[0], sum = 0;
      for (float v : logits) most = std::max(most, static_cast<double>(v));
      for (float v : logits) sum += std::exp(v - most);
      std::vector<float> lp(logits.size());
      for (size_t v = 0; v < logits.size(); ++v) lp[v] = logits[v] - most - std::log(sum);
      out.push_back(std::move(lp));
    }
  }
  return out;
}

// Rounds every linear weight (and the LM head) to int8 with one scale per `block` input
// columns (block = cols: per output channel) and widens it back to f32, in place.
absl::Status FakeInt8(model::Model& m, int64_t block) {
  auto round = [&](kernels::Matrix& w) -> absl::Status {
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<model::HeapStorage> s,
                            model::HeapStorage::Create(w.numel() * sizeof(float)));
    float* out = static_cast<float*>(s->MutableData());
    const int64_t b = std::min(block, w.cols);
    std::vector<float> part(static_cast<size_t>(b));
    std::vector<int8_t> q(static_cast<size_t>(b));
    for (int64_t r = 0; r < w.rows; ++r) {
      for (int64_t c0 = 0; c0 < w.cols; c0 += b) {
        const int64_t n = std::min(b, w.cols - c0);
        for (int64_t c = 0; c < n; ++c)
          part[c] = kernels::LoadAsF32(w.data, w.dtype, r * w.cols + c0 + c);
        float scale = 0;
        kernels::cpu::QuantizeRowsInt8(part.data(), 1, n, q.data(), &scale);
        for (int64_t c = 0; c < n; ++c) out[r * w.cols + c0 + c] = q[c] * scale;
      }
    }
    w = kernels::Matrix{s->data(), kernels::DType::kF32, w.rows, w.cols};
    m.storage.push_back(std::move(s));
    return absl::OkStatus();
  };
  for (model::LayerWeights& l : m.layers) {
    for (kernels::Matrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      RECALL_RETURN_IF_ERROR(round(*w));
    }
  }
  const bool tied = m.lm_head.data == m.tok_embeddings.data;
  RECALL_RETURN_IF_ERROR(round(m.lm_head));
  if (tied) m.tok_embeddings = m.lm_head;
  return absl::OkStatus();
}

constexpr char kUsageHead[] =
    R"U(usage: recall_weight_quality_bench [--model PATH] [--tokenizer PATH] [--texts N]
                                   [--seed S] [--threads N] [--tmp DIR]

Weight types against f32 on stories260K, teacher-forced over the quality benchmark's texts:
the mean KL(f32 || variant) and the top-1 agreement of int8 (as --weight-dtype int8 runs it,
and with the LM head or the embeddings left f32), of int8 per channel against per block
(weights only), and of FP8 checkpoints written by tools/convert_llama2c_to_hf.py (python3)
as loaded and requantized to int8.

options:
)U";

int Run(const Flags& f, const std::string& tmp_dir);

int Main(int argc, char** argv) {
  Flags f;
  if (int rc =
          ParseBenchFlags(argc, argv, "recall_weight_quality_bench", kUsageHead, WeightFlags(), &f);
      rc >= 0) {
    return rc;
  }
  if (int rc = CheckStories260K(f.model, f.tokenizer, RECALL_SHARED_DIR_DEFAULT); rc >= 0) {
    return rc;
  }
  if (f.tmp.empty()) {
    std::error_code ec;
    f.tmp = std::filesystem::temp_directory_path(ec).string();
    if (ec) f.tmp = "/tmp";
  }
  const absl::StatusOr<std::string> tmp =
      MakeScratchDir("--tmp", f.tmp, "recall_weight_quality_bench");
  if (!tmp.ok()) {
    std::fprintf(stderr, "recall_weight_quality_bench: %s\n",
                 std::string(tmp.status().message()).c_str());
    return tmp.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  // The scratch directory goes however Run returns.
  struct Remove {
    std::string dir;
    ~Remove() { RemoveScratchDir(dir); }
  } remove{*tmp};
  return Run(f, *tmp);
}

int Run(const Flags& f, const std::string& tmp_dir) {
  auto reference = model::LoadModel(f.model);
  if (!reference.ok()) return Fail(reference.status());
  auto tokenizer = model::LoadTokenizer(f.tokenizer, (*reference)->config.vocab_size);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend({f.threads});
  const model::ModelConfig& mc = (*reference)->config;

  Stopwatch watch;
  std::vector<EvalText> texts;
  {
    auto pool = cache::BlockPool::Create({mc.n_layers, mc.n_kv_heads, mc.head_dim, 16},
                                         mc.n_layers * (mc.max_seq_len / 16 + 2));
    if (!pool.ok()) return Fail(pool.status());
    runtime::ForwardPass forward(**reference, *backend, runtime::ForwardOptions{mc.max_seq_len});
    EvalSetOptions eo;
    eo.n_texts = f.texts;
    eo.length = mc.max_seq_len;
    eo.seed = f.seed;
    auto sampled = SampleEvalSet(forward, **pool, **tokenizer, eo);
    if (!sampled.ok()) return Fail(sampled.status());
    texts = std::move(*sampled);
  }
  const auto want = TeacherForced(**reference, *backend, texts);
  std::printf(
      "stories260K: %zu texts of %d tokens (the quality benchmark's, seed %llu); "
      "%zu next-token distributions against f32 weights\n\n",
      texts.size(), mc.max_seq_len, static_cast<unsigned long long>(f.seed), want.size());
  std::printf("%-50s %10s %8s\n", "weights", "mean_KL", "top-1");

  auto report = [&](const std::string& name, absl::StatusOr<std::unique_ptr<model::Model>> m) {
    if (!m.ok()) {
      std::printf("%-50s %s\n", name.c_str(), std::string(m.status().message()).c_str());
      return;
    }
    const auto got = TeacherForced(**m, *backend, texts);
    double kl = 0;
    int same = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const std::vector<float>& p = want[i];
      const std::vector<float>& q = got[i];
      for (size_t v = 0; v < p.size(); ++v) kl += std::exp(p[v]) * (p[v] - q[v]);
      same += std::max_element(p.begin(), p.end()) - p.begin() ==
                      std::max_element(q.begin(), q.end()) - q.begin()
                  ? 1
                  : 0;
    }
    std::printf("%-50s %10.5f %7.2f%%\n", name.c_str(), kl / want.size(),
                100.0 * same / want.size());
  };
  // `load` then `change`.
  auto variant = [&](const std::string& path,
                     const std::function<absl::Status(model::Model&)>& change)
      -> absl::StatusOr<std::unique_ptr<model::Model>> {
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::LoadModel(path));
    RECALL_RETURN_IF_ERROR(change(*m));
    return m;
  };
  auto int8 = [](model::Int8Options o) {
    return [o](model::Model& m) { return model::QuantizeWeightsInt8(m, o); };
  };
  auto keep = [](model::Model&) { return absl::OkStatus(); };

  report("int8 (--weight-dtype int8)", variant(f.model, int8({})));
  report("int8, LM head f32", variant(f.model, int8({.lm_head = false})));
  report("int8, embeddings f32", variant(f.model, int8({.embeddings = false})));
  report("int8 per channel, weights only (f32 math)",
         variant(f.model, [](model::Model& m) { return FakeInt8(m, int64_t{1} << 40); }));
  for (const int64_t block : {32, 128}) {
    report(absl::StrCat("int8 per block of ", block, ", weights only"),
           variant(f.model, [block](model::Model& m) { return FakeInt8(m, block); }));
  }
  for (const int block : {32, 128}) {
    const std::string dir = absl::StrCat(tmp_dir, "/fp8_block", block);
    const std::string cmd = absl::StrCat("python3 ", f.tool, " ", f.model, " ", dir,
                                         " --dtype fp8 --fp8-block ", block, " > /dev/null");
    if (std::system(cmd.c_str()) != 0) {
      std::printf("fp8 block %d: the tool failed (%s)\n", block, cmd.c_str());
      continue;
    }
    report(absl::StrCat("FP8 checkpoint, blocks ", block, "x", block, " (as loaded: bf16)"),
           variant(dir, keep));
    report(absl::StrCat("FP8 checkpoint, blocks ", block, "x", block, ", then int8"),
           variant(dir, int8({})));
  }
  std::printf("\n(%.1f s)\n", watch.ElapsedSeconds());
  return 0;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
