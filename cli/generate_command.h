// `recall generate`: load a model locally and generate text from a prompt.
#pragma once

#include <string>
#include <vector>

namespace recall::cli {

// Returns the process exit code (0 ok, 2 bad usage, 1 runtime failure).
int RunGenerate(const std::vector<std::string>& argv);

}  // namespace recall::cli
