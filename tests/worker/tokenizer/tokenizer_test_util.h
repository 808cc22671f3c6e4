// Helpers for the tokenizer tests: the committed corpus and goldens, temp copies.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace recall::model::testing {

inline std::string TestdataPath(const std::string& name) {
  return ::recall::testing::SourcePath("tests/worker/tokenizer/testdata/" + name);
}

inline nlohmann::json ReadJsonFile(const std::string& path) {
  const std::string text = ::recall::testing::ReadFileOrEmpty(path);
  return nlohmann::json::parse(text);  // throws (failing the test) if missing or broken
}

// testdata/corpus.json: varied strings (ASCII, whitespace runs, CJK, emoji, code, ...).
inline std::vector<std::string> LoadCorpus() {
  return ReadJsonFile(TestdataPath("corpus.json")).get<std::vector<std::string>>();
}

inline bool IsAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

// Checked by nlohmann's serializer, independently of the code under test.
inline bool IsValidUtf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace recall::model::testing
