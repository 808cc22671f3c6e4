// The C++ client SDK for the Recall coordinator (proto/recall/v1/chat.proto).
//
// The example is client/chat_example.cc (built with the project, and against an installed SDK
// by tests/packaging); its core, as written there:
//
//   recall::ClientOptions options;
//   auto client = recall::Client::Connect(options);
//   recall::v1::CreateSessionRequest create;
//   auto session = client->StartSession(create);
//   if (!session.ok()) { ... session.status() ... }
//   auto done =
//       (*session)->Send(line, [](const std::string& text) { std::cout << text << std::flush; });
//
// Idempotent calls (GetSession, ListSessions, ListModels, DeleteSession) are retried with
// exponential backoff on UNAVAILABLE, and on CANCELLED the client did not ask for (a server
// shutting down cancels its calls). So is Converse (and Session::Send): each turn carries a
// turn id, so a retry after a broken stream gets the turn the coordinator already has (its
// reply passed on from where the broken attempt stopped; ConverseDone.replayed and
// turn_state say how it ended; a turn the break interrupted is resumed, ConverseDone.resumed,
// and its reply is whole) instead of sending the message twice; the iterator form
// (ConverseStream, Session::Stream) alike. A turn refused because the workers are full
// (RESOURCE_EXHAUSTED "...; retry after N ms") is sent again after at least N ms, within the
// same retries. Every call has a deadline. Errors are absl::Status
// with the server's code and message.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "recall/v1/chat.grpc.pb.h"

namespace recall {

struct ClientOptions {
  std::string address = "127.0.0.1:50050";
  // Sent as "authorization: Bearer <key>": printable ASCII without spaces (CheckApiKey; every
  // call with another key returns its INVALID_ARGUMENT).
  std::string api_key;
  std::chrono::milliseconds deadline{600'000};  // per call
  // For idempotent calls and Converse on UNAVAILABLE or a CANCELLED the client did not ask
  // for (backoff 0.1 s, doubling: 6.3 s in all, a coordinator's restart). CreateSession is
  // one of them: it carries a request id (CreateSessionRequest.request_id, made when unset),
  // so a retry gets the session a lost reply's request made.
  int retries = 6;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // default: insecure (loopback)
};

// InvalidArgument naming --api-key unless `key` is printable ASCII without spaces (what an
// HTTP/2 header value may carry; gRPC aborts the process on others).
absl::Status CheckApiKey(const std::string& key);

// Called with each piece of reply text as it streams.
using TextCallback = std::function<void(const std::string& text)>;

class Session;

class Client;

// A call's retries (Client::NextTry): the window, from its first failure, and the next wait.
struct RetryState {
  std::optional<std::chrono::steady_clock::time_point> until;
  std::chrono::milliseconds backoff{100};
};

// A reply read piece by piece (the iterator form of Converse):
//   auto reply = session->Stream("Hi");
//   std::string text;
//   while (reply->Next(&text)) std::cout << text;
//   if (!reply->status().ok()) ...
// A stream that breaks (UNAVAILABLE) is asked again under the same turn id, up to the
// client's retries, and Next goes on with the text the broken attempt had not passed on.
class ReplyStream {
 public:
  // Made by Client::ConverseStream; `request` carries its turn id. Starts the call.
  ReplyStream(const Client& client, v1::ConverseRequest request);
  ~ReplyStream();  // cancels the turn if the reply was not read to its end
  ReplyStream(const ReplyStream&) = delete;
  ReplyStream& operator=(const ReplyStream&) = delete;

  // The next piece of text (tokens whose text is held back come with a later piece);
  // false at the end of the reply.
  bool Next(std::string* text);
  absl::Status status() const { return status_; }
  const v1::ConverseDone& done() const { return done_; }
  // Stops the reply (the server cancels the turn, keeping what was sent as interrupted); Next
  // then returns false and status() is CANCELLED. Callable from any thread, while another
  // thread is in Next. A reply that ended on the server before the cancel reached it is kept
  // whole (status() still says CANCELLED; the session's transcript has it complete).
  void Cancel();

 private:
  // A call of request_ (the next attempt); false once cancelled.
  bool Open();
  bool Cancelled();

  const Client& client_;
  const v1::ConverseRequest request_;
  std::mutex mu_;  // context_ and cancelled_: Cancel may come from another thread
  std::unique_ptr<grpc::ClientContext> context_;
  bool cancelled_ = false;
  std::unique_ptr<grpc::ClientReader<v1::ConverseEvent>> reader_;
  int attempt_ = 0;
  size_t delivered_ = 0;  // text bytes passed on by Next
  size_t seen_ = 0;       // text bytes of this attempt (a replay repeats the passed-on part)
  absl::Status status_;
  v1::ConverseDone done_;
  bool got_done_ = false;
  bool finished_ = false;
  RetryState retry_;  // since the last text passed on
};

class Client {
 public:
  static std::unique_ptr<Client> Connect(ClientOptions options);

  absl::StatusOr<v1::Session> CreateSession(const v1::CreateSessionRequest& request);
  absl::StatusOr<v1::Session> GetSession(const std::string& session_id);
  absl::StatusOr<v1::ListSessionsResponse> ListSessions(int page_size = 50,
                                                        const std::string& page_token = "");
  absl::Status DeleteSession(const std::string& session_id);
  absl::StatusOr<v1::ListModelsResponse> ListModels();

  // One turn: streams the reply's text to `on_text`; returns the final event. `turn_id`
  // (ConverseRequest.turn_id; a fresh random one when empty) names the turn for retries.
  absl::StatusOr<v1::ConverseDone> Converse(const std::string& session_id,
                                            const std::string& message,
                                            const v1::SamplingParams& sampling,
                                            const TextCallback& on_text,
                                            const std::string& turn_id = "");
  // A random turn id ("sdk-" and 32 hex digits).
  static std::string NewTurnId();
  absl::StatusOr<v1::ConverseDone> Generate(const v1::GenerateRequest& request,
                                            const TextCallback& on_text);
  // Converse as an iterator (retried the same way).
  std::unique_ptr<ReplyStream> ConverseStream(const std::string& session_id,
                                              const std::string& message,
                                              const v1::SamplingParams& sampling,
                                              const std::string& turn_id = "");

  // A new session wrapped for multi-turn use.
  absl::StatusOr<std::unique_ptr<Session>> StartSession(const v1::CreateSessionRequest& request);

 private:
  friend class ReplyStream;
  explicit Client(ClientOptions options);
  void Prepare(grpc::ClientContext* ctx) const;
  template <typename Call>
  grpc::Status WithRetries(Call call) const;
  // Waits before asking again: `backoff`, or, while the server is unreachable, until it is
  // reachable again (true) or `backoff` has passed (a restarted server is dialled at once).
  bool AwaitRetry(std::chrono::milliseconds backoff) const;
  // How long a call's retries last from its first failure: 0.1 s doubling, `retries` times.
  std::chrono::milliseconds RetryWindow() const;
  // After a failed attempt: false once the retries' window (0.1 s doubling, `retries` times:
  // 6.3 s for 6) has passed since the first failure, whatever the attempts took; else waits
  // for the next attempt (true). A server reachable again ends the wait, and the next wait
  // starts short again (one just back may not have its worker yet). `cancelled`, asked every
  // 50 ms, ends the wait too.
  bool NextTry(RetryState* retry, const std::function<bool()>& cancelled = nullptr) const;
  // InvalidArgument for options no call can be made with (an empty address, an api_key
  // CheckApiKey refuses), which every call returns at once.
  absl::Status Usable() const;
  // A call's status for its caller: an unreachable server's names the address and what should
  // run there.
  absl::Status Failure(const grpc::Status& s) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Chat::Stub> stub_;
};

// One conversation: Send keeps the sampling settings; History reads the stored transcript.
// One turn at a time: a second thread's Send while a turn runs waits for it through the
// client's retries (FAILED_PRECONDITION once they are spent).
class Session {
 public:
  Session(Client& client, v1::Session session) : client_(client), session_(std::move(session)) {}
  const std::string& id() const { return session_.session_id(); }
  v1::SamplingParams& sampling() { return sampling_; }

  absl::StatusOr<v1::ConverseDone> Send(const std::string& message, const TextCallback& on_text);
  std::unique_ptr<ReplyStream> Stream(const std::string& message);
  absl::StatusOr<std::vector<v1::ChatMessage>> History();
  // Deletes the session on the server.
  absl::Status Close();

 private:
  Client& client_;
  v1::Session session_;
  v1::SamplingParams sampling_;
};

}  // namespace recall
