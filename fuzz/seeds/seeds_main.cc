// recall_fuzz_seeds OUT_DIR [SHARED_DIR]: writes the loader fuzzers' seed corpora into
// OUT_DIR/<fuzzer>/ (emptied first). $RECALL_SHARED_DIR, when set, overrides SHARED_DIR (as
// for the tests); without either, or when its files are missing, the seeds are the
// synthetic ones only.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz/seeds/seeds.h"

namespace recall::fuzz {

void WriteSeed(const std::string& out, const std::string& fuzzer, const std::string& name,
               const std::string& bytes) {
  const std::filesystem::path dir = std::filesystem::path(out) / fuzzer;
  std::filesystem::create_directories(dir);
  std::ofstream file(dir / name, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file.good()) {
    std::fprintf(stderr, "recall_fuzz_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

}  // namespace recall::fuzz

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: recall_fuzz_seeds OUT_DIR [SHARED_DIR]\n");
    return 2;
  }
  const std::string out = argv[1];
  std::string shared = argc > 2 ? argv[2] : "";
  if (const char* env = std::getenv("RECALL_SHARED_DIR"); env != nullptr && *env != '\0') {
    shared = env;
  }
  std::filesystem::remove_all(out);
  std::filesystem::create_directories(out);
  recall::fuzz::WriteSyntheticSeeds(out);
  const int shared_seeds = shared.empty() ? 0 : recall::fuzz::WriteSharedSeeds(shared, out);
  if (shared_seeds == 0) {
    std::fprintf(stderr, "recall_fuzz_seeds: no shared/ seeds (%s); synthetic seeds only\n",
                 shared.empty() ? "no shared dir given" : shared.c_str());
  }
  std::printf("recall_fuzz_seeds: wrote synthetic seeds and %d shared seeds to %s\n", shared_seeds,
              out.c_str());
  return 0;
}
