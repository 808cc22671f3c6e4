#include "worker/serving/episode_serving.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/episodic/segment.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/runtime/device.h"
#include "worker/runtime/episodic/model_embedder.h"
#include "worker/serving/episode_builder.h"

namespace recall::serving {

namespace ep = cache::episodic;

EpisodeServing::EpisodeServing(const model::Model& model, const model::Tokenizer& tokenizer,
                               cache::BlockPool* pool, int threads, SessionMemory& memory,
                               Counters counters)
    : model_(model),
      tokenizer_(tokenizer),
      pool_(pool),
      threads_(threads),
      memory_(memory),
      counters_(counters) {}

EpisodeServing::~EpisodeServing() = default;

bool EpisodeServing::Supported() const {
  return pool_ != nullptr && pool_->memory().host_accessible();
}

absl::Status EpisodeServing::Start() {
  if (builder_ != nullptr) return absl::OkStatus();
  if (!Supported()) {
    return absl::InvalidArgumentError(
        "cache.policy: episodic runs on one CPU rank (its block-wise build scores keys on the "
        "host); this worker has tp > 1 or a GPU pool");
  }
  RECALL_ASSIGN_OR_RETURN(builder_,
                          EpisodeBuilder::Create(model_, tokenizer_, pool_->layout(), threads_));
  builder_ptr_.store(builder_.get());
  RECALL_ASSIGN_OR_RETURN(
      route_backend_, runtime::MakeBackend({.device = runtime::Device::kCpu, .cpu_threads = 1}));
  runtime::episodic::ModelEmbedderOptions eo;
  eo.add_bos = tokenizer_.bos_id() >= 0;
  eo.max_tokens = std::min(256, model_.config.max_seq_len - 1);
  RECALL_ASSIGN_OR_RETURN(route_embedder_, runtime::episodic::ModelEmbedder::Create(
                                               model_, *route_backend_, tokenizer_, eo));
  return absl::OkStatus();
}

void EpisodeServing::WaitIdle() const {
  if (EpisodeBuilder* b = builder_ptr_.load()) b->WaitIdle();
}

void EpisodeServing::Cancel(const std::string& session) {
  if (builder_ != nullptr) builder_->Cancel(session);
}

cache::eviction::SessionEvictorOptions EpisodeServing::EvictorOptions(const Session& s) const {
  // EpiCache decodes with LazyEviction; head-adaptive budgets (Ada-KV) apply to the episodes'
  // build and to decoding alike.
  cache::eviction::SessionEvictorOptions o = *s.episodic->spec.evictor;
  o.session = std::hash<std::string>()(s.id);
  o.n_heads = model_.config.n_heads;
  return o;
}

void EpisodeServing::Collect() {
  if (builder_ == nullptr) return;
  for (EpisodeResult& r : builder_->TakeReady()) {
    Session* s = memory_.Find(r.session);
    if (s == nullptr || s->episodic == nullptr) continue;
    SessionEpisodes& e = *s->episodic;
    if (r.generation != e.generation) continue;  // a newer job was submitted
    e.building = false;
    memory_.CountHost(-e.build_host_bytes);  // what it holds now is counted if installed
    e.build_host_bytes = 0;
    if (!r.set.ok()) {  // logged by the builder; the session keeps what it has
      counters_.failed->Increment();
      continue;
    }
    e.ready = std::make_unique<EpisodeResult>(std::move(r));
  }
}

void EpisodeServing::Install(Session& s) {
  SessionEpisodes& e = *s.episodic;
  std::unique_ptr<EpisodeResult> r = std::move(e.ready);
  runtime::episodic::EpisodeSet& set = *r->set;
  // The new episodes wait in host memory: they must fit its budget beside everything else
  // (what they replace is freed).
  int64_t incoming = 0;
  for (const auto& c : set.caches) incoming += c->host_bytes();
  const int64_t outgoing = e.parked_host_bytes() + (s.offloaded() ? s.host_bytes() : 0);
  if (!memory_.HostFits(incoming, outgoing)) {
    counters_.over_host->Increment();
    RECALL_LOG(WARNING) << "session " << s.id << ": " << set.caches.size() << " episodes ("
                        << incoming << " host bytes) do not fit --host-cache-bytes; kept "
                        << "serving without them";
    return;
  }
  for (auto& c : set.caches) {
    if (!c->Rebind(pool_).ok()) return;  // same layout by construction
  }
  // The old caches go: the parked ones and the one in use.
  memory_.CountHost(-e.parked_host_bytes());
  if (s.offloaded()) memory_.CountHost(-s.host_bytes());
  s.evictors.clear();
  s.caches.clear();
  e.parked = std::move(set.caches);
  memory_.CountHost(e.parked_host_bytes());
  e.upto.assign(e.parked.size(), r->history_tokens);
  e.list = std::move(set.episodes);
  e.router = std::move(r->router);
  e.active = -1;
  counters_.installed->Increment();
  RECALL_LOG(INFO) << "session " << s.id << ": " << e.list.size() << " episodes installed ("
                   << r->history_tokens << " tokens, built in " << set.build_seconds << " s)";
}

absl::Status EpisodeServing::Switch(Session& s, int episode) {
  SessionEpisodes& e = *s.episodic;
  if (episode == e.active && !s.caches.empty()) return absl::OkStatus();
  if (episode < 0 || episode >= static_cast<int>(e.parked.size()) ||
      e.parked[static_cast<size_t>(episode)] == nullptr) {
    return absl::InternalError(
        absl::StrCat("session ", s.id, ": episode ", episode, " has no cache to switch to"));
  }
  // The new evictor first: if it cannot be made, nothing has changed.
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<cache::eviction::SessionEvictor> evictor,
                          cache::eviction::SessionEvictor::Create(
                              EvictorOptions(s), e.parked[static_cast<size_t>(episode)].get()));
  evictor->EvictAtNextStep();  // the parked cache may be mid-lag, past its budget
  if (!s.caches.empty()) {
    // An offloaded cache's host bytes are counted by memory_ whether it is the
    // session's or parked; only offloading and dropping change the count. An offloaded
    // session's evictor state is on the host too (Session::host_bytes), counted with it.
    if (e.active >= 0) {
      // Park the cache in use (upto: what it held after its last completed turn). Its
      // evictor goes first: a parked cache holds no policy state.
      if (s.offloaded()) memory_.CountHost(-s.state_bytes());
      s.evictors.clear();
      if (s.resident()) memory_.OffloadPinned(s);
      e.parked[static_cast<size_t>(e.active)] = std::move(s.caches[0]);
    } else {
      // The pre-episode lazy cache is replaced by the episodes.
      if (s.offloaded()) memory_.CountHost(-s.host_bytes());
      s.evictors.clear();
    }
    s.caches.clear();
  }
  // The episode's cache becomes the session's (offloaded: admission restores it).
  s.caches.push_back(std::move(e.parked[static_cast<size_t>(episode)]));
  s.evictors.push_back(std::move(evictor));
  if (s.offloaded()) memory_.CountHost(s.state_bytes());  // Restore takes it back
  e.active = episode;
  return absl::OkStatus();
}

void EpisodeServing::Submit(Session& s) {
  SessionEpisodes& e = *s.episodic;
  const int budget = static_cast<int>(e.spec.evictor->budget.budget);
  if (e.building || static_cast<int>(s.tokens.size()) <= budget) return;
  if (!e.list.empty() && e.turns_since_build < e.spec.recluster_turns) return;
  std::vector<ep::Utterance> utterances;
  for (const model::ChatMessage& m : s.messages) utterances.push_back({m.role, m.content});
  absl::StatusOr<std::vector<ep::Window>> windows = ep::SegmentWindows(utterances, 4);
  if (!windows.ok() || windows->size() < 2) return;
  EpisodeJob job;
  job.session = s.id;
  job.generation = ++e.generation;
  job.history = s.tokens;
  job.windows = std::move(*windows);
  // The episodes are compressed to the per-layer budgets decoding uses.
  const cache::eviction::SessionEvictorOptions decode = EvictorOptions(s);
  cache::eviction::BudgetOptions split = decode.budget;
  split.reserved = std::max(split.reserved, decode.policy.window);  // lazy's min_budget()
  absl::StatusOr<cache::eviction::BudgetAllocator> allocator =
      cache::eviction::BudgetAllocator::Create(split, model_.config.n_layers);
  if (!allocator.ok()) return;  // checked when the session's evictor was made
  job.budgets.resize(static_cast<size_t>(model_.config.n_layers));
  allocator->Allocate(static_cast<int64_t>(s.tokens.size()), job.budgets.data());
  job.options.block.head_adaptive = decode.budget.head_adaptive;
  job.embedder = e.spec.embedder;
  job.options.episodes = e.spec.episodes;
  job.options.block.block_tokens = e.spec.block_tokens;
  job.options.block.positions = s.positions;  // compact: a history of any length is read
  // The build's pool and its episodes' copies are host memory: counted against the host
  // budget while it runs; without room the session keeps serving and tries at its next turn.
  const int64_t host = EpisodeBuildHostBytes(job, pool_->layout());
  if (!memory_.HostFits(host)) {
    if (!e.build_deferred) {
      counters_.over_host->Increment();
      RECALL_LOG(WARNING) << "session " << s.id << ": building its episodes needs " << host
                          << " host bytes, over --host-cache-bytes with what it holds now; "
                          << "serving without them until there is room";
    }
    e.build_deferred = true;
    --e.generation;  // no job went out
    return;
  }
  e.build_deferred = false;
  memory_.CountHost(host);
  e.build_host_bytes = host;
  builder_->Submit(std::move(job));
  e.building = true;
  e.turns_since_build = 0;
}

void EpisodeServing::TurnDone(Session& s) {
  SessionEpisodes& e = *s.episodic;
  if (e.active >= 0) e.upto[static_cast<size_t>(e.active)] = s.tokens.size();
}

absl::StatusOr<size_t> EpisodeServing::BeginTurn(Session& s,
                                                 const std::vector<model::ChatMessage>& messages) {
  SessionEpisodes& e = *s.episodic;
  ++e.turns_since_build;
  if (e.ready != nullptr) Install(s);
  size_t held = s.tokens.size();
  if (!e.list.empty()) {
    // Route by the turn's last user message.
    std::string text;
    for (const model::ChatMessage& m : messages) {
      if (m.role == "user") text = m.content;
    }
    const ep::Embedder& embedder =
        e.router != nullptr ? *e.router : static_cast<const ep::Embedder&>(*route_embedder_);
    RECALL_ASSIGN_OR_RETURN(const std::vector<float> q, embedder.Embed(text));
    int episode = ep::RouteToEpisode(q, e.list);
    e.fell_back = episode < 0;
    if (episode < 0) episode = e.active >= 0 ? e.active : static_cast<int>(e.list.size()) - 1;
    if (episode != e.active && e.active >= 0) counters_.switches->Increment();
    RECALL_RETURN_IF_ERROR(Switch(s, episode));
    held = std::min(held, e.upto[static_cast<size_t>(episode)]);
    // upto moves when the turn completes (TurnDone); a turn that fails before it ran leaves
    // the cache, and so upto, as they were.
  }
  Submit(s);
  return held;
}

}  // namespace recall::serving
