// Status helpers for recall. Debian's Abseil (20220623) ships absl::Status and
// absl::StatusOr but not the RETURN_IF_ERROR / ASSIGN_OR_RETURN macros; these are ours.
//
//   RECALL_RETURN_IF_ERROR(DoThing());
//   RECALL_ASSIGN_OR_RETURN(auto value, MaybeValue());
//
// Thread safety: the macros are expressions over their arguments only.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

#define RECALL_STATUS_CONCAT_INNER_(a, b) a##b
#define RECALL_STATUS_CONCAT_(a, b) RECALL_STATUS_CONCAT_INNER_(a, b)

#define RECALL_RETURN_IF_ERROR(expr)                    \
  do {                                                  \
    ::absl::Status recall_status_ = (expr);             \
    if (!recall_status_.ok()) return recall_status_;    \
  } while (0)

#define RECALL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#define RECALL_ASSIGN_OR_RETURN(lhs, expr) \
  RECALL_ASSIGN_OR_RETURN_IMPL_(RECALL_STATUS_CONCAT_(recall_statusor_, __LINE__), lhs, expr)

namespace recall {

// Prefixes `status`'s message with `context` ("file.bin: ..."), keeping the code.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// A message that names field `from` first ("messages: ...") names `to` instead, keeping the
// code: an edge whose request carries that text in a field of its own (a completion's
// "prompt") passes on a worker's error in its caller's terms. Others are returned as they are.
inline absl::Status RenameField(const absl::Status& status, absl::string_view from,
                                absl::string_view to) {
  absl::string_view message = status.message();
  if (status.ok() || !absl::ConsumePrefix(&message, from) || !absl::StartsWith(message, ": ")) {
    return status;
  }
  return absl::Status(status.code(), absl::StrCat(to, message));
}

}  // namespace recall
