#include "coordinator/http_api.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/listen_socket.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/utf8.h"
#include "coordinator/connection_threads.h"
#include "coordinator/http_turn.h"
#include "coordinator/openai/request.h"
#include "coordinator/openai/response.h"
#include "coordinator/turn_ids.h"

namespace recall::coordinator {
namespace {

constexpr char kSessionHeader[] = "X-Session-Id";
constexpr char kKeyHeader[] = "Idempotency-Key";
constexpr size_t kMaxSessionIdBytes = 128;

std::vector<StoredMessage> ToStored(const std::vector<openai::Message>& messages) {
  std::vector<StoredMessage> out;
  out.reserve(messages.size());
  for (const openai::Message& m : messages) out.push_back({m.role, m.content});
  return out;
}

// The session a request names: the header or the body's "session_id" ("" for none).
absl::StatusOr<std::string> NamedSession(const httplib::Request& req, const std::string& body) {
  const std::string header = req.get_header_value(kSessionHeader);
  if (!header.empty() && !body.empty() && header != body) {
    return absl::InvalidArgumentError(
        "session_id: the X-Session-Id header and the body's session_id name different sessions");
  }
  const std::string& id = header.empty() ? body : header;
  if (id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_id: ", id.size(), " bytes; at most ", kMaxSessionIdBytes));
  }
  if (!utf8::IsValid(id)) return absl::InvalidArgumentError("session_id: is not valid UTF-8");
  return id;
}

// InvalidArgument naming `model` when a request asks for another model than its session's.
absl::Status CheckSessionModel(const std::string& session_model, const std::string& asked) {
  if (asked.empty() || session_model.empty() || session_model == asked) return absl::OkStatus();
  return flags::FieldError(
      "model", absl::StrCat("the session was made for \"", session_model, "\", not \"", asked,
                            "\" (a session keeps its model; not retryable)"));
}

// The method a route takes ("" for a path that is no route): a request with another method is
// 405, not 404.
std::string AllowedMethod(const std::string& path) {
  if (path == "/v1/chat/completions" || path == "/v1/completions") return "POST";
  if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/") || path == "/health") {
    return "GET";
  }
  return "";
}

// The request's Idempotency-Key ("" when none); InvalidArgument when sent more than once.
absl::StatusOr<std::string> KeyOf(const httplib::Request& req) {
  if (const size_t n = req.get_header_value_count(kKeyHeader); n > 1) {
    return flags::FieldError(kKeyHeader, absl::StrCat("sent ", n, " times; send one key"));
  }
  return req.get_header_value(kKeyHeader);
}

// A request no route takes: 405 naming the method to use when its path is a route of another
// method, else 404 (res.status set, the error's body left to HttpApi::Fail).
absl::Status NoRoute(const httplib::Request& req, httplib::Response& res) {
  const std::string allowed = AllowedMethod(req.path);
  if (!allowed.empty() && req.method != allowed && !(allowed == "GET" && req.method == "HEAD")) {
    res.status = 405;
    res.set_header("Allow", allowed);
    return absl::InvalidArgumentError(
        absl::StrCat(req.method, " ", req.path, ": method not allowed; use ", allowed));
  }
  res.status = 404;
  return absl::NotFoundError(absl::StrCat("no route ", req.method, " ", req.path));
}

}  // namespace

// One request's turn, from its start to its end. Touched by the request's thread only (the
// handler, then the stream's content provider and its releaser, one after the other).
struct HttpApi::Reply {
  Reply(openai::Endpoint endpoint, std::string model, bool include_usage)
      : writer(endpoint, std::move(model), include_usage) {}

  openai::ResponseWriter writer;
  TurnSpec spec;                        // until the turn starts
  std::optional<OpenTurn> open;         // a session's turn (chat); none for a completion
  std::vector<StoredMessage> messages;  // chat: the request's list, for the index
  std::shared_ptr<HttpTurn> turn;
  std::string first_text;  // a stream's text that arrived before its headers went out
  std::vector<v1::TokenLogprob> first_logprobs;  // likewise, its tokens' logprobs
  bool logprobs = false;                         // the request asked for them
  int64_t text_offset = 0;  // a stream's bytes of text sent (completions' logprob offsets)
  std::string tenant, key;  // an Idempotency-Key this request holds the claim on, until the end
  std::string resumed;      // a resumed turn's stored part, sent before the rest
  // A completion with a key: its prompt and the seed it samples with, kept with its reply;
  // the record other coordinators see while it runs, and until when its lease holds.
  std::string prompt, model;
  uint64_t seed = 0;
  std::optional<IdempotencyKeys::Completion> running;
  bool concluded = false;
  absl::Status concluded_status;
  bool session_deleted = false;  // a refused turn's new session (OpenTurn::new_session)
};

HttpApi::HttpApi(const HttpOptions& options, Conversations& conversations, WorkerRegistry& workers,
                 const ApiKeys& keys, metrics::Registry& metrics)
    : options_(options),
      conversations_(conversations),
      workers_(workers),
      keys_(keys),
      metrics_(metrics),
      index_(options.index_entries, &conversations.store()),
      idempotency_(options.index_entries, &conversations.store()) {}

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(const HttpOptions& options,
                                                        Conversations& conversations,
                                                        WorkerRegistry& workers,
                                                        const ApiKeys& keys,
                                                        metrics::Registry& metrics) {
  RECALL_ASSIGN_OR_RETURN(const auto host_port,
                          flags::SplitHostPort("http_listen", options.listen));
  std::unique_ptr<HttpApi> api(new HttpApi(options, conversations, workers, keys, metrics));
  if (!options.tls_cert.empty()) {
    auto server = std::make_unique<httplib::SSLServer>(
        options.tls_cert.c_str(), options.tls_key.c_str(),
        options.tls_client_ca.empty() ? nullptr : options.tls_client_ca.c_str());
    if (!server->is_valid()) {
      return flags::FieldError(
          "tls_cert",
          absl::StrCat(
              "cannot load ", options.tls_cert, " and ", options.tls_key,
              options.tls_client_ca.empty() ? "" : absl::StrCat(" and ", options.tls_client_ca),
              " for HTTPS"));
    }
    api->server_ = std::move(server);
  } else {
    api->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& s = *api->server_;
  const int threads = options.threads;
  s.new_task_queue = [threads] { return new ConnectionThreads(threads); };
  s.set_payload_max_length(options.max_body_bytes);
  s.set_keep_alive_max_count(1000);
  // A connection holds its thread while open, idle ones too: idle ones go after 2 s (the
  // library's default, 5 s, let a client's idle pool hold every thread that long).
  s.set_keep_alive_timeout(2);
  s.set_write_timeout(30, 0);  // a client that reads nothing for 30 s loses its stream
  // The library's default also sets SO_REUSEPORT, which let a second coordinator listen on a
  // port in use and take half its requests: SO_REUSEADDR only (a restart may rebind a port
  // whose old connections are in TIME_WAIT), so a taken port is refused.
  // (Called for the listening socket only: its descriptor is kept for the backlog below.)
  s.set_socket_options([self = api.get()](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    self->listen_fd_ = sock;
  });
  HttpApi* self = api.get();
  // The POST routes read their bodies themselves, after the caller's key: a client without
  // one made the server read and hold a body of up to the 64 MiB limit per connection before
  // its 401 (six such took the coordinator from 24 to 394 MB). Its body is read and dropped
  // as it comes (the connection stays in step for its next request), and a client that asks
  // first (Expect: 100-continue, as curl does past 1 MB) hears the 401 without sending it.
  // The library holds a body with a Content-Length to the limit (413 past it, the rest read
  // and dropped), not a chunked one (Transfer-Encoding: chunked): that is counted here (a 400
  // MiB one took the coordinator from 240 to 1886 MB), and past the limit its rest is read and
  // dropped as well, then 413, so the connection stays in step (cpp-httplib 0.11 closes a
  // connection on the request's word only: a body left unread was read as ~800 requests, each
  // answered 400). Past kDropBytes more the read stops (the connection then ends at the first
  // line that is no request).
  using Handle = void (HttpApi::*)(const httplib::Request&, httplib::Response&);
  const auto keyed = [self, max = options.max_body_bytes](Handle handle) {
    return [self, handle, max](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& read) {
      constexpr size_t kDropBytes = size_t{1} << 30;
      size_t bytes = 0;
      const auto too_large = [&]() {
        self->Fail(res, absl::InvalidArgumentError(
                            absl::StrCat("the request body is larger than ", max, " bytes")));
        res.status = 413;
      };
      // Every byte counted; none kept past `max`, none read past `max` + kDropBytes.
      std::string body;
      const absl::StatusOr<std::string> tenant = self->Admit(req);
      const bool whole = read([&](const char* data, size_t n) {
        bytes += n;
        if (tenant.ok() && bytes <= max) body.append(data, n);
        return bytes <= max + kDropBytes;
      });
      if (!tenant.ok()) {
        if (whole) self->Fail(res, tenant.status());
        return;  // (a body cut short: the library's 400)
      }
      if (bytes > max) {
        too_large();
        return;
      }
      if (!whole) return;  // a body cut short: the library's 400
      httplib::Request with_body = req;
      with_body.body = std::move(body);
      (self->*handle)(with_body, res);
    };
  };
  s.Post("/v1/chat/completions", keyed(&HttpApi::ChatCompletions));
  s.Post("/v1/completions", keyed(&HttpApi::Completions));
  s.set_expect_100_continue_handler([self](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "POST" && AllowedMethod(req.path) == "POST") {
      if (const absl::StatusOr<std::string> tenant = self->Admit(req); !tenant.ok()) {
        self->Fail(res, tenant.status());
        return res.status;
      }
    }
    return 100;
  });
  s.Get("/v1/models",
        [self](const httplib::Request& req, httplib::Response& res) { self->Models(req, res); });
  s.Get("/v1/models/(.+)",
        [self](const httplib::Request& req, httplib::Response& res) { self->Models(req, res); });
  s.Get("/health",
        [self](const httplib::Request& req, httplib::Response& res) { self->Health(req, res); });
  // A POST that says nothing of a body (curl -X POST URL): cpp-httplib would read until the
  // connection's read timeout (5 s) and answer "cannot be read". Told at once, with
  // "Connection: close" asked of the client (cpp-httplib 0.11 does not close on its own word:
  // what follows on the connection is read as the next request).
  s.set_pre_routing_handler([self](const httplib::Request& req, httplib::Response& res) {
    // (PUT and PATCH too: cpp-httplib reads their bodies the same way.)
    const bool with_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
    // A Content-Length that is not a count (-5) read as a huge one: 413, "larger than".
    if (const std::string length = req.get_header_value("Content-Length");
        req.has_header("Content-Length") &&
        (length.empty() || length.size() > 19 ||
         length.find_first_not_of("0123456789") != std::string::npos)) {
      self->Fail(res, flags::FieldError("Content-Length",
                                        absl::StrCat("\"", length.substr(0, 40),
                                                     "\" is not a byte count (decimal digits)")));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!with_body || req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (req.method != "POST" || AllowedMethod(req.path) != "POST") {  // no route: as with a body
      const absl::Status st = NoRoute(req, res);
      const int status = res.status;
      self->Fail(res, st);
      res.status = status;
    } else {
      self->Fail(res,
                 absl::InvalidArgumentError("the request has no body (neither Content-Length nor "
                                            "Transfer-Encoding); send a JSON object with "
                                            "Content-Type: application/json"));
    }
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors the library answers itself (no route, a body too large, an unreadable request)
  // get OpenAI's error body too; the handlers' own errors already have one.
  s.set_error_handler(
      [self, max = options.max_body_bytes](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        absl::Status st;
        if (res.status == 404) {
          st = NoRoute(req, res);
        } else if (res.status == 413) {
          st = absl::InvalidArgumentError(
              absl::StrCat("the request body is larger than ", max, " bytes"));
        } else {
          st = absl::InvalidArgumentError(
              absl::StrCat("the request cannot be read (HTTP ", res.status, ")"));
        }
        const int status = res.status;
        self->Fail(res, st);
        res.status = status;
      });
  s.set_exception_handler(
      [self](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
        std::string what = "unknown";
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        RECALL_LOG(ERROR) << "HTTP handler failed: " << what;
        self->Fail(res, absl::InternalError(absl::StrCat("internal error: ", what)));
      });
  s.set_logger([self](const httplib::Request& req, const httplib::Response& res) {
    std::string path = "other";
    for (const char* known : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"}) {
      if (req.path.rfind(known, 0) == 0) path = known;
    }
    self->metrics_
        .GetCounter("recall_coordinator_http_requests_total",
                    "HTTP API requests by path and status",
                    absl::StrCat("path=\"", path, "\",code=\"", res.status, "\""))
        ->Increment();
  });
  const auto& [host, port] = host_port;
  if (port == 0) {
    api->port_ = s.bind_to_any_port(host);
  } else {
    api->port_ = s.bind_to_port(host, port) ? port : -1;
  }
  if (api->port_ <= 0) {
    const std::string reason = ReasonCannotListen(options.listen);
    return flags::FieldError(
        "http_listen",
        absl::StrCat("cannot listen on ", options.listen,
                     reason.empty() ? " (is the port free? is the host an address of this machine?)"
                                    : absl::StrCat(": ", reason)),
        absl::StatusCode::kUnavailable);
  }
  // The library listens with a backlog of 5: a burst of new connections overflowed it and
  // waited a second each for their SYN to be sent again (found by probing). Listening again
  // sets the backlog.
  if (api->listen_fd_ >= 0) ::listen(api->listen_fd_, SOMAXCONN);
  api->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  // Server::stop does nothing before the loop runs (cpp-httplib 0.11 has no wait_until_ready):
  // wait for it, or a Shutdown right after Start would wait on the loop forever.
  for (int i = 0; i < 5000 && !s.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!s.is_running()) {
    return flags::FieldError("http_listen", absl::StrCat("cannot serve on ", options.listen),
                             absl::StatusCode::kUnavailable);
  }
  return api;
}

HttpApi::~HttpApi() { Shutdown(); }

void HttpApi::Shutdown() {
  std::set<std::shared_ptr<HttpTurn>> running;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    running = running_;
  }
  for (const std::shared_ptr<HttpTurn>& t : running) t->Cancel();
  if (server_ != nullptr) server_->stop();  // returns at once; the loop ends its requests
  if (thread_.joinable()) thread_.join();
}

void HttpApi::Fail(httplib::Response& res, const absl::Status& status) {
  const openai::HttpError e = openai::ErrorResponse(status);
  res.status = e.status;
  res.set_content(e.body, "application/json");
  if (e.should_retry.has_value())
    res.set_header("x-should-retry", *e.should_retry ? "true" : "false");
  if (e.retry_after_ms >= 0) {
    res.set_header("retry-after-ms", absl::StrCat(e.retry_after_ms));
    res.set_header("Retry-After", absl::StrCat((e.retry_after_ms + 999) / 1000));
  }
}

absl::StatusOr<std::string> HttpApi::Admit(const httplib::Request& req) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the coordinator is shutting down; retryable");
  }
  std::optional<std::string> authorization;
  RECALL_RETURN_IF_ERROR(keys_.CheckOneKey(req.get_header_value_count("Authorization")));
  if (req.has_header("Authorization")) authorization = req.get_header_value("Authorization");
  return keys_.AuthenticateBearer(authorization);
}

openai::RequestLimits HttpApi::Limits() const {
  openai::RequestLimits limits;
  limits.max_message_bytes = conversations_.options().max_message_bytes;
  // What some model's workers take: a request's model's own limit is checked once it is
  // known (Conversations::CheckMaxTokens).
  limits.max_tokens = conversations_.LargestModelMaxTokens();
  return limits;
}

absl::Status HttpApi::ClaimKey(const std::string& tenant, const std::string& key) {
  RECALL_RETURN_IF_ERROR(CheckTurnId(kKeyHeader, key));
  if (!idempotency_.Claim(tenant, key)) {
    return absl::FailedPreconditionError(
        absl::StrCat(kKeyHeader, " \"", key,
                     "\": a request with this key is running; send it again once it has "
                     "ended (retryable)"));
  }
  return absl::OkStatus();
}

void HttpApi::ChatCompletions(const httplib::Request& req, httplib::Response& res) {
  std::string tenant, key;  // a claimed key, released here unless a reply took it over
  absl::Status status = [&]() -> absl::Status {
    RECALL_ASSIGN_OR_RETURN(tenant, Admit(req));
    RECALL_ASSIGN_OR_RETURN(openai::ChatRequest chat, openai::ParseChatRequest(req.body, Limits()));
    RECALL_ASSIGN_OR_RETURN(const std::string named, NamedSession(req, chat.session_id));
    RECALL_ASSIGN_OR_RETURN(const std::string asked_key, KeyOf(req));
    // A named session has its model, and so has a key's (a request naming another is refused
    // when the session is read; one no worker serves now is the turn's 503/404); a request
    // naming none elsewhere needs one when the workers serve several.
    if (named.empty() && (asked_key.empty() || idempotency_.Find(tenant, asked_key).empty())) {
      RECALL_RETURN_IF_ERROR(conversations_.CheckModel(chat.model));
    }
    std::vector<StoredMessage> messages = ToStored(chat.messages);
    std::optional<OpenTurn> resumed_turn;
    std::string session = named;
    bool new_key = false;  // a key no session was known for, naming no session
    if (!asked_key.empty()) {
      RECALL_RETURN_IF_ERROR(ClaimKey(tenant, asked_key));
      messages.back().turn_id = asked_key;  // the user's (ParseChatRequest checks it)
      key = asked_key;
      std::string known = named.empty() ? idempotency_.Find(tenant, key) : named;
      KeyedState keyed;
      std::optional<StoredMessage> done;
      if (!known.empty()) {
        RECALL_ASSIGN_OR_RETURN(done, KeyedTurn(tenant, known, key, messages.back(), &keyed));
      }
      if (keyed.gone && named.empty()) {
        // The key's session was deleted since: the key is free again, claimed anew below
        // unless a request with it ran on another coordinator since.
        idempotency_.Forget(tenant, key, known);
        known = idempotency_.Find(tenant, key);
        if (known.empty()) RECALL_RETURN_IF_ERROR(conversations_.CheckModel(chat.model));
        keyed = KeyedState();
        if (!known.empty()) {
          RECALL_ASSIGN_OR_RETURN(done, KeyedTurn(tenant, known, key, messages.back(), &keyed));
        }
      }
      new_key = known.empty();
      if (!known.empty()) {
        // The key's turn ran for its session's model: not replayed nor resumed for another.
        RECALL_RETURN_IF_ERROR(CheckSessionModel(keyed.model, chat.model));
        if (done.has_value()) {
          res.set_header(kSessionHeader, known);
          Replay(openai::Endpoint::kChat, *done, keyed.model.empty() ? chat.model : keyed.model,
                 chat.include_usage, chat.stream, res);
          return absl::OkStatus();
        }
        // The key's turn did not complete: resumed where it stopped when it is the session's
        // last, else run again in its session (the list rewrites the tail).
        if (keyed.resume) {
          RECALL_ASSIGN_OR_RETURN(resumed_turn, conversations_.Resume(tenant, known, kKeyHeader,
                                                                      key, chat.sampling, "http"));
        } else if (keyed.rerun) {
          session = known;
        }
      }
    }
    std::optional<OpenTurn> open = std::move(resumed_turn);
    if (open.has_value()) {
      // resumed: nothing to begin
    } else if (session.empty()) {
      // Checked here too: BeginUnnamed would take a refusal for "not this session" and make one.
      RECALL_RETURN_IF_ERROR(conversations_.CheckMaxTokens(chat.model, chat.sampling));
      RECALL_ASSIGN_OR_RETURN(open, BeginUnnamed(tenant, chat.model, messages, chat.sampling));
    } else {
      RECALL_ASSIGN_OR_RETURN(
          open,
          conversations_.Begin(
              tenant, session,
              [&messages, &key, &chat](const SessionRecord& rec) -> absl::StatusOr<TurnMessages> {
                RECALL_RETURN_IF_ERROR(CheckSessionModel(rec.model, chat.model));
                if (const int i = key.empty() ? -1 : FindTurn(rec, key); i >= 0) {
                  const TurnState state = TurnReply(rec, i).state;
                  if (state == TurnState::kComplete || state == TurnState::kInProgress) {
                    // Stored between the look above and the running mark (another
                    // coordinator): that request ran it.
                    return absl::FailedPreconditionError(absl::StrCat(
                        kKeyHeader, " \"", key,
                        "\": a request with this key ran the turn meanwhile; send it again to "
                        "get that turn (retryable)"));
                  }
                }
                return MatchTranscript(rec.messages, messages);
              },
              chat.sampling, "http"));
    }
    if (new_key) {
      // Added, not put: the same key sent to two coordinators at once began a turn on each
      // (two sessions). The one that comes second takes its turn back.
      if (absl::Status st = idempotency_.Add(tenant, key, open->session_id); !st.ok()) {
        const absl::Status refused =
            absl::IsAlreadyExists(st)
                ? absl::FailedPreconditionError(absl::StrCat(
                      kKeyHeader, " \"", key,
                      "\": a request with this key is running on another coordinator; send it "
                      "again once it has ended (retryable)"))
                : st;
        conversations_.Finish(*open, refused, StoredMessage()).IgnoreError();
        return refused;
      }
    } else if (!key.empty()) {
      idempotency_.Put(tenant, key, open->session_id);
    }
    res.set_header(kSessionHeader, open->session_id);
    // The model that serves the session (the request's name when the session has none).
    auto reply =
        std::make_shared<Reply>(openai::Endpoint::kChat,
                                open->model.empty() ? chat.model : open->model, chat.include_usage);
    reply->spec = open->spec;
    reply->open = std::move(open);
    reply->messages = std::move(messages);
    if (reply->open->resumed.has_value()) reply->resumed = reply->open->resumed->content;
    reply->tenant = tenant;
    reply->key = std::move(key);  // released when the reply concludes
    key.clear();
    Respond(std::move(reply), chat.stream, res);
    return absl::OkStatus();
  }();
  if (!key.empty()) idempotency_.Release(tenant, key);
  if (!status.ok()) Fail(res, status);
}

absl::StatusOr<std::optional<StoredMessage>> HttpApi::KeyedTurn(const std::string& tenant,
                                                                const std::string& session_id,
                                                                const std::string& key,
                                                                const StoredMessage& asked,
                                                                KeyedState* state) {
  *state = KeyedState();
  absl::StatusOr<SessionRecord> rec = conversations_.Load(tenant, session_id);
  if (absl::IsNotFound(rec.status())) {  // Begin says so (or a new session)
    state->gone = true;
    return std::nullopt;
  }
  RECALL_RETURN_IF_ERROR(rec.status());
  state->model = rec->model;
  const int i = FindTurn(*rec, key);
  if (i < 0) return std::nullopt;
  if (rec->messages[static_cast<size_t>(i - rec->first_message)].content != asked.content) {
    return flags::FieldError(
        kKeyHeader, absl::StrCat("\"", key, "\" names message ", i, " of session ", session_id,
                                 ", whose text differs from this request's last message; a new "
                                 "turn needs a new key"));
  }
  StoredMessage reply = TurnReply(*rec, i);
  // This coordinator's own, whose end the store could not take: interrupted, resumed below.
  if (conversations_.OwnOrphan(tenant + "/" + session_id, reply)) {
    reply.state = TurnState::kInterrupted;
  }
  switch (reply.state) {
    case TurnState::kComplete:
      return reply;
    case TurnState::kInProgress:
      return absl::FailedPreconditionError(
          absl::StrCat(kKeyHeader, " \"", key,
                       "\": that turn is still running; send this again once it has ended "
                       "(retryable)"));
    default:  // interrupted or failed: resumed when it is the last turn, else run again
      (i + 2 == rec->message_count ? state->resume : state->rerun) = true;
      return std::nullopt;
  }
}

void HttpApi::Replay(openai::Endpoint endpoint, const StoredMessage& reply,
                     const std::string& model, bool include_usage, bool stream,
                     httplib::Response& res) {
  const openai::ResponseWriter writer(endpoint, model, include_usage);
  v1::Usage usage;  // what the reply holds; the prompt's tokens are not stored
  usage.set_generated_tokens(static_cast<int32_t>(reply.token_ids.size()));
  const auto finish = static_cast<v1::FinishReason>(reply.finish);
  res.set_header("Idempotent-Replayed", "true");
  if (!stream) {
    res.set_content(writer.Body(reply.content, finish, usage), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_content(writer.First() + writer.Delta(reply.content) + writer.Last(finish, usage),
                  "text/event-stream");
}

absl::StatusOr<OpenTurn> HttpApi::BeginUnnamed(const std::string& tenant, const std::string& model,
                                               const std::vector<StoredMessage>& messages,
                                               const v1::SamplingParams& sampling) {
  // Stopping: refused here, not by each candidate's Begin, which fell through to a new
  // session made and deleted again.
  RECALL_RETURN_IF_ERROR(conversations_.TakingTurns());
  // A tenant at its running-turns limit: refused before a session is looked for or made.
  RECALL_RETURN_IF_ERROR(conversations_.CheckRunningTurns(tenant));
  const auto candidates = index_.Find(tenant, messages);
  bool waited = false;  // for a running candidate, once per request
  for (const auto& [length, id] : candidates) {
    const auto begin = [&, length = length, id = id]() {
      return conversations_.Begin(
          tenant, id,
          [&messages, &model, length](const SessionRecord& rec) -> absl::StatusOr<TurnMessages> {
            if (!model.empty() && !rec.model.empty() && rec.model != model) {
              return absl::AbortedError("another model's session: not this conversation");
            }
            TurnMessages m = MatchTranscript(rec.messages, messages);
            // Past the list, the session may hold only the turn its client stopped, which sends
            // its list again (or with the part of the reply it got, and a new message). That
            // turn is dropped, as a named session's diverging tail is; the worker's cache, which
            // an aborted turn leaves as it was, goes on.
            if (m.keep != rec.message_count &&
                (rec.first_message != 0 || m.keep < length ||
                 !OnlyStoppedTurnsOfTheListFrom(rec.messages, messages, m.keep))) {
              return absl::AbortedError("the session went on: not this conversation");
            }
            return m;
          },
          sampling, "http");
    };
    absl::StatusOr<OpenTurn> open = begin();
    // Running: most likely the turn this client just stopped and sends again (regenerate),
    // which this coordinator ends once it sees the hang-up at its next write. Waited for
    // (briefly: a second client sending the same list at once gets a new session after it).
    if (!waited && absl::IsFailedPrecondition(open.status()) &&
        absl::StrContains(open.status().message(), "a turn of this session is running")) {
      waited = true;
      if (conversations_.AwaitNotRunning(tenant + "/" + id, absl::Seconds(2))) open = begin();
    }
    // The tenant at its running-turns limit: so is every candidate's turn and a new session's.
    if (absl::IsResourceExhausted(open.status())) return open.status();
    // Running, deleted or gone on since it was recorded: the next candidate, or a new session.
    if (open.ok()) return open;
  }
  // A new session; its replies as the session it was found in holds them (a candidate that
  // is running or went on), so it replays them exactly (WithReplyTokens).
  std::vector<StoredMessage> fresh = messages;
  for (const auto& [length, id] : candidates) {
    if (absl::StatusOr<SessionRecord> rec = conversations_.store().Get(tenant, id); rec.ok()) {
      fresh = WithReplyTokens(std::move(fresh), rec->messages);
      break;
    }
  }
  // Past the turn limit: said so, not "the tenant has too many sessions" for the new one.
  RECALL_RETURN_IF_ERROR(conversations_.CheckTurnCount(0, fresh));
  RECALL_RETURN_IF_ERROR(conversations_.CheckWorkerKnown());
  RECALL_RETURN_IF_ERROR(conversations_.TakingTurns());  // (a stop since the check above)
  RECALL_ASSIGN_OR_RETURN(const SessionRecord created,
                          conversations_.Create(tenant, model, v1::CacheSettings(), {}, ""));
  absl::StatusOr<OpenTurn> open = conversations_.Begin(
      tenant, created.id,
      [&fresh](const SessionRecord&) -> absl::StatusOr<TurnMessages> {
        return TurnMessages{0, fresh};
      },
      sampling, "http");
  if (!open.ok()) {
    // Refused (too long a conversation, ...): no empty session is left behind.
    conversations_.store().Delete(tenant, created.id).IgnoreError();
    return open.status();
  }
  open->new_session = true;
  return open;
}

void HttpApi::Completions(const httplib::Request& req, httplib::Response& res) {
  std::string tenant, key;  // a claimed key, released here unless a reply took it over
  absl::Status status = [&]() -> absl::Status {
    RECALL_ASSIGN_OR_RETURN(tenant, Admit(req));
    RECALL_ASSIGN_OR_RETURN(openai::CompletionRequest completion,
                            openai::ParseCompletionRequest(req.body, Limits()));
    RECALL_RETURN_IF_ERROR(conversations_.CheckModel(completion.model));
    std::string model = completion.model;
    if (model.empty()) {
      const std::vector<v1::ModelInfo> served = conversations_.Models();
      if (served.size() == 1) model = served[0].name();
    }
    // A key: the completion it gave is replayed, one that broke off is resumed (the part
    // sent, then the rest with the same draws), a running one is waited for (409).
    std::optional<IdempotencyKeys::Completion> kept;
    std::string kept_record;  // its stored bytes ("" from memory)
    RECALL_ASSIGN_OR_RETURN(const std::string asked_key, KeyOf(req));
    if (!asked_key.empty()) {
      RECALL_RETURN_IF_ERROR(ClaimKey(tenant, asked_key));
      key = asked_key;
      kept = idempotency_.FindCompletion(tenant, key, &kept_record);
      if (kept.has_value() && kept->prompt_digest != IdempotencyKeys::Digest(completion.prompt)) {
        return flags::FieldError(kKeyHeader,
                                 absl::StrCat("\"", key, "\" was sent with another prompt"));
      }
      if (kept.has_value() && !completion.model.empty() && !kept->model.empty() &&
          kept->model != model) {
        return flags::FieldError(
            kKeyHeader, absl::StrCat("\"", key, "\" was sent for model \"", kept->model,
                                     "\", not \"", model, "\"; a new request needs a new key"));
      }
      if (kept.has_value() && kept->reply.state == TurnState::kComplete) {
        Replay(openai::Endpoint::kCompletion, kept->reply, kept->model, completion.include_usage,
               completion.stream, res);
        return absl::OkStatus();
      }
      if (kept.has_value() && kept->reply.state == TurnState::kInProgress) {
        if (kept->reply.lease_unix_ms > UnixMillis()) {
          return absl::FailedPreconditionError(absl::StrCat(
              kKeyHeader, " \"", key,
              "\": a request with this key is running on another coordinator; send it again "
              "once it has ended (retryable)"));
        }
        kept->reply.state = TurnState::kInterrupted;  // its coordinator is gone: resumed
      }
    }
    v1::SamplingParams sampling = completion.sampling;
    if (kept.has_value() && !sampling.has_seed() && kept->reply.seed.has_value()) {
      sampling.set_seed(*kept->reply.seed);
    }
    auto reply =
        std::make_shared<Reply>(openai::Endpoint::kCompletion, model, completion.include_usage);
    RECALL_RETURN_IF_ERROR(conversations_.TakingTurns());
    RECALL_RETURN_IF_ERROR(conversations_.CheckMaxTokens(model, sampling));
    reply->spec =
        conversations_.OneOff(tenant, model, completion.prompt, sampling, v1::CacheSettings());
    if (kept.has_value()) {
      reply->spec.resume_tokens = kept->reply.token_ids;
      reply->spec.resume_text = kept->reply.content;
      reply->resumed = kept->reply.content;
    }
    reply->prompt = completion.prompt;
    reply->model = model;
    reply->seed = reply->spec.request.sampling().seed();
    reply->tenant = tenant;
    if (!key.empty()) {
      // Seen by the other coordinators while it runs: they answer 409, or, once its lease
      // has passed (this coordinator died), resume it with the same seed.
      reply->running = IdempotencyKeys::Completion{
          IdempotencyKeys::Digest(completion.prompt), model,
          kept.has_value() ? kept->reply : StoredMessage{"assistant", ""}};
      reply->running->reply.state = TurnState::kInProgress;
      reply->running->reply.seed = reply->seed;
      if (kept.has_value() && kept_record.empty()) {
        RenewLease(*reply, tenant, key);  // memory's copy (the store did not answer)
      } else {
        // Added, not put (in place of the record read, for one resumed): the same key sent to
        // two coordinators at once ran on each.
        reply->running->reply.lease_unix_ms = UnixMillis() + options_.completion_lease_ms;
        const absl::Status added =
            idempotency_.AddCompletion(tenant, key, *reply->running, kept_record);
        if (!added.ok() && !absl::IsAlreadyExists(added)) return added;
        if (absl::IsAlreadyExists(added)) {
          return absl::FailedPreconditionError(absl::StrCat(
              kKeyHeader, " \"", key,
              "\": a request with this key is running on another coordinator; send it again "
              "once it has ended (retryable)"));
        }
      }
    }
    reply->key = std::move(key);  // released when the reply concludes
    key.clear();
    Respond(std::move(reply), completion.stream, res);
    return absl::OkStatus();
  }();
  if (!key.empty()) idempotency_.Release(tenant, key);
  if (!status.ok()) Fail(res, status);
}

void HttpApi::RenewLease(Reply& reply, const std::string& tenant, const std::string& key) {
  if (!reply.running.has_value()) return;
  const int64_t now = UnixMillis();
  if (reply.running->reply.lease_unix_ms - now > options_.completion_lease_ms / 2) return;
  reply.running->reply.lease_unix_ms = now + options_.completion_lease_ms;
  idempotency_.PutCompletion(tenant, key, *reply.running);
}

HttpTurn::Update HttpApi::NextUpdate(Reply& reply, int64_t wait_ms) {
  HttpTurn::Update u =
      reply.turn->Next(absl::Milliseconds(std::min(options_.completion_lease_ms / 4, wait_ms)));
  RenewLease(reply, reply.tenant, reply.key);
  return u;
}

void HttpApi::Respond(std::shared_ptr<Reply> reply, bool stream, httplib::Response& res) {
  std::function<std::unique_ptr<TurnJournal>(TurnSink*)> journal;
  reply->logprobs = reply->spec.request.sampling().logprobs();
  if (reply->open.has_value()) {
    journal = [this, &reply](TurnSink* edge) { return conversations_.Journal(*reply->open, edge); };
  }
  reply->turn = HttpTurn::Start(workers_, metrics_, conversations_.RunnerOptions(),
                                std::move(reply->spec), journal);
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    running_.insert(reply->turn);
  }
  if (stopping) reply->turn->Cancel();
  // Wait for the first text or the end: a turn that fails before any text gets its HTTP
  // status (a stream's status line goes out with its first event). A stream waits no longer
  // than ProbeMs(): a turn queued or in a long prefill then begins its stream (the role
  // chunk, then a comment every ProbeMs() until its first text), so that a client that hung
  // up is noticed by a failed write, and proxies and clients with idle timeouts do not drop
  // it; a later failure is the stream's last event.
  const absl::Time stream_by = absl::Now() + absl::Milliseconds(ProbeMs());
  HttpTurn::Update first = NextUpdate(*reply, stream ? ProbeMs() : options_.keepalive_ms);
  while (first.text.empty() && first.logprobs.empty() && !first.ended &&
         !(stream && absl::Now() >= stream_by)) {
    first = NextUpdate(*reply, stream ? ProbeMs() : options_.keepalive_ms);
  }
  if (!stream || first.ended) {
    const absl::Status st = Conclude(*reply, /*cancel=*/false);
    if (!st.ok()) {
      if (reply->session_deleted) res.headers.erase(kSessionHeader);  // names no session now
      Fail(res, st);
      return;
    }
    const TurnResult& r = *reply->turn->outcome();
    if (!stream) {
      // A turn resumed from the store: its stored part has no logprobs, so none are given.
      const std::vector<v1::TokenLogprob> logprobs = reply->turn->logprobs();
      const bool whole = reply->logprobs && reply->resumed.empty();
      res.set_content(reply->writer.Body(r.text, r.done.finish_reason(), r.done.usage(),
                                         whole ? &logprobs : nullptr),
                      "application/json");
      return;
    }
  }
  reply->first_text = reply->resumed + first.text;  // a resumed turn's stored part first
  reply->first_logprobs = std::move(first.logprobs);
  reply->text_offset = static_cast<int64_t>(reply->resumed.size());
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, reply](size_t, httplib::DataSink& sink) { return Pump(*reply, sink); },
      // Last, also when the provider never ran (the client went away before the headers).
      [this, reply](bool) { Conclude(*reply, /*cancel=*/true).IgnoreError(); });
}

bool HttpApi::Pump(Reply& reply, httplib::DataSink& sink) {
  const auto write = [&sink](const std::string& data) {
    return data.empty() || sink.write(data.data(), data.size());
  };
  // A piece of text and its tokens' logprobs (when asked: a chunk per token even when the
  // token released no text yet, as a stop string's prefix or part of a character).
  const auto delta = [&](const std::string& text, const std::vector<v1::TokenLogprob>& lps) {
    if (text.empty() && (!reply.logprobs || lps.empty())) return true;
    const std::string event =
        reply.writer.Delta(text, reply.logprobs ? &lps : nullptr, reply.text_offset);
    for (const v1::TokenLogprob& lp : lps) {
      reply.text_offset += static_cast<int64_t>(lp.token().size());
    }
    return write(event);
  };
  bool ok = write(reply.writer.First());
  if (ok) ok = delta(reply.first_text, reply.first_logprobs);
  bool texted = !reply.first_text.empty() || !reply.first_logprobs.empty();
  while (ok && !reply.concluded) {
    HttpTurn::Update u = NextUpdate(reply, texted ? options_.keepalive_ms : ProbeMs());
    if (!u.ended && u.text.empty() && u.logprobs.empty()) {
      ok = write(": keep-alive\n\n");  // silent for that long (an SSE comment)
      continue;
    }
    texted = true;
    ok = delta(u.text, u.logprobs);
    if (u.ended) break;
  }
  if (!ok) {  // the client went away: cancel the turn (the worker's too)
    Conclude(reply, /*cancel=*/true).IgnoreError();
    return false;
  }
  const absl::Status st = Conclude(reply, /*cancel=*/false);
  if (st.ok()) {
    const TurnResult& r = *reply.turn->outcome();
    write(reply.writer.Last(r.done.finish_reason(), r.done.usage()));
  } else {
    write(openai::ErrorEvent(st));  // the stream had begun: the error is its last event
  }
  sink.done();
  return true;
}

absl::Status HttpApi::Conclude(Reply& reply, bool cancel) {
  if (reply.concluded) return reply.concluded_status;
  reply.concluded = true;
  if (cancel) {
    if (reply.open.has_value()) conversations_.Ending(*reply.open);
    if (!reply.key.empty()) idempotency_.Ending(reply.tenant, reply.key);
    reply.turn->Cancel();
  }
  while (!NextUpdate(reply, options_.keepalive_ms).ended) {
  }
  {
    absl::MutexLock lock(&mu_);
    running_.erase(reply.turn);
  }
  const absl::StatusOr<TurnResult>& outcome = reply.turn->outcome();
  absl::Status st = outcome.status();
  if (reply.open.has_value()) {
    // A client that left (cancel) before the end did not get the whole reply, even when the
    // worker finished first: the turn is interrupted, with what was sent.
    const absl::StatusOr<TurnResult> as_stored =
        outcome.ok() && cancel
            ? absl::StatusOr<TurnResult>(conversations_.StoppedAfterItsEnd(*outcome))
            : outcome;
    const absl::Status stored = conversations_.Finish(*reply.open, as_stored, reply.turn->sent());
    reply.session_deleted =
        Conversations::DeletesItsSession(*reply.open, as_stored, reply.turn->sent());
    st = as_stored.status();
    if (st.ok()) st = stored;
    if (st.ok()) {
      std::vector<StoredMessage> transcript = reply.messages;
      transcript.push_back({"assistant", outcome->text});
      index_.Put(reply.open->tenant, reply.open->session_id, transcript);
      // The conversation's first exchange: found by its opening too (a list cutting the
      // reply short has no earlier transcript to be found by).
      if (std::all_of(reply.messages.begin(), reply.messages.end() - 1,
                      [](const StoredMessage& m) { return m.role == "system"; }) &&
          reply.messages.back().role == "user") {
        index_.PutOpening(reply.open->tenant, reply.open->session_id, reply.messages);
      }
    }
  }
  if (!reply.open.has_value() && !reply.key.empty()) {
    // A keyed completion: kept as it ended, for a request sent again (replayed when
    // complete, resumed from the part sent otherwise).
    IdempotencyKeys::Completion kept{IdempotencyKeys::Digest(reply.prompt), reply.model,
                                     reply.turn->sent()};
    kept.reply.seed = reply.seed;
    if (outcome.ok() && !cancel) {
      kept.reply.content = outcome->text;
      kept.reply.token_ids = outcome->tokens;
      kept.reply.finish = static_cast<int>(outcome->done.finish_reason());
      kept.reply.state = TurnState::kComplete;
    } else {
      kept.reply.state = TurnState::kInterrupted;
    }
    idempotency_.PutCompletion(reply.tenant, reply.key, std::move(kept));
  }
  if (st.code() == absl::StatusCode::kCancelled) {
    absl::MutexLock lock(&mu_);
    if (stopping_) st = absl::UnavailableError("the coordinator is shutting down; retryable");
  }
  // The key's turn is stored as it ended: a request sent again now finds it.
  if (!reply.key.empty()) idempotency_.Release(reply.tenant, reply.key);
  // The worker names the text it was sent "messages"; a completion's is its "prompt".
  if (reply.writer.endpoint() == openai::Endpoint::kCompletion) {
    st = RenameField(st, "messages", "prompt");
  }
  reply.concluded_status = st;
  return st;
}

void HttpApi::Models(const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<std::string> tenant = Admit(req);
  if (!tenant.ok()) {
    Fail(res, tenant.status());
    return;
  }
  const std::vector<v1::ModelInfo> models = conversations_.Models();
  if (req.matches.size() < 2) {
    res.set_content(openai::ModelList(models), "application/json");
    return;
  }
  const std::string id = req.matches[1];
  std::vector<std::string> names;
  for (const v1::ModelInfo& m : models) {
    if (m.name() == id) {
      res.set_content(openai::ModelObject(m), "application/json");
      return;
    }
    names.push_back(m.name());
  }
  Fail(res, Conversations::UnknownModel(id, names));
}

void HttpApi::Health(const httplib::Request&, httplib::Response& res) {
  int healthy = 0;
  for (const WorkerView& w : workers_.Snapshot()) healthy += w.healthy && !w.draining ? 1 : 0;
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
  }
  const bool ok = healthy > 0 && !stopping && conversations_.TakingTurns().ok();
  res.status = ok ? 200 : 503;
  res.set_content(absl::StrCat("{\"status\":\"", ok ? "ok" : "unavailable",
                               "\",\"healthy_workers\":", healthy, "}"),
                  "application/json");
}

}  // namespace recall::coordinator
