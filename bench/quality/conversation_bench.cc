// Conversation recall benchmark: answer accuracy on held-out multi-session conversations
// (tools/train/gen_conversations.py) for FullKV, every eviction policy and EpiCache at
// every budget, and agreement with FullKV (conversation_eval.h explains the protocol).
// Budgets are fractions of each conversation's length (tokens per layer and KV head), and
// optionally fixed token counts (--token-budgets 512: StreamingLLM's last 512 tokens).
// Prints a table, writes every figure and the settings to --out-json and a plot to
// --out-png (gnuplot; without it a warning, the JSON is still written).
//
// usage: recall_conversation_bench --model DIR --conversations FILE.jsonl [--convs N]
//   [--questions N] [--methods streaming,h2o,tova,lazy,episodic-tfidf]
//   [--budgets 0.1,0.2,0.3,0.5] [--token-budgets 512] [--window W] [--alpha A] [--sinks S]
//   [--prefix N] [--far-tokens N] [--episodes E] [--block-tokens N] [--recent N]
//   [--threads N] [--out-json PATH] [--out-png PATH]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/quality/conversation_eval.h"
#include "bench/quality/conversation_report.h"
#include "bench/quality/report.h"
#include "cache/block_pool.h"
#include "common/clock.h"
#include "kernels/backend.h"
#include "worker/model/loader.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {
namespace {

struct Flags {
  std::string model, conversations;
  int convs = 20;
  int questions = 0;
  std::vector<std::string> methods = {"streaming", "h2o", "tova", "lazy", "episodic-tfidf"};
  std::vector<double> budgets = {0.1, 0.2, 0.3, 0.5};
  std::vector<int> token_budgets = {512};
  ConvEvalOptions eval;
  int threads = 0;
  std::string out_json = "conversation_bench.json";
  std::string out_png = "conversation_bench.png";
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  const auto flag = [&](const std::string& name, const char* v) -> std::optional<bool> {
    bool ok = true;
    auto positive = [&](int* out) { ok = absl::SimpleAtoi(v, out) && *out >= 1; };
    if (name == "--model") f->model = v;
    else if (name == "--conversations") f->conversations = v;
    else if (name == "--convs") positive(&f->convs);
    else if (name == "--questions") ok = absl::SimpleAtoi(v, &f->questions) && f->questions >= 0;
    else if (name == "--methods") f->methods = absl::StrSplit(v, ',', absl::SkipEmpty());
    else if (name == "--budgets") {
      f->budgets.clear();
      for (absl::string_view b : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        double x = 0;
        ok = ok && absl::SimpleAtod(b, &x) && x > 0 && x <= 1;
        f->budgets.push_back(x);
      }
    } else if (name == "--token-budgets") {
      f->token_budgets.clear();
      for (absl::string_view b : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int x = 0;
        ok = ok && absl::SimpleAtoi(b, &x) && x >= 1;
        f->token_budgets.push_back(x);
      }
    } else if (name == "--window") positive(&f->eval.knobs.window);
    else if (name == "--alpha") ok = absl::SimpleAtof(v, &f->eval.knobs.alpha);
    else if (name == "--sinks") ok = absl::SimpleAtoi(v, &f->eval.knobs.sinks);
    else if (name == "--prefix") positive(&f->eval.prefix);
    else if (name == "--far-tokens") ok = absl::SimpleAtoi(v, &f->eval.far_tokens);
    else if (name == "--episodes") positive(&f->eval.episodes);
    else if (name == "--block-tokens") positive(&f->eval.block_tokens);
    else if (name == "--recent") ok = absl::SimpleAtoi(v, &f->eval.recent) && f->eval.recent >= 0;
    else if (name == "--threads") ok = absl::SimpleAtoi(v, &f->threads);
    else if (name == "--out-json") f->out_json = v;
    else if (name == "--out-png") f->out_png = v;
    else {
      return std::nullopt;
    }
    return ok;
  };
  if (!ParseFlagPairs(argc, argv, flag,
                      "budgets are fractions in (0, 1], counts are positive")) {
    return false;
  }
  if (f->model.empty() || f->conversations.empty()) {
    std::fprintf(stderr, "--model DIR and --conversations FILE.jsonl are required\n");
    return false;
  }
  return true;
}

constexpr char kUsage[] =
    R"U(usage: recall_conversation_bench --model DIR --conversations FILE.jsonl [options]

Answer accuracy on held-out multi-session conversations (tools/train/gen_conversations.py)
for FullKV, every eviction policy and EpiCache at every budget, and agreement with FullKV.
Budgets are fractions of each conversation's length (tokens per layer and KV head), and
fixed token counts. Prints a table, writes every figure and the settings to --out-json and a
plot to --out-png (with gnuplot; without it a warning, the JSON is still written).
Every flag takes a value.

options:
  --model DIR             the model (required)
  --conversations FILE    the conversations, JSON lines (required)
  --convs N               conversations at most (default 20)
  --questions N           questions per conversation at most, 0: all (default 0)
  --methods LIST          policies (streaming, h2o, tova, lazy, lazy+, snapkv, vase, ...) and
                          episodic-EMBEDDER (model or tfidf), comma-separated
                          (default streaming,h2o,tova,lazy,episodic-tfidf)
  --budgets LIST          budgets as fractions in (0, 1] (default 0.1,0.2,0.3,0.5)
  --token-budgets LIST    budgets in tokens, positive (default 512)
  --window W              eviction window (default 16)
  --alpha A               LazyEviction's importance threshold (default 1e-4)
  --sinks S               sink tokens that streaming and VaSE always keep (default 4)
  --prefix N              tokens prefilled before the token-by-token feed (default 16)
  --far-tokens N          a question is far when its answer was last stated at least this
                          many tokens before (default 512)
  --episodes E            episodic: episodes (default 4)
  --block-tokens N        episodic: tokens per block of the build (default 512)
  --recent N              episodic: sentences before the question kept uncompressed
                          (default 4)
  --threads N             CPU threads (default 0: all cores)
  --out-json PATH         (default conversation_bench.json)
  --out-png PATH          (default conversation_bench.png)
  -h, --help              print this and exit
)U";

int Main(int argc, char** argv) {
  if (PrintHelpIfAsked(argc, argv, kUsage)) return 0;
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  if (!OutputPathsWritable({{"--out-json", f.out_json}, {"--out-png", f.out_png}})) return 2;
  if (std::error_code ec; !std::filesystem::is_directory(f.model, ec)) {
    std::fprintf(stderr,
                 "--model: %s is not a directory (a model directory is needed: its "
                 "tokenizer is read from it)\n",
                 f.model.c_str());
    return 2;
  }
  auto model = model::LoadModel(f.model);
  if (!model.ok()) return Fail(model.status());
  const model::ModelConfig& mc = (*model)->config;
  auto tokenizer = model::LoadTokenizer(f.model, mc.vocab_size);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  auto convs = LoadQaConversations(f.conversations, **tokenizer, f.convs, f.questions,
                                   mc.max_seq_len);
  if (!convs.ok()) return Fail(convs.status());

  // Rows: FullKV, then per method its fraction budgets and token budgets.
  std::vector<ConvMethod> policies, episodic;
  std::vector<ConvRow> policy_rows, episodic_rows;
  for (const std::string& label : f.methods) {
    auto m = ParseConvMethod(label);
    if (!m.ok()) return Fail(m.status());
    auto add = [&](ConvMethod x, std::string budget, double fraction) {
      (x.episodic ? episodic : policies).push_back(x);
      (x.episodic ? episodic_rows : policy_rows).push_back({x.label, budget, fraction, {}});
    };
    for (double b : f.budgets) {
      ConvMethod x = *m;
      x.fraction = b;
      add(x, absl::StrCat(100 * b, "%"), b);
    }
    for (int t : f.token_budgets) {
      ConvMethod x = *m;
      x.budget_tokens = t;
      add(x, absl::StrCat(t, " tok"), 0);
    }
  }
  int longest = 0;
  for (const QaConversation& c : *convs) {
    std::vector<int> starts;
    longest = std::max(longest, static_cast<int>(QaSequence(c, &starts).size()));
  }
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend({f.threads});
  constexpr int kBlockTokens = 16;
  const kernels::PagedKvLayout layout{mc.n_layers, mc.n_kv_heads, mc.head_dim, kBlockTokens};
  const int runs = static_cast<int>(policies.size()) + 1 + 2 * (episodic.empty() ? 0 : 1);
  auto pool = cache::BlockPool::Create(
      layout, mc.n_layers * (runs * (longest / kBlockTokens + 2) +
                             f.eval.episodes * (f.eval.block_tokens / kBlockTokens + 2) + 8));
  if (!pool.ok()) return Fail(pool.status());
  // Batch-invariant: a method's figures do not depend on which others share its batch.
  runtime::ForwardPass forward(
      **model, *backend,
      {.max_batch_tokens =
           std::max({f.eval.prefix, f.eval.chunk, static_cast<int>(policies.size()) + 1}),
       .batch_invariant = true});
  int64_t questions = 0, min_len = 1 << 30, max_len = 0;
  for (const QaConversation& c : *convs) {
    questions += static_cast<int64_t>(c.questions.size());
    min_len = std::min<int64_t>(min_len, c.conversation_tokens);
    max_len = std::max<int64_t>(max_len, c.conversation_tokens);
  }
  std::printf("model %s: %d layers, %d/%d heads, context %d; %zu conversations of %lld-%lld "
              "tokens, %lld questions\n",
              f.model.c_str(), mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.max_seq_len,
              convs->size(), static_cast<long long>(min_len), static_cast<long long>(max_len),
              static_cast<long long>(questions));

  ConvRow full{"full", "-", 0, {}}, full_1q{"full-1q", "-", 0, {}};
  std::vector<ConvStats> pstats(policies.size()), estats(episodic.size());
  Stopwatch watch;
  for (size_t i = 0; i < convs->size(); ++i) {
    const QaConversation& c = (*convs)[i];
    absl::Status s = EvaluatePolicies(forward, **pool, c, policies, f.eval, &pstats, &full.stats);
    if (s.ok() && !episodic.empty()) {
      s = EvaluateEpisodic(forward, **pool, **tokenizer, c, episodic, f.eval, &estats,
                           &full_1q.stats);
    }
    if (!s.ok()) return Fail(s);
    std::printf("  conversation %zu/%zu (seed %llu, %d tokens) done, %.0f s\n", i + 1,
                convs->size(), static_cast<unsigned long long>(c.seed), c.conversation_tokens,
                watch.ElapsedSeconds());
    std::fflush(stdout);
  }
  const double seconds = watch.ElapsedSeconds();
  std::vector<ConvRow> rows = {full};
  for (size_t i = 0; i < policy_rows.size(); ++i) {
    policy_rows[i].stats = pstats[i];
    rows.push_back(policy_rows[i]);
  }
  if (!episodic.empty()) rows.push_back(full_1q);
  for (size_t i = 0; i < episodic_rows.size(); ++i) {
    episodic_rows[i].stats = estats[i];
    rows.push_back(episodic_rows[i]);
  }
  std::printf("\nevaluated in %.0f s (W=%d, alpha=%g, sinks=%d, prefix=%d; episodic: E=%d, "
              "block %d, recent %d)\n\n",
              seconds, f.eval.knobs.window, f.eval.knobs.alpha, f.eval.knobs.sinks,
              f.eval.prefix, f.eval.episodes, f.eval.block_tokens, f.eval.recent);
  PrintConvTable(rows);
  std::printf("\nacc: answers exactly right (teacher-forced: every answer token is the argmax); "
              "acc_far: the same for answers last stated >= %d tokens before the questions; "
              "full: FullKV on the same questions; agree: answers whose every argmax equals "
              "FullKV's; tok_agr: per answer token; kv: device KV bytes at the end / FullKV's. "
              "Policies run all questions in turn after the conversation (full); episodic "
              "methods get one question per prompt (full-1q is FullKV so).\n",
              f.eval.far_tokens);

  nlohmann::json json;
  json["settings"] = {{"model", f.model},
                      {"conversations_file", f.conversations},
                      {"conversations", convs->size()},
                      {"questions", questions},
                      {"conversation_tokens_min", min_len},
                      {"conversation_tokens_max", max_len},
                      {"methods", f.methods},
                      {"budgets", f.budgets},
                      {"token_budgets", f.token_budgets},
                      {"budget_unit", "tokens per (layer, KV head) = ceil(fraction * "
                                      "conversation tokens)"},
                      {"window", f.eval.knobs.window},
                      {"alpha", f.eval.knobs.alpha},
                      {"sinks", f.eval.knobs.sinks},
                      {"prefix", f.eval.prefix},
                      {"far_tokens", f.eval.far_tokens},
                      {"episodes", f.eval.episodes},
                      {"block_tokens", f.eval.block_tokens},
                      {"recent", f.eval.recent},
                      {"eval_seconds", seconds}};
  json["results"] = ConvRowsJson(rows);
  absl::Status s = WriteJson(f.out_json, json);
  if (!s.ok()) return Fail(s);
  std::printf("wrote %s\n", f.out_json.c_str());
  s = WriteConvPlot(f.out_png,
                    absl::StrCat("Recall questions on ", convs->size(), " held-out conversations (",
                                 min_len, "-", max_len, " tokens), ",
                                 std::filesystem::path(f.model).filename().string()),
                    rows);
  return ReportPlot(s, f.out_png);
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
