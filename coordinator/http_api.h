// HttpApi: the OpenAI-compatible HTTP API on the coordinator (cpp-httplib; HTTPS, and mTLS,
// with the coordinator's certificate when it has one).
//
//   POST /v1/chat/completions  a turn of a session, streamed as Server-Sent Events
//                              ("stream": true) or as one chat.completion body
//   POST /v1/completions       one turn of a throwaway session, as gRPC Generate
//   GET  /v1/models[/ID]       the models the workers serve
//   GET  /health               200 while a worker is healthy, else 503 (no API key needed)
// Bodies and errors: coordinator/openai/. API keys: "Authorization: Bearer KEY", the same
// keys and tenants as on gRPC (auth.h); 401 without a known key.
//
// Sessions. A request names its session with the X-Session-Id header or "session_id" in the
// body; the response carries the session's id in X-Session-Id. The client sends the whole
// conversation each time (the OpenAI way) and the coordinator matches it against the stored
// transcript (transcript_match.h): only the new messages go to the worker, which continues
// its cache; a list that diverges rebuilds the session in place (same id). A session that
// does not exist is 404. Without a session id, the request continues the session whose
// transcript (as recorded by this coordinator) the list extends, or else starts a new
// session (stored like any other, so the returned id can be named later). The turn itself is
// the gRPC path's: Conversations (store the new messages, build the spec, store the reply) and
// a TurnRunner (routing, history resend, failover, metrics).
//
// Retries. An Idempotency-Key header (a turn id, turn_ids.h: at most 128 bytes of A-Z a-z 0-9
// . _ : -) names the request's turn; it is stored on the turn's user message (the request's
// last message). A request whose key names a turn that completed
// gets that turn's stored reply (as a body or a stream, with "Idempotent-Replayed: true"),
// not a second run; one whose key's turn is running (this or another request) gets 409
// (retryable, as OpenAI's SDKs do); one whose key's turn was interrupted or failed resumes it
// (Conversations::Resume: the whole reply, its stored part first, the worker continuing from
// there), or, when the session went on after it, runs it again in the session (the list
// rewrites the tail); a key that names a turn with another message is 400. The key's session is
// found in the named session's transcript, or, for a request naming none, in the key records
// of the session store (IdempotencyKeys: kept a day, shared by the coordinators of a store and
// kept across restarts).
// /v1/completions keeps no session: a keyed completion's request is remembered in the key
// records too (IdempotencyKeys::Completion: its prompt's digest, its reply as far as it went
// and its seed), so a request sent again gets the completion replayed, or, when it broke off,
// resumed with the same draws (the part sent first); 409 while it runs; 400 for the key with
// another prompt. While it runs its record is in progress under a lease that its coordinator
// renews while the completion runs (completion_lease_ms): another coordinator answers 409, or,
// once the lease has passed (the coordinator died), resumes it with the same seed.
//
// Threads: cpp-httplib serves each connection on a thread of its own while it is open, up to
// `threads` at once (ConnectionThreads). A request's store steps run on that thread and it
// waits there for the runner's reports (HttpTurn), so a running HTTP turn holds a thread,
// unlike the gRPC edge's reactors.
// A streamed reply is written from that thread as the text arrives; a failed write (the
// client went away) cancels the runner, and with it the worker's turn. A non-streamed
// request whose client goes away runs to its end (cpp-httplib 0.11 reports a closed
// connection only on a write). The reply is stored before the client sees its end.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"
#include "coordinator/auth.h"
#include "coordinator/conversations.h"
#include "coordinator/http_turn.h"
#include "coordinator/idempotency_keys.h"
#include "coordinator/openai/request.h"
#include "coordinator/openai/response.h"
#include "coordinator/transcript_match.h"
#include "coordinator/worker_registry.h"

namespace httplib {
class Server;
class DataSink;
struct Request;
struct Response;
}  // namespace httplib

namespace recall::coordinator {

struct HttpOptions {
  std::string listen;             // HOST:PORT (port 0 picks one); REQUIRES: not empty
  int threads = 512;              // connections served at once (a thread each)
  std::string tls_cert, tls_key;  // PEM files: HTTPS when set
  std::string tls_client_ca;      // require client certificates signed by this CA (mTLS)
  size_t max_body_bytes = 64 << 20;
  size_t index_entries = 100000;  // transcripts remembered for requests naming no session
  // A keyed completion's record stays in progress this long without a renewal; its
  // coordinator renews it when half has passed, whether tokens arrive or not.
  int64_t completion_lease_ms = 120'000;
  // A stream silent this long after its first event gets an SSE comment (": keep-alive"),
  // which clients ignore: proxies keep the connection (nginx and load balancers close one
  // idle for 60 s by default), and a client that left is found by the failed write. A
  // stream is silent mid-reply while a failed-over turn rebuilds its transcript elsewhere, or
  // while its worker is preempted or queued.
  int64_t keepalive_ms = 15'000;
  // A stream whose first token has not come this long after the turn began (a long prefill,
  // a queue) begins without it (the role chunk) and gets a comment this often until it comes
  // (or keepalive_ms when that is shorter): cpp-httplib 0.11 tells a client that left only
  // by a failed write, so one that hung up while its prompt was read is noticed within
  // about twice this, and its turn cancelled, rather than at the first token.
  int64_t first_token_probe_ms = 1'000;
};

class HttpApi {
 public:
  // Listens and serves on its own thread. Unavailable when it cannot listen; InvalidArgument
  // naming the field for a bad address or unreadable TLS files. All references must outlive
  // the API.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(const HttpOptions& options,
                                                        Conversations& conversations,
                                                        WorkerRegistry& workers,
                                                        const ApiKeys& keys,
                                                        metrics::Registry& metrics);
  ~HttpApi();  // Shutdown
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  int port() const { return port_; }
  // Refuses new requests (503), cancels the running turns, and stops once their requests
  // have ended. Idempotent.
  void Shutdown();

 private:
  struct Reply;  // a turn from its start to its end, for one request

  HttpApi(const HttpOptions& options, Conversations& conversations, WorkerRegistry& workers,
          const ApiKeys& keys, metrics::Registry& metrics);

  void ChatCompletions(const httplib::Request& req, httplib::Response& res);
  void Completions(const httplib::Request& req, httplib::Response& res);
  void Models(const httplib::Request& req, httplib::Response& res);
  void Health(const httplib::Request& req, httplib::Response& res);

  // The caller's tenant (Authorization header); Unavailable once shutting down.
  absl::StatusOr<std::string> Admit(const httplib::Request& req);
  // The message size and max_tokens limits requests are checked against.
  openai::RequestLimits Limits() const;
  // Checks an Idempotency-Key's format and claims it for this request: 409 (FailedPrecondition)
  // while another request with it runs. The caller releases it.
  absl::Status ClaimKey(const std::string& tenant, const std::string& key);
  // A turn for a request naming no session: the session it continues, or a new one.
  absl::StatusOr<OpenTurn> BeginUnnamed(const std::string& tenant, const std::string& model,
                                        const std::vector<StoredMessage>& messages,
                                        const v1::SamplingParams& sampling);
  // What KeyedTurn found besides a turn to replay.
  struct KeyedState {
    std::string model;    // the session's
    bool resume = false;  // the key's turn did not complete and is the session's last
    bool rerun = false;   // it did not complete and the session went on after it
    bool gone = false;    // the session is not there (deleted)
  };
  // The completed turn `key` names in `tenant`'s session `session_id`, when there is one to
  // replay (nullopt: no such turn, or one that did not complete; `*state` says which).
  // FailedPrecondition while the turn runs; InvalidArgument when the key's message is not
  // `asked`; the store's errors.
  absl::StatusOr<std::optional<StoredMessage>> KeyedTurn(const std::string& tenant,
                                                         const std::string& session_id,
                                                         const std::string& key,
                                                         const StoredMessage& asked,
                                                         KeyedState* state);
  // Answers a request with a turn's stored reply (a body or a stream).
  void Replay(openai::Endpoint endpoint, const StoredMessage& reply, const std::string& model,
              bool include_usage, bool stream, httplib::Response& res);
  // Runs the reply's turn and answers the request (a JSON body, or a stream).
  void Respond(std::shared_ptr<Reply> reply, bool stream, httplib::Response& res);
  // Writes a stream's events until its end; false when the client went away.
  // A keyed completion's record in progress (Reply::running) is rewritten with a new lease of
  // completion_lease_ms when half of it has passed; called at least every quarter lease while
  // the turn runs (NextUpdate), so a silent turn (a long prefill, a queue) keeps it too.
  void RenewLease(Reply& reply, const std::string& tenant, const std::string& key);
  // The turn's next update, waiting at most a quarter lease or `wait_ms` (an empty update
  // then), with the lease renewed.
  HttpTurn::Update NextUpdate(Reply& reply, int64_t wait_ms);
  int64_t ProbeMs() const { return std::min(options_.first_token_probe_ms, options_.keepalive_ms); }
  bool Pump(Reply& reply, httplib::DataSink& sink);
  // Ends the reply's turn (cancelled first when `cancel`), stores it (a session's turn) and
  // returns what the client should learn: the turn's error, a store error, or OK. Once.
  absl::Status Conclude(Reply& reply, bool cancel);
  void Fail(httplib::Response& res, const absl::Status& status);

  const HttpOptions options_;
  Conversations& conversations_;
  WorkerRegistry& workers_;
  const ApiKeys& keys_;
  metrics::Registry& metrics_;
  TranscriptIndex index_;
  IdempotencyKeys idempotency_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;  // the server's accept loop
  int port_ = 0;
  int listen_fd_ = -1;  // the listening socket (the library's)

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::shared_ptr<HttpTurn>> running_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::coordinator
