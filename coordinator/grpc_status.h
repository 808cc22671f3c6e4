// absl::Status <-> grpc::Status at the coordinator's edge, and small request checks.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "grpcpp/grpcpp.h"

namespace recall::coordinator {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline grpc::Status Invalid(const std::string& field, const std::string& what) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat(field, ": ", what));
}

inline bool IsUtf8(const std::string& s) { return utf8::IsValid(s); }

// A session id a request names: present, at most 128 bytes, UTF-8.
inline grpc::Status CheckSessionId(const std::string& id) {
  if (id.empty()) return Invalid("session_id", "is required");
  if (id.size() > 128) return Invalid("session_id", absl::StrCat(id.size(), " bytes; at most 128"));
  if (!IsUtf8(id)) return Invalid("session_id", "is not valid UTF-8");
  return grpc::Status::OK;
}

}  // namespace recall::coordinator

#define RECALL_GRPC_RETURN_IF_ERROR(expr)                   \
  do {                                                      \
    const absl::Status recall_st_ = (expr);                 \
    if (!recall_st_.ok()) return ::recall::coordinator::ToGrpc(recall_st_); \
  } while (0)

#define RECALL_GRPC_CONCAT_INNER(a, b) a##b
#define RECALL_GRPC_CONCAT(a, b) RECALL_GRPC_CONCAT_INNER(a, b)
#define RECALL_GRPC_ASSIGN_OR_RETURN(lhs, expr) \
  RECALL_GRPC_ASSIGN_OR_RETURN_IMPL(RECALL_GRPC_CONCAT(recall_sor_, __LINE__), lhs, expr)
#define RECALL_GRPC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)               \
  auto tmp = (expr);                                                    \
  if (!tmp.ok()) return ::recall::coordinator::ToGrpc(tmp.status());    \
  lhs = std::move(*tmp)
