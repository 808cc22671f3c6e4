// recall-coordinator over TLS and mTLS, with certificates made by openssl for the test: a
// client that trusts the CA gets through; a plaintext client, a client that does not trust
// the CA, or (under mTLS) a client without a certificate does not, and the SDK's error says
// what TLS needs (a failed handshake reads as a closed socket).
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "client/client.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recall/v1/chat.grpc.pb.h"
#include "tests/common/test_certs.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class CoordinatorTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveOpenssl()) GTEST_SKIP() << "no openssl";
    dir_ = testing::MakeTempDir("tls");
    ASSERT_TRUE(testing::MakeTestCertificates(dir_)) << "openssl failed";
  }

  void StartCoordinator(bool mtls) {
    std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--data-dir", dir_,
                                     "--tls-cert", dir_ + "/server.pem", "--tls-key",
                                     dir_ + "/server.key"};
    if (mtls) {
      args.push_back("--tls-client-ca");
      args.push_back(dir_ + "/ca.pem");
    }
    std::string error;
    ASSERT_TRUE(coordinator_.Start(RECALL_COORDINATOR_BINARY, args, dir_, &error)) << error;
  }

  grpc::Status ListModels(std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto stub = v1::Chat::NewStub(grpc::CreateChannel(
        "localhost:" + std::to_string(coordinator_.port("grpc")), creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListModelsResponse resp;
    return stub->ListModels(&ctx, v1::ListModelsRequest(), &resp);
  }

  std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca, bool with_cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read(dir_ + "/" + ca);
    if (with_cert) {
      o.pem_cert_chain = Read(dir_ + "/client.pem");
      o.pem_private_key = Read(dir_ + "/client.key");
    }
    return grpc::SslCredentials(o);
  }

  std::string dir_;
  ServerProcess coordinator_;
};

TEST_F(CoordinatorTlsTest, TlsAcceptsClientsThatTrustTheCaOnly) {
  StartCoordinator(/*mtls=*/false);
  EXPECT_TRUE(ListModels(Tls("ca.pem", false)).ok());
  EXPECT_FALSE(ListModels(grpc::InsecureChannelCredentials()).ok());
  EXPECT_FALSE(ListModels(Tls("other.pem", false)).ok());
}

TEST_F(CoordinatorTlsTest, MutualTlsRequiresAClientCertificate) {
  StartCoordinator(/*mtls=*/true);
  EXPECT_TRUE(ListModels(Tls("ca.pem", true)).ok());
  EXPECT_FALSE(ListModels(Tls("ca.pem", false)).ok());
}

// What the SDK says when the handshake fails: a plaintext client is told a TLS server needs
// its CA; a TLS client without a certificate that a certificate is asked for.
TEST_F(CoordinatorTlsTest, TheSdkNamesWhatTlsNeedsWhenItCannotConnect) {
  StartCoordinator(/*mtls=*/true);
  const std::string address = "localhost:" + std::to_string(coordinator_.port("grpc"));
  const auto refused = [&](std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto client = Client::Connect({.address = address, .retries = 1, .credentials = creds});
    return client->CreateSession({}).status();
  };
  const absl::Status plain = refused(nullptr);
  EXPECT_EQ(plain.code(), absl::StatusCode::kUnavailable) << plain;
  EXPECT_NE(plain.message().find("One that serves TLS needs the client's TLS settings"),
            std::string::npos)
      << plain;
  const absl::Status no_cert = refused(Tls("ca.pem", false));
  EXPECT_EQ(no_cert.code(), absl::StatusCode::kUnavailable) << no_cert;
  EXPECT_NE(no_cert.message().find("needs the client's certificate and key"), std::string::npos)
      << no_cert;
}

}  // namespace
}  // namespace recall
