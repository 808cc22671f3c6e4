// Session: one conversation's state on a worker between turns, owned by the scheduler.
//
// The cache holds the K/V of `tokens` (after eviction, a budgeted subset of them); `pending`
// are tokens that were sampled but not yet fed (the last token of a reply that ended by
// length). `messages` is the transcript as this worker saw it, ending with its last reply.
// A follow-up turn appends ContinuationText (turn_prompt.h) to the cache; when that is not
// possible (a template without stable prefixes) the cache is rebuilt from the transcript. A
// reply cut at a stop string gives back the tokens after the cut first (Unfeed).
//
// Under tensor parallelism every rank holds its own slice of the session's cache (its KV
// heads) and its own evictor: caches[r] and evictors[r]. They always move together: all
// resident, all offloaded or none. Rank 0's cache answers the questions every rank answers
// alike (positions, lengths, residency).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cache/episodic/embedder.h"
#include "cache/episodic/episodes.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "worker/model/chat_template.h"
#include "worker/serving/cache_factory.h"
#include "worker/serving/turn_request.h"

namespace recall::serving {

struct EpisodeResult;

// EpiCache state of a session whose policy is "episodic" (one rank; scheduler_episodes.cc).
// Until its history first exceeds the budget (and its episodes are built off the serving
// path) the session runs on one lazy cache. Then each episode has a cache compressed to the
// budget; the one serving the current turn is the session's caches[0], the others are
// parked here, offloaded to host memory. A cache holds the session's first upto[e] tokens
// (compressed); when a turn is routed to it, the tokens after those are fed again first.
struct SessionEpisodes {
  SessionEpisodes();
  ~SessionEpisodes();
  // Settings: the cache the session's first request resolved to (later turns keep it).
  SessionCacheSpec spec;
  // Built episodes ([E] each); empty before the first build.
  std::vector<cache::episodic::Episode> list;
  std::vector<std::unique_ptr<cache::SequenceCache>> parked;  // null for the active episode
  std::vector<size_t> upto;
  std::unique_ptr<cache::episodic::Embedder> router;  // TF-IDF fitted on the windows; null: model
  int active = -1;            // the episode in caches[0]; -1: the pre-episode lazy cache
  bool fell_back = false;     // the last routing had no answer (most recent episode served)
  int turns_since_build = 0;  // turns served since the last build was submitted
  uint64_t generation = 0;    // of the last job submitted
  bool building = false;      // a job is queued or building
  // Host bytes counted against the host budget for the job while it is queued or building:
  // its pool and its episodes' host copies (EpisodeBuildHostBytes); given back when its result
  // is taken, whose installation then counts what it holds.
  int64_t build_host_bytes = 0;
  bool build_deferred = false;           // the last job waited for host memory (counted once)
  std::unique_ptr<EpisodeResult> ready;  // a finished build, installed next turn

  // Host bytes of the parked caches.
  int64_t parked_host_bytes() const;
};

// A transcript's digest (role and content of each message, in order), chained: Digest(d, m)
// is the digest of the messages of d, then m. Salted per process: it compares transcripts
// within one worker only.
constexpr uint64_t kEmptyTranscriptDigest = 0;
uint64_t ChainDigest(uint64_t digest, const model::ChatMessage& m);
uint64_t TranscriptDigest(const std::vector<model::ChatMessage>& messages);

struct Session {
  std::string id;
  // The transcript as this worker saw it: message_count messages, of digest `digest`.
  // `messages` holds the last of them, from the last turn's user message on (what the next
  // turn's ContinuationText reads), or all of them for an episodic session (its episodes
  // are built from them); so a session's host memory does not grow with its length. The
  // coordinator keeps the whole transcript and sends it when a rebuild needs it.
  std::vector<model::ChatMessage> messages;
  int64_t message_count = 0;
  uint64_t digest = kEmptyTranscriptDigest;
  // The tokens fed to the cache, in order: the last ones, about twice the model's context
  // length of them once there are that many (all of them for an episodic session), so that
  // a window of the context length is left after a reply's cut gives tokens back;
  // tokens_fed counts them all.
  std::vector<int32_t> tokens;
  int64_t tokens_fed = 0;
  std::vector<int32_t> pending;  // sampled, not fed yet
  // The end of the last reply's text that the cache does not hold: a reply cut at a stop
  // string gave back its tokens from the cut on (Unfeed), and this is what the last of them
  // had before the cut. The next turn feeds it (encoded) before its own text.
  std::string reply_tail;
  // One per rank (empty: no cache yet). Declared before the evictors, which refer to them
  // and so are destroyed first.
  std::vector<std::unique_ptr<cache::SequenceCache>> caches;
  std::vector<std::unique_ptr<cache::eviction::SessionEvictor>> evictors;  // empty: full cache
  std::unique_ptr<SessionEpisodes> episodic;                               // policy "episodic" only
  // What happens at the model's context length (runtime/positions.h), from the session's
  // cache settings.
  runtime::Positions positions = runtime::Positions::kOriginal;
  bool prefill_compressed = false;  // a compresses_prefill() policy ran once
  bool busy = false;                // a turn is running or waiting
  // The last turn, as it can be taken back after its end (its client left as it ended: the
  // Abort came late): while the session has fed nothing since, giving back its tokens and
  // restoring what it changed leaves the session as an Abort before its end would have
  // (Scheduler::TakeBackFinished). Unset where that would not be exact (a rebuild; a reply
  // cut at a stop string in a session that evicts).
  struct LastTurn {
    std::string request_id;
    int64_t fed_before = 0;  // tokens_fed before and after it
    int64_t fed_after = 0;
    int prompt_tokens = 0;         // of the tokens it fed, its prompt's
    bool after_reply = false;      // the transcript before it ended with a reply
    std::vector<int32_t> pending;  // pending, reply_tail and the transcript before it
    std::string reply_tail;
    std::vector<model::ChatMessage> messages;
    int64_t message_count = 0;
    uint64_t digest = kEmptyTranscriptDigest;
    int64_t message_bytes = 0;
  };
  std::optional<LastTurn> last_turn;
  int64_t message_bytes = 0;        // role and content bytes of `messages`
  int64_t last_used = 0;            // scheduler step of the last activity (LRU)

  // Rank 0's cache and evictor (null when there is none).
  cache::SequenceCache* cache() const { return caches.empty() ? nullptr : caches[0].get(); }
  cache::eviction::SessionEvictor* evictor() const {
    return evictors.empty() ? nullptr : evictors[0].get();
  }
  bool resident() const { return cache() != nullptr && !cache()->offloaded(); }
  bool offloaded() const { return cache() != nullptr && cache()->offloaded(); }

  // The transcript becomes `all` (a rebuild's history).
  void SetTranscript(std::vector<model::ChatMessage> all);
  // Appends `added` to the transcript (a turn's messages and its reply), then keeps what
  // `messages` keeps (above).
  void AddMessages(const std::vector<model::ChatMessage>& added);
  // Whether `messages` is the whole transcript.
  bool holds_transcript() const { return static_cast<int64_t>(messages.size()) == message_count; }
  // Appends tokens fed to the cache; a session that is not episodic keeps the last
  // 2 * `context` of them (trimmed when it holds three times that).
  void Feed(const int32_t* begin, const int32_t* end, size_t context);
  // Takes the last n tokens fed back out of every rank's cache (SequenceCache::DropNewest),
  // its evictor's state and the token copy (an episodic session's active cache: the parked
  // episodes hold fewer tokens than were fed before this turn). REQUIRES: a resident cache,
  // the n tokens fed one position after another.
  void Unfeed(int n);
  // Host bytes of the transcript and tokens kept (not counted in the KV figures).
  int64_t transcript_bytes() const;

  // The longest (layer, KV head) row of any rank's cache.
  int max_length() const;
  // Whether the cache cannot go past the model's context length although its positions are
  // compact: its policy does not evict while tokens are fed (SnapKV evicts at the first
  // prompt only). It ends there as a session that keeps its positions does.
  bool ends_at_context() const;

  // Summed over the ranks. bytes_held: the caches' KV bytes (in the pools); state_bytes: the
  // eviction policies' per-slot state (SessionEvictor::state_bytes(), in host memory or the
  // backend's), held beside them for as long as the session lives.
  int64_t bytes_held() const;
  int64_t state_bytes() const;
  // What an offloaded session holds in host memory: its caches' copies and its policies'
  // state (which stays where it is), counted against the host budget. 0 when resident.
  int64_t host_bytes() const;
  // Offloads every rank's cache to host memory.
  void Offload();
  // Restores every rank's cache; on failure the ranks restored so far are offloaded again
  // (all or nothing) and the error is returned.
  absl::Status Restore();
};

}  // namespace recall::serving
