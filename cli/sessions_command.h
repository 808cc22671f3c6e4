// `recall sessions`: list a tenant's sessions, show one (text or --json), delete one.
#pragma once

#include <string>
#include <vector>

namespace recall::cli {

int RunSessions(const std::vector<std::string>& argv);

}  // namespace recall::cli
