// Machine baselines for the speed benchmarks, measured in the same run as the thing they
// are compared with; PrintHelpIfAsked, the --help of every benchmark; ParseBenchFlags, the
// flag parsing of the benchmarks built on flags::FlagSet; and the scratch-directory and
// output-path checks they share.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/flags.h"

namespace recall::bench {

// When any argument is --help or -h: prints `usage` to stdout and returns true (the caller
// then exits 0 before parsing or running anything); false otherwise. Inline, so a benchmark
// that does not link recall_bench_util can use it too:
//   if (PrintHelpIfAsked(argc, argv, kUsage)) return 0;
inline bool PrintHelpIfAsked(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(usage, stdout);
      return true;
    }
  }
  return false;
}

// The help line every benchmark's flag list ends with.
inline constexpr char kHelpFlagLine[] = "  -h, --help              print this and exit\n";

// Parses argv into *options (which holds the defaults) with `flags`. Returns -1 when the
// benchmark should run; 0 after printing `usage_head`, the flags' help and `usage_tail` to
// stdout (--help or -h anywhere); 2 after printing "program: ERROR (program --help lists
// the flags)" to stderr for an unknown flag, a flag without its value or a bad value.
template <typename T>
int ParseBenchFlags(int argc, char** argv, const char* program, const char* usage_head,
                    const flags::FlagSet<T>& flags, T* options, const char* usage_tail = "") {
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(usage_head, stdout);
      std::fputs(flags.Help().c_str(), stdout);
      std::fputs(kHelpFlagLine, stdout);
      std::fputs(usage_tail, stdout);
      return 0;
    }
  }
  if (absl::Status st = flags.Parse(args, options); !st.ok()) {
    std::fprintf(stderr, "%s: %s (%s --help lists the flags)\n", program,
                 std::string(st.message()).c_str(), program);
    return 2;
  }
  return -1;
}

// A new, empty directory PARENT/PREFIX.XXXXXX (mkdtemp) inside `parent`, which must be an
// existing directory; errors name `flag` (InvalidArgument: a bad PARENT, the user's to fix;
// Internal: mkdtemp failed otherwise). The caller removes only this directory afterwards:
// nothing else in `parent` is touched.
inline absl::StatusOr<std::string> MakeScratchDir(const std::string& flag,
                                                  const std::string& parent,
                                                  const std::string& prefix) {
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", parent,
        std::filesystem::exists(parent, ec) ? " is not a directory" : ": no such directory"));
  }
  std::string path = (std::filesystem::path(parent) / (prefix + ".XXXXXX")).string();
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    const int err = errno;
    const std::string why = std::strerror(err);
    if (err == EACCES || err == EROFS || err == EPERM) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": cannot make a directory in ", parent, ": ", why));
    }
    return absl::InternalError(
        absl::StrCat(flag, ": cannot make a directory in ", parent, ": ", why));
  }
  return std::string(buf.data());
}

// Removes a directory MakeScratchDir made (and what the run wrote in it); never throws.
inline void RemoveScratchDir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) {
    std::fprintf(stderr, "warning: cannot remove %s: %s\n", dir.c_str(), ec.message().c_str());
  }
}

// CheckOutputFile (common/files.h) of each (flag, path); prints the first error to stderr and
// returns false.
inline bool OutputPathsWritable(
    std::initializer_list<std::pair<const char*, std::string>> outputs) {
  for (const auto& [flag, path] : outputs) {
    if (absl::Status st = CheckOutputFile(flag, path); !st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return false;
    }
  }
  return true;
}

// STREAM-like copy bandwidth: b[i] = a[i] over two 256 MiB float arrays, split across
// num_threads threads (0 = hardware concurrency, the CPU backend's default). Returns the
// best of several repetitions in GB/s (1e9 bytes/s), counting read + write bytes as STREAM
// does. This is the roofline for bandwidth-bound decode.
double MeasureCopyBandwidthGBs(int num_threads = 0);

// cblas_sgemm rate for C[m, n] = A[m, k] * B[n, k]^T (row major; the layout of the CPU
// backend's prefill matmul), best of several repetitions, in GFLOP/s (2*m*n*k flops), with
// OpenBLAS itself running num_threads threads (0 = hardware concurrency); OpenBLAS's
// previous thread count is restored afterwards. Uses OpenBLAS's current kernels: construct
// the CPU backend first, which repairs a fallback kernel choice on CPUs newer than the
// library (see kernels/cpu/blas_setup.h).
double MeasureSgemmGflops(int m, int n, int k, int num_threads = 0);

}  // namespace recall::bench

// The --model and --tokenizer lines of the stories260K benchmarks' --help (string literal
// pieces, for a usage text made of literals).
#define RECALL_BENCH_STORIES_FLAGS_HELP                              \
  "  --model PATH            (default " RECALL_SHARED_DIR_DEFAULT    \
  "/models/stories260K/stories260K.bin;\n"                           \
  "                          skipped when the default is missing)\n" \
  "  --tokenizer PATH        (default " RECALL_SHARED_DIR_DEFAULT    \
  "/models/stories260K/tok512.bin)\n"
