// Random ids the coordinator makes: sessions ("s-"), its own run ("c-", StoredMessage::writer)
// and each worker attempt ("c-", RunTurnRequest.request_id): 128 random bits in hex after the
// prefix, unique across coordinators and restarts. Thread safe.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace recall::coordinator {

std::string RandomId(absl::string_view prefix);

}  // namespace recall::coordinator
