// Helpers shared by the serving benchmarks (serving_bench, coordinator_bench): filler
// prompts, percentiles, and starting server processes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/subprocess.h"

namespace recall::bench {

// Deterministic filler text of about `words` words.
inline std::string FillerText(int seed, int words) {
  static const char* kWords[] = {"the", "river", "market", "quiet", "engine", "morning",
                                 "letter", "garden", "blue", "question", "stone", "window",
                                 "travel", "answer", "bright", "story", "north", "music"};
  std::string out;
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed) * 7919u;
  for (int i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    out += kWords[x % (sizeof(kWords) / sizeof(kWords[0]))];
    out += (i % 12 == 11) ? ". " : " ";
  }
  return out;
}

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// Starts `binary args...`; prints FAIL and returns false when it does not come up.
inline bool StartServer(ServerProcess& p, const std::string& binary,
                        const std::vector<std::string>& args) {
  std::string error;
  if (!p.Start(binary, args, "/tmp", &error)) {
    std::printf("FAIL: %s\n", error.c_str());
    return false;
  }
  return true;
}

}  // namespace recall::bench
