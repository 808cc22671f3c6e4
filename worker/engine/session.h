// Session: one conversation's state on a worker between turns, owned by the scheduler.
//
// The cache holds the K/V of `tokens` (after eviction, a budgeted subset of them); `pending`
// are tokens that were sampled but not yet fed (the last token of a reply that ended by
// length). `messages` is the transcript as this worker saw it, ending with its last reply.
// A follow-up turn appends ContinuationText (turn_prompt.h) to the cache; when that is not
// possible (a reply cut at a stop string, a template without stable prefixes) the cache is
// rebuilt from the transcript.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "worker/model/chat_template.h"

namespace recall::engine {

struct Session {
  std::string id;
  std::vector<model::ChatMessage> messages;
  std::vector<int32_t> tokens;   // every token fed to the cache, in order
  std::vector<int32_t> pending;  // sampled, not fed yet
  std::unique_ptr<cache::SequenceCache> cache;
  std::unique_ptr<cache::eviction::SessionEvictor> evictor;  // null: full cache
  bool prefill_compressed = false;  // a compresses_prefill() policy ran once
  bool reusable = true;             // the cache can be continued (see above)
  bool busy = false;                // a turn is running or waiting
  int64_t last_used = 0;            // scheduler step of the last activity (LRU)

  bool resident() const { return cache != nullptr && !cache->offloaded(); }
  bool offloaded() const { return cache != nullptr && cache->offloaded(); }
};

}  // namespace recall::engine
