// recall: the command line. Subcommands:
//   generate          run a model in-process and print generated text
//   calibrate-window  print LazyEviction's window W for a model
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/calibrate_command.h"
#include "client/cli/generate_command.h"

namespace {

constexpr char kUsage[] = R"(usage: recall <command> [options]

commands:
  generate          load a model locally and generate text (recall generate --help)
  calibrate-window  LazyEviction's window W for a model (recall calibrate-window --help)
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "generate") return recall::cli::RunGenerate(rest);
  if (command == "calibrate-window") return recall::cli::RunCalibrateWindow(rest);
  std::cerr << "recall: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
