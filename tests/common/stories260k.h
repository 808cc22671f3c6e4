// A fixture base for tests that run the real stories260K model from ../shared: skips when
// the data is absent, else loads the model and its tokenizer. A derived SetUp calls
// Stories260KTest::SetUp() first and returns when model_ is null (skipped or failed).
#pragma once

#include <memory>
#include <string>
#include <vector>

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

// Whether a reply of `ids` whose text is `text` was cut at a stop string: its tokens after
// the first (whose bytes depend on the prompt before it) already say more than its text.
inline bool CutAtStopString(const model::Tokenizer& tok, const std::vector<int32_t>& ids,
                            const std::string& text) {
  size_t said = 0;
  for (size_t k = 1; k < ids.size(); ++k) said += tok.TokenBytes(ids[k - 1], ids[k]).size();
  return said > text.size();
}

}  // namespace recall::testing
