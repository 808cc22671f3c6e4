#include "common/port_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace recall {

absl::Status WritePortFile(const std::string& path, const std::string& line) {
  const std::string tmp = path + ".tmp";
  const auto failed = [&](const std::string& what) {
    const std::string cause = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat("--port-file: cannot ", what, " ", tmp, ": ", cause));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return failed("create");
  const bool written = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  if (std::fclose(f) != 0 || !written) return failed("write");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string cause = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat("--port-file: cannot rename ", tmp, " to ", path, ": ", cause));
  }
  return absl::OkStatus();
}

}  // namespace recall
