// `recall serve`: a coordinator and one worker on this machine, in one command.
#pragma once

#include <string>
#include <vector>

namespace recall::cli {

int RunServe(const std::vector<std::string>& argv);

}  // namespace recall::cli
