// gRPC's handshake-failure lines held to one per window (common/grpc/quiet_handshakes.h): the
// first of a window prints, the rest are counted and said with the next one printed; and the
// installed log function prints gRPC's other lines as they come.
#include "common/grpc/quiet_handshakes.h"

#include <grpc/grpc.h>
#include <grpc/support/log.h>

#include <string>

#include "gtest/gtest.h"

namespace recall::grpcutil {
namespace {

TEST(HandshakeLogLimiterTest, OnePerWindowAndTheCountOfThoseHeldBack) {
  HandshakeLogLimiter limiter;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t held = -1;
  ASSERT_TRUE(limiter.Admit(t0, &held));
  EXPECT_EQ(held, 0);
  for (int i = 1; i <= 5; ++i) EXPECT_FALSE(limiter.Admit(t0 + absl::Seconds(i), &held));
  ASSERT_TRUE(limiter.Admit(t0 + HandshakeLogLimiter::kWindow, &held));
  EXPECT_EQ(held, 5);
  ASSERT_TRUE(limiter.Admit(t0 + 3 * HandshakeLogLimiter::kWindow, &held));
  EXPECT_EQ(held, 0);
}

TEST(QuietHandshakeLogsTest, AFloodOfHandshakeFailuresPrintsOnceOtherLinesAll) {
  QuietHandshakeLogs();
  grpc_init();  // (gRPC prints nothing before it, as a server's start does it)
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i) {
    gpr_log(GPR_ERROR, "Handshake failed with fatal error SSL_ERROR_SSL: wrong version number");
  }
  gpr_log(GPR_ERROR, "another error %d", 7);
  const std::string err = ::testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (char c : err) lines += c == '\n';
  EXPECT_EQ(lines, 2u) << err;
  EXPECT_NE(err.find("E grpc quiet_handshakes_test.cc:"), std::string::npos) << err;
  EXPECT_NE(err.find("Handshake failed with fatal error SSL_ERROR_SSL"), std::string::npos) << err;
  EXPECT_NE(err.find("] another error 7\n"), std::string::npos) << err;
  grpc_shutdown();
}

}  // namespace
}  // namespace recall::grpcutil
