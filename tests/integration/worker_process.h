// A recall-worker child process on stories260K and a gRPC client of it, for the integration
// tests: start with extra flags, run a turn to its end, read the load report.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recall/v1/worker.grpc.pb.h"
#include "tests/common/test_util.h"

namespace recall {

inline constexpr char kModel[] = "models/stories260K/stories260K.bin";
inline constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

struct TurnResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  int token_events = 0;
  bool has_done = false;
  v1::TurnDone done;
  std::optional<int> history_needed;  // a HistoryNeeded event's history_length
};

class Worker {
 public:
  bool Start(std::vector<std::string> extra, std::string* error) {
    std::vector<std::string> args = {"--model", testing::SharedPath(kModel), "--tokenizer",
                                     testing::SharedPath(kTokenizer)};
    args.insert(args.end(), extra.begin(), extra.end());
    return StartWith(std::move(args), error);
  }

  // With the model flags given in `args` (no stories260K defaults).
  bool StartWith(std::vector<std::string> args, std::string* error) {
    for (const char* a : {"--listen", "127.0.0.1:0", "--metrics-port", "0", "--threads", "2"}) {
      args.push_back(a);
    }
    if (!process_.Start(RECALL_WORKER_BINARY, args, testing::MakeTempDir("worker"), error)) {
      return false;
    }
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(process_.port("grpc")),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Worker::NewStub(channel_);
    return true;
  }

  // A channel whose HTTP/2 flow-control window is tiny, so that a reader that falls behind
  // really backs up the server's writes (the default window holds a whole short reply).
  void UseSmallWindow() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 256);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(process_.port("grpc")),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Worker::NewStub(channel_);
  }

  // One RunTurn read to its end; `before_read` runs after the call starts, before its first
  // read (a slow reader).
  TurnResult Run(const v1::RunTurnRequest& request,
                 const std::function<void()>& before_read = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub_->RunTurn(&ctx, request);
    if (before_read) before_read();
    TurnResult r;
    v1::TurnEvent ev;
    while (reader->Read(&ev)) {
      if (ev.has_tokens()) {
        ++r.token_events;
        r.tokens.insert(r.tokens.end(), ev.tokens().token_ids().begin(),
                        ev.tokens().token_ids().end());
        r.text += ev.tokens().text();
      } else if (ev.has_done()) {
        r.has_done = true;
        r.done = ev.done();
      } else if (ev.has_history_needed()) {
        r.history_needed = ev.history_needed().history_length();
      }
    }
    r.status = reader->Finish();
    return r;
  }

  v1::LoadReport Load() {
    grpc::ClientContext ctx;
    v1::LoadReport load;
    EXPECT_TRUE(stub_->GetLoad(&ctx, v1::GetLoadRequest(), &load).ok());
    return load;
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(process_.port("grpc")); }
  v1::Worker::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  int metrics_port() const { return process_.port("metrics"); }
  int Stop() { return process_.Stop(); }
  void Kill() { process_.Kill(); }  // SIGKILL
  void Terminate() { kill(process_.pid(), SIGTERM); }  // a stop, not waited for

 private:
  ServerProcess process_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

inline v1::RunTurnRequest Turn(const std::string& session, const std::string& text, int max_tokens,
                        int history_length = 0) {
  v1::RunTurnRequest r;
  r.set_session_id(session);
  auto* m = r.add_messages();
  m->set_role("user");
  m->set_content(text);
  r.set_history_length(history_length);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

}  // namespace recall
