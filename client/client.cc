#include "client/client.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/retry_after.h"

namespace recall {
namespace {

absl::Status ToAbsl(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::Status FromAbsl(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Worth asking again: the server unreachable, or a cancel this client did not make (a server
// shutting down cancels the calls it has).
bool Retryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kCancelled;
}

}  // namespace

absl::Status CheckApiKey(const std::string& key) {
  for (const char c : key) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "api_key: the key must be printable ASCII without spaces or control characters (a "
          "key file's line end?)");
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<Client> Client::Connect(ClientOptions options) {
  return std::unique_ptr<Client>(new Client(std::move(options)));
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  auto creds = options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
  // A long session's transcript (GetSession) can pass gRPC's default 4 MiB limit.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // A server that went away is dialled again at least every second: gRPC's own backoff grows
  // to 120 s, and a chat whose server was back after 2 s gave up at the end of its retries
  // without having dialled it again.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(options_.address, creds, args);
  stub_ = v1::Chat::NewStub(channel_);
}

void Client::Prepare(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() + options_.deadline);
  if (!options_.api_key.empty() && CheckApiKey(options_.api_key).ok()) {
    ctx->AddMetadata("authorization", "Bearer " + options_.api_key);
  }
}

bool Client::AwaitRetry(std::chrono::milliseconds backoff) const {
  const auto until = std::chrono::system_clock::now() + backoff;
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
    std::this_thread::sleep_until(until);  // reachable, and said to wait
    return false;
  }
  return channel_->WaitForConnected(until);
}

std::chrono::milliseconds Client::RetryWindow() const {
  return std::chrono::milliseconds(100) * ((1 << std::clamp(options_.retries, 0, 20)) - 1);
}

absl::Status Client::Usable() const {
  if (options_.address.empty()) {
    return absl::InvalidArgumentError("address: empty; give the coordinator's HOST:PORT");
  }
  return CheckApiKey(options_.api_key);  // a bad key was left out, and read as "missing"
}

absl::Status Client::Failure(const grpc::Status& s) const {
  // gRPC's words for a server it could not reach (not one that went away mid-call).
  const std::string& m = s.error_message();
  const bool unreached = m.find("failed to connect to all addresses") != std::string::npos ||
                         m.find("DNS resolution failed") != std::string::npos ||
                         m.find("connections to all backends failing") != std::string::npos;
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
      channel_->GetState(false) == GRPC_CHANNEL_READY || !unreached) {
    return ToAbsl(s);
  }
  // A TLS handshake that fails reads as a closed socket: the likely causes named.
  const char* tls = options_.credentials == nullptr
                        ? " One that serves TLS needs the client's TLS settings (its CA)"
                        : " Over TLS, the server's certificate must be signed by the CA given "
                          "and name the host, and one that asks for client certificates needs "
                          "the client's certificate and key";
  return absl::UnavailableError(absl::StrCat(
      "cannot reach ", options_.address, " (is recall serve or recall-coordinator running there?",
      tls, "): ", s.error_message()));
}

bool Client::NextTry(RetryState* retry, const std::function<bool()>& cancelled) const {
  using std::chrono::milliseconds;
  auto now = std::chrono::steady_clock::now();
  if (!retry->until.has_value()) retry->until = now + RetryWindow();
  if (now >= *retry->until) return false;
  const auto end = std::min(now + retry->backoff, *retry->until);
  // Dialled once now (not at gRPC's backoff); the channel dials again at least every second.
  if (channel_->GetState(false) != GRPC_CHANNEL_READY) {
    grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  }
  bool back = false;
  for (; now < end && !(cancelled && cancelled()); now = std::chrono::steady_clock::now()) {
    milliseconds slice = std::chrono::duration_cast<milliseconds>(end - now) + milliseconds(1);
    if (cancelled) slice = std::min(slice, milliseconds(50));
    if (AwaitRetry(slice)) {
      back = true;
      break;
    }
  }
  // Back: the next wait starts short again, but not at nothing (a server that takes the
  // connection and drops each call would be asked back to back).
  retry->backoff = back ? milliseconds(100) : retry->backoff * 2;
  if (back) std::this_thread::sleep_for(milliseconds(50));
  return true;
}

template <typename Call>
grpc::Status Client::WithRetries(Call call) const {
  if (absl::Status usable = Usable(); !usable.ok()) return FromAbsl(usable);
  RetryState retry;
  while (true) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    grpc::Status s = call(&ctx);
    if (!Retryable(static_cast<absl::StatusCode>(s.error_code())) || !NextTry(&retry)) return s;
  }
}

absl::StatusOr<v1::Session> Client::CreateSession(const v1::CreateSessionRequest& request) {
  // Idempotent by its request id (one is made when the request has none): retried like the
  // other calls, a retry of a request whose reply was lost gets the session it made (it was
  // sent once only, as a lost reply left a second session behind).
  v1::CreateSessionRequest req = request;
  if (req.request_id().empty()) req.set_request_id(NewTurnId());
  v1::Session out;
  RetryState retry;
  grpc::Status s;
  // A request of the same id still running (on another coordinator, or this one's earlier
  // try) answers ABORTED, retryable: asked again after the usual wait.
  do {
    s = WithRetries([&](grpc::ClientContext* ctx) { return stub_->CreateSession(ctx, req, &out); });
  } while (s.error_code() == grpc::StatusCode::ABORTED &&
           s.error_message().find("(retryable)") != std::string::npos && NextTry(&retry));
  if (!s.ok()) return Failure(s);
  return out;
}

absl::StatusOr<v1::Session> Client::GetSession(const std::string& session_id) {
  v1::GetSessionRequest req;
  req.set_session_id(session_id);
  v1::Session out;
  grpc::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->GetSession(c, req, &out); });
  if (!s.ok()) return Failure(s);
  return out;
}

absl::StatusOr<v1::ListSessionsResponse> Client::ListSessions(int page_size,
                                                              const std::string& page_token) {
  v1::ListSessionsRequest req;
  req.set_page_size(page_size);
  req.set_page_token(page_token);
  v1::ListSessionsResponse out;
  grpc::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->ListSessions(c, req, &out); });
  if (!s.ok()) return Failure(s);
  return out;
}

absl::Status Client::DeleteSession(const std::string& session_id) {
  v1::DeleteSessionRequest req;
  req.set_session_id(session_id);
  v1::DeleteSessionResponse out;
  return Failure(
      WithRetries([&](grpc::ClientContext* c) { return stub_->DeleteSession(c, req, &out); }));
}

absl::StatusOr<v1::ListModelsResponse> Client::ListModels() {
  v1::ListModelsResponse out;
  grpc::Status s = WithRetries(
      [&](grpc::ClientContext* c) { return stub_->ListModels(c, v1::ListModelsRequest(), &out); });
  if (!s.ok()) return Failure(s);
  return out;
}

namespace {

// Reads a Generate reply to its end, passing its text on.
template <typename Reader>
absl::StatusOr<v1::ConverseDone> ReadReply(Reader& reader, const TextCallback& on_text) {
  v1::ConverseEvent ev;
  v1::ConverseDone done;
  bool got_done = false;
  while (reader->Read(&ev)) {
    if (ev.has_tokens()) {
      if (on_text && !ev.tokens().text().empty()) on_text(ev.tokens().text());
    } else if (ev.has_done()) {
      done = ev.done();
      got_done = true;
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return ToAbsl(s);
  if (!got_done) return absl::InternalError("the reply stream ended without a final event");
  return done;
}

}  // namespace

std::string Client::NewTurnId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char id[40];
  std::snprintf(id, sizeof(id), "sdk-%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return id;
}

absl::StatusOr<v1::ConverseDone> Client::Converse(const std::string& session_id,
                                                  const std::string& message,
                                                  const v1::SamplingParams& sampling,
                                                  const TextCallback& on_text,
                                                  const std::string& turn_id) {
  std::unique_ptr<ReplyStream> reply = ConverseStream(session_id, message, sampling, turn_id);
  std::string text;
  while (reply->Next(&text)) {
    if (on_text) on_text(text);
  }
  if (!reply->status().ok()) return reply->status();
  return reply->done();
}

absl::StatusOr<v1::ConverseDone> Client::Generate(const v1::GenerateRequest& request,
                                                  const TextCallback& on_text) {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  grpc::ClientContext ctx;
  Prepare(&ctx);
  auto reader = stub_->Generate(&ctx, request);
  absl::StatusOr<v1::ConverseDone> done = ReadReply(reader, on_text);
  if (absl::IsUnavailable(done.status())) return Failure(FromAbsl(done.status()));
  return done;
}

std::unique_ptr<ReplyStream> Client::ConverseStream(const std::string& session_id,
                                                    const std::string& message,
                                                    const v1::SamplingParams& sampling,
                                                    const std::string& turn_id) {
  v1::ConverseRequest req;
  req.set_session_id(session_id);
  req.set_message(message);
  *req.mutable_sampling() = sampling;
  req.set_turn_id(turn_id.empty() ? NewTurnId() : turn_id);
  return std::make_unique<ReplyStream>(*this, std::move(req));
}

ReplyStream::ReplyStream(const Client& client, v1::ConverseRequest request)
    : client_(client), request_(std::move(request)) {
  status_ = client_.Usable();
  if (!status_.ok()) {
    finished_ = true;  // Next returns false at once, with this status
    return;
  }
  Open();
}

bool ReplyStream::Open() {
  auto context = std::make_unique<grpc::ClientContext>();
  client_.Prepare(context.get());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return false;
    context_ = std::move(context);
  }
  reader_ = client_.stub_->Converse(context_.get(), request_);
  seen_ = 0;
  ++attempt_;
  return true;
}

bool ReplyStream::Cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void ReplyStream::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

ReplyStream::~ReplyStream() {
  if (!finished_ && reader_ != nullptr) {
    Cancel();
    v1::ConverseEvent ev;
    while (reader_->Read(&ev)) {
    }
    reader_->Finish();
  }
}

// Sent again on UNAVAILABLE (the coordinator unreachable, or the stream broke): the turn id
// makes the coordinator stream back (or resume) the turn it already has instead of running it
// twice. Once sent, FAILED_PRECONDITION (that turn still ending on the coordinator) is waited
// out too. Each attempt repeats the reply from its start: what was passed on is skipped.
bool ReplyStream::Next(std::string* text) {
  while (!finished_) {
    v1::ConverseEvent ev;
    while (reader_->Read(&ev)) {
      if (ev.has_done()) {
        done_ = ev.done();
        got_done_ = true;
        continue;
      }
      const std::string& piece = ev.tokens().text();
      const size_t from = seen_ >= delivered_ ? 0 : std::min(piece.size(), delivered_ - seen_);
      seen_ += piece.size();
      if (from < piece.size()) {
        *text = piece.substr(from);
        delivered_ += text->size();
        retry_ = RetryState();  // progress: a later break has the whole window again
        return true;
      }
    }
    status_ = ToAbsl(reader_->Finish());
    if (status_.ok() && !got_done_) {
      status_ = absl::InternalError("the reply stream ended without a final event");
    }
    const bool cancelled = Cancelled();
    if (cancelled) status_ = absl::CancelledError("the reply was cancelled");
    const absl::StatusCode code = status_.code();
    // The workers full: asked again after the wait they name (within the retry window).
    const std::optional<int64_t> full_for = code == absl::StatusCode::kResourceExhausted
                                                ? RetryAfterMs(status_.message())
                                                : std::nullopt;
    if (full_for.has_value()) {
      retry_.backoff = std::max(retry_.backoff, std::chrono::milliseconds(*full_for));
    }
    // Not asked again before the wait it names: a window ending sooner ends the retries.
    const bool wait_fits =
        !full_for.has_value() || !retry_.until.has_value() ||
        std::chrono::steady_clock::now() + std::chrono::milliseconds(*full_for) <= *retry_.until;
    const bool retry =
        !cancelled &&
        (Retryable(code) || (full_for.has_value() && wait_fits) ||
         // This turn's id running from a broken attempt, or another turn of the session
         // still running (one this client cancelled, not yet ended on the server): conflicts
         // whose message says they are retryable.
         (code == absl::StatusCode::kFailedPrecondition &&
          ((attempt_ > 1 && status_.message().find("still running") != absl::string_view::npos) ||
           status_.message().find("(retryable)") != absl::string_view::npos)));
    if (!retry || !client_.NextTry(&retry_, [this] { return Cancelled(); })) {
      status_ = client_.Failure(FromAbsl(status_));
      break;
    }
    if (!Open()) {
      status_ = absl::CancelledError("the reply was cancelled");
      break;
    }
  }
  finished_ = true;
  return false;
}

absl::StatusOr<std::unique_ptr<Session>> Client::StartSession(
    const v1::CreateSessionRequest& request) {
  absl::StatusOr<v1::Session> s = CreateSession(request);
  if (!s.ok()) return s.status();
  return std::make_unique<Session>(*this, *std::move(s));
}

absl::StatusOr<v1::ConverseDone> Session::Send(const std::string& message,
                                               const TextCallback& on_text) {
  return client_.Converse(id(), message, sampling_, on_text);
}

std::unique_ptr<ReplyStream> Session::Stream(const std::string& message) {
  return client_.ConverseStream(id(), message, sampling_);
}

absl::StatusOr<std::vector<v1::ChatMessage>> Session::History() {
  absl::StatusOr<v1::Session> s = client_.GetSession(id());
  if (!s.ok()) return s.status();
  return std::vector<v1::ChatMessage>(s->messages().begin(), s->messages().end());
}

absl::Status Session::Close() { return client_.DeleteSession(id()); }

}  // namespace recall
