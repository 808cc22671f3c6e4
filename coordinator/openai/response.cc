#include "coordinator/openai/response.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/retry_after.h"
#include "nlohmann/json.hpp"

namespace recall::openai {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) {
  // Text from the workers is valid UTF-8; replace rather than throw if it ever is not.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Event(const Json& j) { return absl::StrCat("data: ", Dump(j), "\n\n"); }

std::string NewId(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(prefix, absl::Hex(rng(), absl::kZeroPad16),
                      absl::Hex(rng() & 0xffffffff, absl::kZeroPad8));
}

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* FinishName(v1::FinishReason reason) {
  return reason == v1::FINISH_REASON_STOP ? "stop" : "length";  // LENGTH and CONTEXT
}

Json UsageJson(const v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.generated_tokens()},
          {"total_tokens", u.prompt_tokens() + u.generated_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

// The field an error's message names: the FieldError payload, else a leading "field: ".
std::string Param(const absl::Status& status) {
  std::string field = flags::FieldOf(status);
  if (!field.empty()) return field;
  const std::string message(status.message());
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  for (size_t i = 0; i < colon; ++i) {
    const char c = message[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' ||
          c == ']')) {
      return "";
    }
  }
  return message.substr(0, colon);
}

Json ErrorJson(const absl::Status& status, int* http) {
  const char* type = "invalid_request_error";
  const char* code = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      *http = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      *http = 401;
      code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      *http = 403;
      type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      *http = 404;
      code = "not_found";
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:  // another writer took the turn over: a conflict
      *http = 409;
      code = "conflict";
      break;
    case absl::StatusCode::kResourceExhausted:
      *http = 429;
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      *http = 503;
      type = "server_error";
      code = "unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      *http = 504;
      type = "server_error";
      code = "timeout";
      break;
    default:
      *http = 500;
      type = "server_error";
      break;
  }
  std::string param = Param(status);
  std::string message(status.message());
  // The worker names the gRPC request's fields (sampling.top_k); the HTTP request's are the
  // same without the "sampling." (top_k).
  constexpr absl::string_view kSampling = "sampling.";
  if (absl::StartsWith(param, kSampling)) {
    param.erase(0, kSampling.size());
    if (absl::StartsWith(message, kSampling)) message.erase(0, kSampling.size());
  }
  if (*http == 404 && param == "model") code = "model_not_found";
  Json e = {{"message", std::move(message)},
            {"type", type},
            {"param", param.empty() ? Json() : Json(param)},
            {"code", code == nullptr ? Json() : Json(code)}};
  return {{"error", std::move(e)}};
}

}  // namespace

HttpError ErrorResponse(const absl::Status& status) {
  HttpError out;
  out.body = Dump(ErrorJson(status, &out.status));
  const absl::string_view message = status.message();
  if (absl::StrContains(message, "not retryable")) {
    out.should_retry = false;
  } else if (absl::StrContains(message, "retry after ")) {
    out.retry_after_ms = RetryAfterMs(message).value_or(-1);
    out.should_retry = true;
  } else if (absl::StrContains(message, "retryable") ||
             status.code() == absl::StatusCode::kUnavailable) {
    out.should_retry = true;
  } else if (status.code() == absl::StatusCode::kDataLoss ||
             (out.status >= 400 && out.status < 500 && out.status != 409 && out.status != 429)) {
    out.should_retry = false;
  }
  return out;
}

std::string ErrorEvent(const absl::Status& status) {
  int http = 0;
  return Event(ErrorJson(status, &http));
}

ResponseWriter::ResponseWriter(Endpoint endpoint, std::string model, bool include_usage)
    : endpoint_(endpoint),
      model_(std::move(model)),
      include_usage_(include_usage),
      id_(NewId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-")),
      created_(NowSeconds()) {}

namespace {

// A logprob as JSON: a number always (nlohmann writes NaN and infinities as null, which
// OpenAI's schema does not allow); -9999, OpenAI's figure for "no chance", for -inf and for
// what a model with broken weights gives (NaN).
double Logprob(float v) { return std::isfinite(v) ? std::min<double>(v, 0.0) : -9999.0; }

Json BytesJson(const std::string& bytes) {
  Json out = Json::array();
  for (const char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

}  // namespace

Json ResponseWriter::LogprobsJson(const std::vector<v1::TokenLogprob>* logprobs,
                                  int64_t text_offset) const {
  if (logprobs == nullptr) return nullptr;
  if (endpoint_ == Endpoint::kChat) {
    Json content = Json::array();
    for (const v1::TokenLogprob& lp : *logprobs) {
      Json top = Json::array();
      for (int i = 0; i < lp.top_ids_size(); ++i) {
        top.push_back({{"token", lp.top_tokens(i)},
                       {"logprob", Logprob(lp.top_logprobs(i))},
                       {"bytes", BytesJson(lp.top_tokens(i))}});
      }
      content.push_back({{"token", lp.token()},
                         {"logprob", Logprob(lp.logprob())},
                         {"bytes", BytesJson(lp.token())},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       offsets = Json::array();
  for (const v1::TokenLogprob& lp : *logprobs) {
    tokens.push_back(lp.token());
    token_logprobs.push_back(Logprob(lp.logprob()));
    Json top = Json::object();
    for (int i = 0; i < lp.top_ids_size(); ++i) {
      if (!top.contains(lp.top_tokens(i))) top[lp.top_tokens(i)] = Logprob(lp.top_logprobs(i));
    }
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(lp.token().size());
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

std::string ResponseWriter::Body(const std::string& text, v1::FinishReason reason,
                                 const v1::Usage& usage,
                                 const std::vector<v1::TokenLogprob>* logprobs) const {
  Json choice = {
      {"index", 0}, {"logprobs", LogprobsJson(logprobs, 0)}, {"finish_reason", FinishName(reason)}};
  if (endpoint_ == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  const Json body = {
      {"id", id_},
      {"object", endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion"},
      {"created", created_},
      {"model", model_},
      {"choices", Json::array({std::move(choice)})},
      {"usage", UsageJson(usage)}};
  return Dump(body);
}

std::string ResponseWriter::Chunk(const std::string& text, bool role, const char* finish,
                                  Json logprobs) const {
  Json choice = {{"index", 0},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish == nullptr ? Json() : Json(finish)}};
  if (endpoint_ == Endpoint::kChat) {
    Json delta = Json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  Json chunk = Envelope(Json::array({std::move(choice)}));
  if (include_usage_) chunk["usage"] = nullptr;
  return Event(chunk);
}

nlohmann::json ResponseWriter::Envelope(nlohmann::json choices) const {
  return {{"id", id_},
          {"object", endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", std::move(choices)}};
}

std::string ResponseWriter::First() const {
  return endpoint_ == Endpoint::kChat ? Chunk("", /*role=*/true, nullptr, nullptr) : std::string();
}

std::string ResponseWriter::Delta(const std::string& text,
                                  const std::vector<v1::TokenLogprob>* logprobs,
                                  int64_t text_offset) const {
  return Chunk(text, /*role=*/false, nullptr, LogprobsJson(logprobs, text_offset));
}

std::string ResponseWriter::Last(v1::FinishReason reason, const v1::Usage& usage) const {
  std::string out = Chunk("", /*role=*/false, FinishName(reason), nullptr);
  if (include_usage_) {
    Json chunk = Envelope(Json::array());
    chunk["usage"] = UsageJson(usage);
    out += Event(chunk);
  }
  out += "data: [DONE]\n\n";
  return out;
}

namespace {

Json ModelJson(const v1::ModelInfo& m) {
  return {{"id", m.name()},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "recall"},
          {"context_length", m.context_length()},
          {"workers", m.workers()}};
}

}  // namespace

std::string ModelObject(const v1::ModelInfo& m) { return Dump(ModelJson(m)); }

std::string ModelList(const std::vector<v1::ModelInfo>& models) {
  Json data = Json::array();
  for (const v1::ModelInfo& m : models) data.push_back(ModelJson(m));
  return Dump(Json{{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace recall::openai
