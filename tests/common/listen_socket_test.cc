// ListenSocket and ReasonCannotListen on loopback: a free port, a taken one, a host that does
// not resolve.
#include "common/listen_socket.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc/server_start.h"
#include "gtest/gtest.h"

namespace recall {
namespace {

int PortOf(int fd) {
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return -1;
  return ntohs(bound.sin_port);
}

TEST(ListenSocketTest, ATakenPortIsRefusedWithTheSystemsReason) {
  absl::StatusOr<int> first = ListenSocket("127.0.0.1", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = PortOf(*first);
  ASSERT_GT(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  absl::StatusOr<int> second = ListenSocket("127.0.0.1", port);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            absl::StrCat("cannot listen on ", address, ": Address already in use"));
  EXPECT_EQ(ReasonCannotListen(address), "Address already in use");
  const absl::Status said = grpcutil::CannotListen("--listen", address, " (is the port free?)");
  EXPECT_EQ(said.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(said.message(),
            absl::StrCat("--listen: cannot listen on ", address, ": Address already in use"));

  close(*first);
  EXPECT_EQ(ReasonCannotListen(address), "") << "free again";
  EXPECT_EQ(grpcutil::CannotListen("--listen", address, " (is the port free?)").message(),
            absl::StrCat("--listen: cannot listen on ", address, " (is the port free?)"));
}

TEST(ListenSocketTest, AnAddressOfNoInterfaceOrNoHostIsRefusedNamingIt) {
  // 192.0.2.1 (TEST-NET-1) is no address of this machine.
  absl::StatusOr<int> foreign = ListenSocket("192.0.2.1", 0);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonCannotListen("192.0.2.1:0"), "Cannot assign requested address");
  absl::StatusOr<int> unknown = ListenSocket("no-such-host.invalid", 0);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("no-such-host.invalid:0: "), std::string::npos)
      << unknown.status();
  EXPECT_EQ(ReasonCannotListen("not an address"), "");
}

}  // namespace
}  // namespace recall
