// CheckPicks (kernels/cpu/pick_check.h): passes for the reference picks on host and opaque
// memory, and names the op and the row when a backend picks otherwise.
#include "kernels/cpu/pick_check.h"

#include <memory>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/delegating_backend.h"

namespace recall::kernels {
namespace {

// The CPU backend, except that its picks are shifted: SampleRows' sampled rows (or, with
// `argmax`, every ArgmaxRows row) get the next token id.
class ShiftedPicks final : public testing::DelegatingBackend {
 public:
  explicit ShiftedPicks(bool argmax) : argmax_(argmax) {}
  const char* Name() const override { return "shifted"; }
  void ArgmaxRows(const float* x, int rows, int cols, int32_t* out) override {
    cpu_->ArgmaxRows(x, rows, cols, out);
    for (int r = 0; argmax_ && r < rows; ++r) ++out[r];
  }
  void SampleRows(const float* x, int rows, int cols, const SamplingParams* params,
                  const float* draws, int32_t* out) override {
    cpu_->SampleRows(x, rows, cols, params, draws, out);
    for (int r = 0; !argmax_ && r < rows; ++r) out[r] += params[r].temperature > 0 ? 1 : 0;
  }

 private:
  bool argmax_;
};

TEST(CheckPicksTest, TheReferencePicksPassOnHostAndOpaqueMemory) {
  const absl::Status st = testing::OnHostAndOpaqueCpu(CheckPicks);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(CheckPicksTest, AWrongPickIsNamedWithItsOpAndRow) {
  ShiftedPicks sampled(/*argmax=*/false);
  absl::Status st = CheckPicks(sampled);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("SampleRows picked 18 where the host reference picks 17 (check row 2"),
            std::string::npos)
      << st;
  ShiftedPicks greedy(/*argmax=*/true);
  st = CheckPicks(greedy);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("ArgmaxRows picked 701 where the host reference picks 700"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace recall::kernels
