// A fixture base for tests that run the real stories260K model from ../shared: skips when
// the data is absent, else loads the model and its tokenizer. A derived SetUp calls
// Stories260KTest::SetUp() first and returns when model_ is null (skipped or failed).
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "worker/model/loader.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::testing {

inline constexpr char kStoriesModel[] = "models/stories260K/stories260K.bin";
inline constexpr char kStoriesTokenizer[] = "models/stories260K/tok512.bin";

class Stories260KTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kStoriesModel);
    auto m = model::LoadModel(SharedPath(kStoriesModel));
    ASSERT_TRUE(m.ok()) << m.status();
    auto tok = model::LoadTokenizer(SharedPath(kStoriesTokenizer), 512);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
    model_ = std::move(*m);
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::Tokenizer> tok_;
};

}  // namespace recall::testing
