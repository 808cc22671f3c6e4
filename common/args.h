// A small command-line parser for the `recall` subcommands and the server binaries: --name value or --name=value,
// boolean switches, repeated flags. Every error names the flag and what was expected.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recall {

class Args {
 public:
  // `switches` are flags that take no value (e.g. "stats"); any other flag takes one.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::vector<std::string>& known_flags,
                                    const std::vector<std::string>& switches);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string GetString(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> GetAll(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback, int64_t min,
                                 int64_t max) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback, double min,
                                   double max) const;
  // A byte size: "1048576", "512M", "2GiB", "1.5GB" (K/M/G are binary; KB/MB/GB decimal).
  absl::StatusOr<int64_t> GetBytes(const std::string& name, int64_t fallback, int64_t min) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

}  // namespace recall
