// The cluster credential over real processes: a recall-worker and a recall-coordinator
// sharing a cluster token file, the coordinator also checking tenants' API keys. The worker's
// port and the coordinator's recall.v1.Registry accept only the token: no credential is
// UNAUTHENTICATED, a tenant's key PERMISSION_DENIED (it can neither run, drop nor abort turns
// on the worker, nor register or drain workers); the worker registers with the token and
// tenants chat through the coordinator as before. Without a token, API keys close the
// registry.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recall/v1/chat.grpc.pb.h"
#include "recall/v1/registry.grpc.pb.h"
#include "recall/v1/worker.grpc.pb.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";
constexpr char kToken[] = "cluster-0123456789abcdef";

class ClusterCredentialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    dir_ = testing::MakeTempDir("cluster_credential");
    std::ofstream(dir_ + "/keys") << "key-a tenant-a\nkey-b tenant-b\n";
    std::ofstream(dir_ + "/token") << kToken << "\n";
    std::string error;
    ASSERT_TRUE(coordinator_.Start(RECALL_COORDINATOR_BINARY,
                                   {"--listen", "127.0.0.1:0", "--data-dir", dir_, "--api-keys",
                                    dir_ + "/keys", "--cluster-token-file", dir_ + "/token"},
                                   dir_, &error))
        << error;
    coordinator_address_ = "127.0.0.1:" + std::to_string(coordinator_.port("grpc"));
    ASSERT_TRUE(worker_.Start(
        RECALL_WORKER_BINARY,
        {"--model", testing::SharedPath(kModel), "--tokenizer", testing::SharedPath(kTokenizer),
         "--listen", "127.0.0.1:0", "--kv-cache-bytes", "16M", "--threads", "1", "--coordinator",
         coordinator_address_, "--cluster-token-file", dir_ + "/token"},
        dir_, &error))
        << error;
    worker_address_ = "127.0.0.1:" + std::to_string(worker_.port("grpc"));
    worker_stub_ = v1::Worker::NewStub(
        grpc::CreateChannel(worker_address_, grpc::InsecureChannelCredentials()));
    registry_stub_ = v1::Registry::NewStub(
        grpc::CreateChannel(coordinator_address_, grpc::InsecureChannelCredentials()));
    chat_stub_ = v1::Chat::NewStub(
        grpc::CreateChannel(coordinator_address_, grpc::InsecureChannelCredentials()));
  }

  // A context with "authorization: Bearer <bearer>" (none when empty).
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& bearer) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!bearer.empty()) ctx->AddMetadata("authorization", "Bearer " + bearer);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return ctx;
  }

  // Every call of the worker's port with `bearer`: the codes, in order RunTurn, DropSession,
  // Abort{all}, GetLoad, Info.
  std::vector<grpc::StatusCode> WorkerCodes(const std::string& bearer) {
    std::vector<grpc::StatusCode> codes;
    {
      auto ctx = Context(bearer);
      v1::RunTurnRequest req;
      req.set_session_id("victim");
      v1::ChatMessage* m = req.add_messages();
      m->set_role("user");
      m->set_content("Once upon a time");
      req.mutable_sampling()->set_max_tokens(5);
      auto reader = worker_stub_->RunTurn(ctx.get(), req);
      v1::TurnEvent ev;
      int events = 0;
      while (reader->Read(&ev)) ++events;
      codes.push_back(reader->Finish().error_code());
      if (codes.back() != grpc::StatusCode::OK) {
        EXPECT_EQ(events, 0) << "no token before a refusal";
      }
    }
    {
      auto ctx = Context(bearer);
      v1::DropSessionRequest req;
      req.set_session_id("victim");
      v1::DropSessionResponse resp;
      codes.push_back(worker_stub_->DropSession(ctx.get(), req, &resp).error_code());
    }
    {
      auto ctx = Context(bearer);
      v1::AbortRequest req;
      req.set_all(true);
      v1::AbortResponse resp;
      codes.push_back(worker_stub_->Abort(ctx.get(), req, &resp).error_code());
    }
    {
      auto ctx = Context(bearer);
      v1::LoadReport resp;
      codes.push_back(worker_stub_->GetLoad(ctx.get(), v1::GetLoadRequest(), &resp).error_code());
    }
    {
      auto ctx = Context(bearer);
      v1::InfoResponse resp;
      codes.push_back(worker_stub_->Info(ctx.get(), v1::InfoRequest(), &resp).error_code());
    }
    return codes;
  }

  // Register and Drain (of a made-up address) with `bearer`.
  std::vector<grpc::StatusCode> RegistryCodes(const std::string& bearer) {
    std::vector<grpc::StatusCode> codes;
    {
      auto ctx = Context(bearer);
      v1::RegisterRequest req;
      req.set_address("127.0.0.1:1");
      v1::RegisterResponse resp;
      codes.push_back(registry_stub_->Register(ctx.get(), req, &resp).error_code());
    }
    {
      auto ctx = Context(bearer);
      v1::DrainRequest req;
      req.set_address(worker_address_);
      v1::DrainResponse resp;
      codes.push_back(registry_stub_->Drain(ctx.get(), req, &resp).error_code());
    }
    return codes;
  }

  std::string dir_, coordinator_address_, worker_address_;
  ServerProcess coordinator_, worker_;
  std::unique_ptr<v1::Worker::Stub> worker_stub_;
  std::unique_ptr<v1::Registry::Stub> registry_stub_;
  std::unique_ptr<v1::Chat::Stub> chat_stub_;
};

TEST_F(ClusterCredentialTest, OnlyTheClusterTokenReachesTheWorkerAndTheRegistry) {
  using C = grpc::StatusCode;
  const std::vector<C> unauthenticated(5, C::UNAUTHENTICATED), denied(5, C::PERMISSION_DENIED);
  EXPECT_EQ(WorkerCodes(""), unauthenticated);
  EXPECT_EQ(WorkerCodes("key-b"), denied) << "a tenant's key is no cluster credential";
  EXPECT_EQ(WorkerCodes("cluster-0123456789abcdeX"), denied);
  EXPECT_EQ(RegistryCodes(""), std::vector<C>(2, C::UNAUTHENTICATED));
  EXPECT_EQ(RegistryCodes("key-b"), std::vector<C>(2, C::PERMISSION_DENIED));

  // The worker registered with the token; tenant A chats through the coordinator.
  grpc::Status st;
  v1::Session session;
  for (int i = 0; i < 100; ++i) {
    v1::ListModelsResponse models;
    auto mctx = Context("key-a");
    ASSERT_TRUE(chat_stub_->ListModels(mctx.get(), v1::ListModelsRequest(), &models).ok());
    if (models.models_size() == 1 && models.models(0).workers() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  {
    auto ctx = Context("key-a");
    st = chat_stub_->CreateSession(ctx.get(), v1::CreateSessionRequest(), &session);
  }
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto ctx = Context("key-a");
  v1::ConverseRequest req;
  req.set_session_id(session.session_id());
  req.set_message("Once upon a time");
  req.mutable_sampling()->set_max_tokens(8);
  auto reader = chat_stub_->Converse(ctx.get(), req);
  v1::ConverseEvent ev;
  int tokens = 0;
  while (reader->Read(&ev)) tokens += ev.tokens().token_ids_size();
  st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_GT(tokens, 0);

  // The cluster token itself works on both.
  EXPECT_EQ(WorkerCodes(kToken)[3], C::OK);
  EXPECT_EQ(RegistryCodes(kToken), std::vector<C>(2, C::OK));
  // Its scheme in any case, as for API keys ("bearer TOKEN" was PERMISSION_DENIED, "not it").
  grpc::ClientContext lower;
  lower.AddMetadata("authorization", std::string("bearer ") + kToken);
  v1::LoadReport load;
  EXPECT_TRUE(worker_stub_->GetLoad(&lower, v1::GetLoadRequest(), &load).ok());
}

// A coordinator on `dir` with `dir`/keys holding `keys` (no workers, no cluster token), and a
// channel to it.
std::shared_ptr<grpc::Channel> StartKeyed(ServerProcess& coordinator, const std::string& dir,
                                          const std::string& keys) {
  std::ofstream(dir + "/keys") << keys;
  std::string error;
  EXPECT_TRUE(coordinator.Start(
      RECALL_COORDINATOR_BINARY,
      {"--listen", "127.0.0.1:0", "--data-dir", dir, "--api-keys", dir + "/keys"}, dir, &error))
      << error;
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator.port("grpc")),
                             grpc::InsecureChannelCredentials());
}

TEST(ClusterCredentialRegistryTest, ApiKeysWithoutAClusterTokenCloseTheRegistry) {
  const std::string dir = testing::MakeTempDir("cluster_registry_closed");
  ServerProcess coordinator;
  auto stub = v1::Registry::NewStub(StartKeyed(coordinator, dir, "key-a tenant-a\n"));
  for (const std::string& bearer : {std::string(), std::string("key-a")}) {
    grpc::ClientContext ctx;
    if (!bearer.empty()) ctx.AddMetadata("authorization", "Bearer " + bearer);
    v1::RegisterRequest req;
    req.set_address("127.0.0.1:1");
    v1::RegisterResponse resp;
    const grpc::Status st = stub->Register(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << bearer;
    EXPECT_NE(st.error_message().find("--cluster-token-file"), std::string::npos)
        << st.error_message();
  }
}

// The cluster token as a tenant's API key is refused at start (it was taken: that tenant could
// then register and drain workers, and the workers' holder act as the tenant).
TEST(ClusterCredentialFileTest, TheClusterTokenAsAnApiKeyIsRefused) {
  const std::string dir = testing::MakeTempDir("cluster_token_as_key");
  std::ofstream(dir + "/token") << kToken << "\n";
  std::ofstream(dir + "/keys") << "key-a tenant-a\n" << kToken << " tenant-x\n";
  ::chmod((dir + "/token").c_str(), 0600);
  ::chmod((dir + "/keys").c_str(), 0600);
  const auto [code, out] = testing::RunToExit(
      std::string("timeout 10 ") + RECALL_COORDINATOR_BINARY + " --listen 127.0.0.1:0 --data-dir " +
      dir + " --api-keys " + dir + "/keys --cluster-token-file " + dir + "/token");
  EXPECT_GT(code, 0) << out;
  EXPECT_NE(out.find("--api-keys: one of its keys is the cluster token"), std::string::npos) << out;
}

// SIGHUP reads the API key file again: a key removed no longer works, one added does, and a
// file that cannot be parsed keeps the keys in use (it ended the coordinator, unsaid, and a
// revoked key worked until a restart).
TEST(ApiKeysReloadTest, SighupReadsTheKeyFileAgain) {
  const std::string dir = testing::MakeTempDir("api_keys_reload");
  ServerProcess coordinator;
  auto stub = v1::Chat::NewStub(StartKeyed(coordinator, dir, "key-a tenant-a\nkey-b tenant-b\n"));
  const auto list = [&](const std::string& key) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + key);
    v1::ListSessionsResponse resp;
    return stub->ListSessions(&ctx, v1::ListSessionsRequest(), &resp).error_code();
  };
  using C = grpc::StatusCode;
  EXPECT_EQ(list("key-a"), C::OK);
  EXPECT_EQ(list("key-c"), C::UNAUTHENTICATED);
  const auto hangup_until = [&](const std::function<bool()>& done) {
    ASSERT_EQ(kill(coordinator.pid(), SIGHUP), 0);
    for (int i = 0; i < 100 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  std::ofstream(dir + "/keys", std::ios::trunc) << "key-b tenant-b\nkey-c tenant-c\n";
  hangup_until([&] { return list("key-c") == C::OK; });
  EXPECT_EQ(list("key-c"), C::OK);
  EXPECT_EQ(list("key-a"), C::UNAUTHENTICATED) << "a removed key no longer works";
  EXPECT_EQ(list("key-b"), C::OK);
  std::ofstream(dir + "/keys", std::ios::trunc) << "key-d\n";  // malformed: kept as it was
  ASSERT_EQ(kill(coordinator.pid(), SIGHUP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(list("key-c"), C::OK) << "the keys in use are kept";
  EXPECT_EQ(list("key-d"), C::UNAUTHENTICATED);
  EXPECT_EQ(coordinator.Stop(), 0) << "still running, and stops cleanly";
}

TEST(ClusterCredentialFileTest, AShortOrMissingTokenFileStopsTheWorkerAtStart) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("cluster_token_bad");
  std::ofstream(dir + "/short") << "abc\n";
  const std::pair<std::string, std::string> cases[] = {
      {dir + "/short", "the cluster token must be 16 to 4096 bytes, got 3"},
      {dir + "/missing", "--cluster-token-file: cannot read"}};
  for (const auto& [file, message] : cases) {
    const std::string command = std::string(RECALL_WORKER_BINARY) + " --model " +
                                testing::SharedPath(kModel) + " --tokenizer " +
                                testing::SharedPath(kTokenizer) +
                                " --listen 127.0.0.1:0 --cluster-token-file " + file;
    const auto [code, out] = testing::RunToExit(command);
    EXPECT_GT(code, 0) << out;
    EXPECT_NE(out.find(message), std::string::npos) << out;
    EXPECT_EQ(out.find("serving"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace recall
