// CheckLazyEvict (kernels/cpu/lazy_evict_check.h): passes for the reference on host and opaque
// memory, and names what differs when a backend keeps, or moves, otherwise.
#include "kernels/cpu/lazy_evict_check.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/delegating_backend.h"

namespace recall::kernels {
namespace {

// The reference LazyEvict with one fault: with `wrong_keep` the last candidate the first row
// keeps is replaced by the slot after it; otherwise the ts of its first kept slot is off by
// one.
class WrongEvict final : public testing::DelegatingBackend {
 public:
  explicit WrongEvict(bool wrong_keep) : wrong_keep_(wrong_keep) {}
  const char* Name() const override { return "wrong"; }
  void LazyEvict(const LazyEvictArgs& a) override {
    cpu_->LazyEvict(a);
    if (wrong_keep_) {
      int32_t& last_candidate = a.keep_out[a.keeps[0] - a.window - 1];
      ++last_candidate;
    } else {
      ++a.ts[a.rows[0] * a.state_stride];
    }
  }

 private:
  bool wrong_keep_;
};

TEST(CheckLazyEvictTest, TheReferencePassesOnHostAndOpaqueMemory) {
  const absl::Status st = testing::OnHostAndOpaqueCpu(CheckLazyEvict);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(CheckLazyEvictTest, AWrongKeepListOrStateIsNamed) {
  WrongEvict keeps(/*wrong_keep=*/true);
  absl::Status st = CheckLazyEvict(keeps);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("wrong backend: LazyEvict kept slot"), std::string::npos) << st;
  EXPECT_NE(st.message().find("of row 0 (2100 slots, keep 700)"), std::string::npos) << st;
  WrongEvict state(/*wrong_keep=*/false);
  st = CheckLazyEvict(state);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("LazyEvict left ts"), std::string::npos) << st;
  EXPECT_NE(st.message().find("at row 0 slot 0"), std::string::npos) << st;
}

}  // namespace
}  // namespace recall::kernels
