// Sessions written into a store for the store tests: 40 of tenant "a" ("s0".."s39").
#pragma once

#include <string>

#include "coordinator/session_store.h"
#include "gtest/gtest.h"

namespace recall::coordinator {

// Creates sessions "s0".."s39" of tenant "a" (model "m") in `store`, each with a user message
// of `message_bytes` bytes (none for 0). ASSERTs each write.
inline void AddTestSessions(SessionStore& store, int message_bytes) {
  for (int i = 0; i < 40; ++i) {
    SessionRecord r;
    r.id = "s" + std::to_string(i);
    r.tenant = "a";
    r.model = "m";
    ASSERT_TRUE(store.Create(r).ok());
    if (message_bytes > 0) {
      ASSERT_TRUE(store.Append("a", r.id, 0, {"user", std::string(message_bytes, 'x')}).ok());
    }
  }
}

}  // namespace recall::coordinator
