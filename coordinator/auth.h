// API keys: a file of "<key> <tenant>" lines ('#' comments, blank lines ignored). A call
// carries its key as "Bearer <key>": in the "authorization" metadata on gRPC, in the
// Authorization header on HTTP; both map to the same tenants. Without a key file (local use,
// `recall serve`) every caller is the tenant "default". Replace swaps in a file read again
// (SIGHUP) while calls go on.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace recall::coordinator {

class ApiKeys {
 public:
  static ApiKeys Open() { return ApiKeys(); }  // no keys: auth off
  // "<key> <tenant>" per line ('#' starts a comment). InvalidArgument naming the file and
  // line for a malformed line or a key given twice, and naming the file for one that is
  // missing, not a regular file or over kMaxKeysFileBytes.
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  static constexpr size_t kMaxKeysFileBytes = 16 << 20;
  // A key travels in a request's metadata (gRPC's default bound: 8 KiB in all); a tenant
  // names its sessions in the store, logs and metrics.
  static constexpr size_t kMaxKeyBytes = 4096;
  static constexpr size_t kMaxTenantBytes = 256;

  // The caller's tenant, or UNAUTHENTICATED (missing or unknown key, or more than one: the
  // tenant would depend on their order).
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContextBase& context) const;
  // The same from the header's value ("Bearer <key>"); nullopt: no header.
  absl::StatusOr<std::string> AuthenticateBearer(
      const std::optional<std::string>& authorization) const;
  // UNAUTHENTICATED when keys are on: a request carried `count` > 1 keys.
  absl::Status CheckOneKey(size_t count) const;
  bool enabled() const { return enabled_; }
  // How many tenants the keys name (a tenant may hold several keys).
  size_t tenants() const;
  bool Has(const std::string& key) const;

  // The keys of `other` (a file read again: recall-coordinator's SIGHUP) in place of these,
  // for every call from now on; calls already authenticated keep their tenant. REQUIRES: both
  // enabled.
  void Replace(const ApiKeys& other);

 private:
  using Map = std::map<std::string, std::string>;
  std::shared_ptr<const Map> Current() const;

  bool enabled_ = false;
  std::unique_ptr<absl::Mutex> mu_ = std::make_unique<absl::Mutex>();
  std::shared_ptr<const Map> tenant_by_key_ = std::make_shared<const Map>();  // under *mu_
};

}  // namespace recall::coordinator
