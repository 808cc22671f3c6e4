// `recall chat`: a multi-turn chat against a coordinator (interactive, or one user message
// per line on standard input).
#pragma once

#include <string>
#include <vector>

namespace recall::cli {

int RunChat(const std::vector<std::string>& argv);

}  // namespace recall::cli
