// The fixed files the hf_config and hf_index fuzzers load beside their input, and the
// index that fits them: a tiny Llama (test::TinyHf) as one model.safetensors, or as two
// shards (tensors alternating between them, in name order).
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/worker/model/test_files.h"

namespace recall::fuzz {

inline constexpr char kShard1[] = "model-00001-of-00002.safetensors";
inline constexpr char kShard2[] = "model-00002-of-00002.safetensors";

// Writes config.json and the weights into `dir`; returns the index JSON for the shards.
inline std::string WriteHfFixture(const std::string& dir, bool sharded) {
  const model::test::TinyHf spec;
  spec.WriteConfig(dir);
  model::test::SafetensorsWriter all = spec.Tensors(), first, second;
  if (!sharded) {
    all.Write(dir + "/model.safetensors");
    return "";
  }
  std::string index = "{\"metadata\":{\"total_size\":0},\"weight_map\":{";
  int i = 0;
  for (const auto& [name, t] : all.tensors()) {
    const bool one = i++ % 2 == 0;
    (one ? first : second).Add(name, t);
    absl::StrAppend(&index, i > 1 ? "," : "", "\"", name, "\":\"", one ? kShard1 : kShard2, "\"");
  }
  first.Write(dir + "/" + kShard1);
  second.Write(dir + "/" + kShard2);
  return index + "}}";
}

}  // namespace recall::fuzz
