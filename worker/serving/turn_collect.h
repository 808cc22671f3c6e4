// CollectTurn: reads a TurnStream to its end (tests, benchmarks, in-process callers).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/serving/turn_stream.h"

namespace recall::serving {

struct Collected {
  absl::Status status;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  // when requested
  std::string text;
  TurnSummary summary;
  int updates = 0;
};

inline Collected CollectTurn(TurnStream& stream, absl::Duration timeout = absl::Seconds(120)) {
  Collected c;
  TurnUpdate u;
  while (stream.Next(timeout, &u)) {
    ++c.updates;
    c.token_ids.insert(c.token_ids.end(), u.token_ids.begin(), u.token_ids.end());
    c.logprobs.insert(c.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    c.text += u.text;
    if (u.done) {
      c.status = u.status;
      c.summary = u.summary;
      return c;
    }
  }
  c.status = absl::DeadlineExceededError("the turn did not end in time");
  return c;
}

}  // namespace recall::serving
