// ServerProcess (common/subprocess.h) with a shell script for a server: a child started to
// die with its parent inherits only stdin, stdout and stderr, not the parent's other file
// descriptors (recall serve's sockets: its clients' connections, held open by a worker).
#include "common/subprocess.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

TEST(ServerProcessTest, AChildThatDiesWithItsParentGetsNoneOfItsParentsFiles) {
  const std::string dir = testing::MakeTempDir("subprocess");
  const std::string script = dir + "/server.sh";
  {
    std::ofstream out(script);
    // Lists its descriptors, then "listens" (the port file is its last argument).
    out << "#!/bin/sh\nls /proc/$$/fd > " << dir << "/fds\n"
        << "for a; do last=$a; done\necho grpc=1 > \"$last\"\nexec sleep 30\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  const int inherited = open(script.c_str(), O_RDONLY);  // no O_CLOEXEC
  ASSERT_GE(inherited, 3);
  ServerProcess child;
  child.set_die_with_parent(true);
  std::string error;
  ASSERT_TRUE(child.Start(script, {}, dir, &error)) << error;
  std::ifstream in(dir + "/fds");
  std::stringstream fds;
  fds << in.rdbuf();
  EXPECT_EQ(("\n" + fds.str()).find("\n" + std::to_string(inherited) + "\n"), std::string::npos)
      << "descriptor " << inherited << " was inherited: " << fds.str();
  EXPECT_NE(fds.str().find("2\n"), std::string::npos) << "stderr is kept: " << fds.str();
  close(inherited);
}

}  // namespace
}  // namespace recall
