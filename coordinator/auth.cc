#include "coordinator/auth.h"

#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace recall::coordinator {

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& path) {
  RECALL_ASSIGN_OR_RETURN(const std::string text,
                          ReadSecretFile("--api-keys", path, kMaxKeysFileBytes));
  std::istringstream in(text);
  ApiKeys keys;
  keys.enabled_ = true;
  auto tenant_by_key = std::make_shared<Map>();
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string key, tenant, extra;
    if (!(words >> key)) continue;
    if (!(words >> tenant) || (words >> extra)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": expected \"<key> <tenant>\""));
    }
    // What gRPC metadata can carry (an HTTP-only key was refused by every gRPC client).
    for (const char c : key) {
      if (c < 0x21 || c > 0x7E) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", n,
                         ": the key must be printable ASCII without spaces (gRPC carries no "
                         "other)"));
      }
    }
    // A request's metadata is at most 8 KiB by gRPC's default: a longer key never got through.
    if (key.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": the key is ", key.size(),
                                                     " bytes; at most ", kMaxKeyBytes));
    }
    if (tenant.size() > kMaxTenantBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", n, ": the tenant is ", tenant.size(), " bytes; at most ", kMaxTenantBytes));
    }
    if (!tenant_by_key->emplace(key, tenant).second) {
      // Which tenant the key is would depend on the order of the lines.
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": the key is given twice (a key is one tenant's)"));
    }
  }
  if (tenant_by_key->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no keys"));
  }
  keys.tenant_by_key_ = std::move(tenant_by_key);
  return keys;
}

std::shared_ptr<const ApiKeys::Map> ApiKeys::Current() const {
  absl::MutexLock lock(mu_.get());
  return tenant_by_key_;
}

size_t ApiKeys::tenants() const {
  std::set<std::string> names;
  for (const auto& [key, tenant] : *Current()) names.insert(tenant);
  return names.size();
}

bool ApiKeys::Has(const std::string& key) const { return Current()->count(key) > 0; }

void ApiKeys::Replace(const ApiKeys& other) {
  std::shared_ptr<const Map> keys = other.Current();
  absl::MutexLock lock(mu_.get());
  tenant_by_key_ = std::move(keys);
}

absl::StatusOr<std::string> ApiKeys::Authenticate(const grpc::ServerContextBase& context) const {
  const auto& md = context.client_metadata();
  RECALL_RETURN_IF_ERROR(CheckOneKey(md.count("authorization")));
  auto it = md.find("authorization");
  if (it == md.end()) return AuthenticateBearer(std::nullopt);
  return AuthenticateBearer(std::string(it->second.data(), it->second.size()));
}

absl::Status ApiKeys::CheckOneKey(size_t count) const {
  // Two keys would make the tenant depend on their order (the first was taken).
  if (!enabled_ || count <= 1) return absl::OkStatus();
  return absl::UnauthenticatedError(
      absl::StrCat("authorization: given ", count, " times; send one key"));
}

absl::StatusOr<std::string> ApiKeys::AuthenticateBearer(
    const std::optional<std::string>& authorization) const {
  if (!enabled_) return std::string("default");
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError("authorization: missing; send \"Bearer <api key>\"");
  }
  std::string value = *authorization;
  // The scheme's name is case-insensitive (RFC 9110 11.1).
  const std::string prefix = "Bearer ";
  if (!absl::StartsWithIgnoreCase(value, prefix)) {
    return absl::UnauthenticatedError("authorization: expected \"Bearer <api key>\"");
  }
  value = value.substr(prefix.size());
  const std::shared_ptr<const Map> keys = Current();
  auto key = keys->find(value);
  if (key == keys->end()) {
    return absl::UnauthenticatedError("authorization: unknown API key");
  }
  return key->second;
}

}  // namespace recall::coordinator
