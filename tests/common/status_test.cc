#include "common/status.h"

#include "gtest/gtest.h"

namespace recall {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("x must be even");
  return x / 2;
}

absl::Status QuarterInto(int x, int* out) {
  RECALL_ASSIGN_OR_RETURN(int half, Half(x));
  RECALL_ASSIGN_OR_RETURN(*out, Half(half));
  return absl::OkStatus();
}

absl::Status CheckEven(int x) {
  RECALL_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPropagatesValueAndError) {
  int out = 0;
  EXPECT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
  const absl::Status st = QuarterInto(6, &out);  // 6/2 = 3 is odd
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "x must be even");
}

TEST(StatusMacros, ReturnIfErrorStopsAtFirstError) {
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(3).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacros, AnnotateKeepsCodeAndPrefixesMessage) {
  const absl::Status st = Annotate(absl::NotFoundError("no such file"), "model.bin");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "model.bin: no such file");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(StatusMacros, RenameFieldRenamesOnlyTheLeadingField) {
  const absl::Status st =
      RenameField(absl::InvalidArgumentError("messages: too long"), "messages", "prompt");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "prompt: too long");
  for (const absl::Status& other :
       {absl::InvalidArgumentError("messages[2].content: bad"),  // another field
        absl::InvalidArgumentError("the messages: x"), absl::OkStatus()}) {
    EXPECT_EQ(RenameField(other, "messages", "prompt"), other);
  }
}

}  // namespace
}  // namespace recall
