// LoadAll: what the model options ask for, checked before loading.
#include "worker/model/load.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "common/flags.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::model {
namespace {

// --random-weights of a config bigger than the machine filled memory until the system swapped
// to a halt or the OOM killer came (a 324 GiB config ran past a minute on a 24 GiB machine):
// refused before allocating, naming the option, the size and the memory available.
TEST(LoadAllTest, RandomWeightsBiggerThanTheMemoryAreRefusedBeforeAllocating) {
  const std::string dir = testing::MakeTempDir("random_weights");
  {
    std::ofstream out(dir + "/config.json");
    out << "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":65536,"
           "\"intermediate_size\":1048576,\"num_hidden_layers\":1024,"
           "\"num_attention_heads\":512,\"num_key_value_heads\":512,\"vocab_size\":32000,"
           "\"max_position_embeddings\":4096}";
  }
  LoadOptions options;
  options.model = dir;
  options.random_weights = true;
  auto loaded = LoadAll(options);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kResourceExhausted) << loaded.status();
  EXPECT_EQ(flags::FieldOf(loaded.status()), "random_weights") << loaded.status();
  EXPECT_NE(loaded.status().message().find("config.json in bf16 need "), std::string::npos)
      << loaded.status();
  EXPECT_NE(loaded.status().message().find("GiB of memory available"), std::string::npos)
      << loaded.status();
}

}  // namespace
}  // namespace recall::model
