#include "coordinator/openai/request.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"

namespace recall::openai {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& field, const std::string& what) {
  return flags::FieldError(field, what);
}

std::string Got(double v) { return absl::StrCat(", got ", v); }

// The field, or nullptr when it is absent or null (null means "the default", as in OpenAI's API).
const Json* Find(const Json& object, const std::string& name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// A string from the request, quoted, cut at 32 bytes for an error message.
std::string Shown(const std::string& s) {
  return absl::StrCat("\"", s.size() <= 32 ? s : s.substr(0, 32) + "...", "\"");
}

absl::StatusOr<Json> ParseObject(absl::string_view body) {
  // No request field nests deeply; a value nested deeper than this is refused while parsing
  // (printing or walking one recursively could run out of stack).
  constexpr int kMaxDepth = 64;
  struct TooDeep {};
  Json j;
  try {
    j = Json::parse(body.begin(), body.end(), [](int depth, Json::parse_event_t e, Json&) {
      // The start of the level-k array or object reports depth k - 1 (the body's is 0).
      const bool opens =
          e == Json::parse_event_t::object_start || e == Json::parse_event_t::array_start;
      if (opens && depth >= kMaxDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body nests arrays and objects deeper than ", kMaxDepth, " levels"));
  } catch (const Json::out_of_range& e) {
    // nlohmann refuses a number beyond a double's range (1e999) while parsing; it names it.
    return absl::InvalidArgumentError(
        absl::StrCat("the request body has a number that is not finite; numbers must be finite (",
                     e.what(), ")"));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body must be a JSON object, got ", j.type_name()));
  }
  return j;
}

absl::StatusOr<std::optional<double>> Number(const Json& o, const std::string& name) {
  const Json* v = Find(o, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return Bad(name, absl::StrCat("must be a number, got ", v->type_name()));
  const double d = v->get<double>();
  if (!std::isfinite(d)) return Bad(name, "must be a finite number");
  return d;
}

absl::StatusOr<std::optional<int64_t>> Integer(const Json& o, const std::string& name) {
  const Json* v = Find(o, name);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(
          name, absl::StrCat("must be at most ", std::numeric_limits<int64_t>::max(), ", got ", u));
    }
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d)) return Bad(name, "must be a finite integer");
    if (d == std::floor(d) && std::fabs(d) >= 9223372036854775808.0) {
      // An integer too large for int64 (nlohmann reads it as a double).
      return Bad(name,
                 absl::StrCat("must be an integer from ", std::numeric_limits<int64_t>::min(),
                              " to ", std::numeric_limits<int64_t>::max(), ", got ", v->dump()));
    }
    return Bad(name, absl::StrCat("must be an integer, got ", v->dump()));  // 5.0, not 5
  }
  return Bad(name, absl::StrCat("must be an integer, got ", v->type_name()));
}

absl::StatusOr<std::optional<bool>> Bool(const Json& o, const std::string& name) {
  const Json* v = Find(o, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean())
    return Bad(name, absl::StrCat("must be true or false, got ", v->type_name()));
  return v->get<bool>();
}

absl::StatusOr<std::optional<std::string>> String(const Json& o, const std::string& name) {
  const Json* v = Find(o, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return Bad(name, absl::StrCat("must be a string, got ", v->type_name()));
  return v->get<std::string>();
}

// A text the client sends: at most `max_bytes`, valid UTF-8.
absl::Status CheckText(const std::string& field, const std::string& text, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return Bad(field, absl::StrCat(text.size(), " bytes; at most ", max_bytes,
                                   " (the server's --max-message-bytes)"));
  }
  if (!utf8::IsValid(text)) return Bad(field, "is not valid UTF-8");
  return absl::OkStatus();
}

// The sampling fields both endpoints share, and the refusals of what Recall does not do.
absl::Status ParseSampling(const Json& o, const RequestLimits& limits, v1::SamplingParams* s) {
  RECALL_ASSIGN_OR_RETURN(const std::optional<double> temperature, Number(o, "temperature"));
  if (temperature.has_value()) {
    if (*temperature < 0 || *temperature > 2) {
      return Bad("temperature", absl::StrCat("must be in [0, 2]", Got(*temperature)));
    }
    s->set_temperature(static_cast<float>(*temperature));
  }
  RECALL_ASSIGN_OR_RETURN(const std::optional<double> top_p, Number(o, "top_p"));
  if (top_p.has_value()) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return Bad("top_p", absl::StrCat("must be in (0, 1]", Got(*top_p)));
    }
    s->set_top_p(static_cast<float>(*top_p));
  }
  // max_completion_tokens is the newer name; max_tokens when it is absent.
  std::string tokens_field = "max_completion_tokens";
  RECALL_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, Integer(o, tokens_field));
  if (!max_tokens.has_value()) {
    tokens_field = "max_tokens";
    RECALL_ASSIGN_OR_RETURN(max_tokens, Integer(o, tokens_field));
  }
  if (max_tokens.has_value()) {
    const int64_t hi = limits.max_tokens > 0 ? limits.max_tokens : (1 << 30);
    if (*max_tokens < 1 || *max_tokens > hi) {
      return Bad(tokens_field, absl::StrCat("must be in [1, ", hi, "], got ", *max_tokens));
    }
    s->set_max_tokens(static_cast<int32_t>(*max_tokens));
  }
  if (const Json* stop = Find(o, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      if (stop->get<std::string>().empty()) return Bad("stop", "must not be empty");
      s->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 4)
        return Bad("stop", absl::StrCat("at most 4 strings, got ", stop->size()));
      for (size_t i = 0; i < stop->size(); ++i) {
        const Json& e = (*stop)[i];
        const std::string at = absl::StrCat("stop[", i, "]");
        if (!e.is_string()) return Bad(at, absl::StrCat("must be a string, got ", e.type_name()));
        if (e.get<std::string>().empty()) return Bad(at, "must not be empty");
        s->add_stop(e.get<std::string>());
      }
    } else {
      return Bad("stop",
                 absl::StrCat("must be a string or an array of strings, got ", stop->type_name()));
    }
  }
  // A seed is 64 bits: any unsigned 64-bit value, or a negative one as its pattern.
  if (const Json* seed = Find(o, "seed"); seed != nullptr && seed->is_number_unsigned()) {
    s->set_seed(seed->get<uint64_t>());
  } else if (seed != nullptr && seed->is_number_float()) {
    return Bad("seed",
               absl::StrCat("must be an integer from ", std::numeric_limits<int64_t>::min(), " to ",
                            std::numeric_limits<uint64_t>::max(), ", got ", seed->dump()));
  } else {
    RECALL_ASSIGN_OR_RETURN(const std::optional<int64_t> signed_seed, Integer(o, "seed"));
    if (signed_seed.has_value()) s->set_seed(static_cast<uint64_t>(*signed_seed));
  }
  RECALL_ASSIGN_OR_RETURN(const std::optional<int64_t> top_k, Integer(o, "top_k"));
  if (top_k.has_value()) {
    // The upper bound is the model's vocabulary, which the worker checks (and names).
    if (*top_k < 0)
      return Bad("top_k", absl::StrCat("must not be negative (0: off), got ", *top_k));
    if (*top_k > (1 << 30)) {
      return Bad("top_k", absl::StrCat("must be at most the vocabulary's size, got ", *top_k));
    }
    s->set_top_k(static_cast<int32_t>(*top_k));
  }
  RECALL_ASSIGN_OR_RETURN(const std::optional<double> repetition, Number(o, "repetition_penalty"));
  if (repetition.has_value()) {
    if (!(*repetition > 0 && *repetition <= 100)) {
      return Bad("repetition_penalty", absl::StrCat("must be in (0, 100]", Got(*repetition)));
    }
    s->set_repetition_penalty(static_cast<float>(*repetition));
  }
  if (const Json* bias = Find(o, "logit_bias"); bias != nullptr) {
    if (!bias->is_object()) {
      return Bad("logit_bias", absl::StrCat("must be an object of token ids to numbers, got ",
                                            bias->type_name()));
    }
    for (const auto& [key, value] : bias->items()) {
      int32_t token = 0;
      if (!absl::SimpleAtoi(key, &token) || token < 0) {
        return Bad("logit_bias", absl::StrCat("key \"", key, "\" is not a token id"));
      }
      const std::string at = absl::StrCat("logit_bias[\"", key, "\"]");
      if (!value.is_number()) {
        return Bad(at, absl::StrCat("must be a number, got ", value.type_name()));
      }
      const double v = value.get<double>();
      if (!(v >= -100 && v <= 100)) return Bad(at, absl::StrCat("must be in [-100, 100]", Got(v)));
      (*s->mutable_logit_bias())[token] = static_cast<float>(v);
    }
  }
  RECALL_ASSIGN_OR_RETURN(const std::optional<double> frequency, Number(o, "frequency_penalty"));
  RECALL_ASSIGN_OR_RETURN(const std::optional<double> presence, Number(o, "presence_penalty"));
  if (frequency.has_value()) {
    if (!(*frequency >= -2 && *frequency <= 2)) {
      return Bad("frequency_penalty", absl::StrCat("must be in [-2, 2]", Got(*frequency)));
    }
    s->set_frequency_penalty(static_cast<float>(*frequency));
  }
  if (presence.has_value()) {
    if (!(*presence >= -2 && *presence <= 2)) {
      return Bad("presence_penalty", absl::StrCat("must be in [-2, 2]", Got(*presence)));
    }
    s->set_presence_penalty(static_cast<float>(*presence));
  }
  RECALL_ASSIGN_OR_RETURN(const std::optional<int64_t> n, Integer(o, "n"));
  if (n.has_value() && *n != 1) return Bad("n", absl::StrCat("only 1 is supported, got ", *n));
  for (const char* tools : {"tools", "functions"}) {
    const Json* t = Find(o, tools);
    if (t != nullptr && !(t->is_array() && t->empty())) {
      return Bad(tools, "is not supported (no tool calling)");
    }
  }
  // Tools cannot be asked for by choice either: "none" and "auto" (of no tools) only.
  for (const char* choice : {"tool_choice", "function_call"}) {
    const Json* c = Find(o, choice);
    if (c != nullptr &&
        !(c->is_string() && (c->get<std::string>() == "none" || c->get<std::string>() == "auto"))) {
      return Bad(choice, absl::StrCat("only \"none\" or \"auto\" (no tool calling), got ",
                                      c->is_string() ? Shown(c->get<std::string>())
                                                     : std::string(c->type_name())));
    }
  }
  if (const Json* format = Find(o, "response_format"); format != nullptr) {
    if (!format->is_object()) {
      return Bad("response_format", absl::StrCat("must be an object with \"type\": \"text\", got ",
                                                 format->type_name()));
    }
    const Json* type = Find(*format, "type");
    if (type == nullptr) return Bad("response_format.type", "required (only \"text\")");
    if (!(type->is_string() && type->get<std::string>() == "text")) {
      return Bad("response_format.type",
                 absl::StrCat("only \"text\" is supported, got ",
                              type->is_string() ? Shown(type->get<std::string>())
                                                : std::string(type->type_name())));
    }
  }
  return absl::OkStatus();
}

// stream and stream_options.include_usage.
absl::Status ParseStream(const Json& o, bool* stream, bool* include_usage) {
  RECALL_ASSIGN_OR_RETURN(const std::optional<bool> s, Bool(o, "stream"));
  *stream = s.value_or(false);
  if (const Json* options = Find(o, "stream_options"); options != nullptr) {
    if (!options->is_object()) {
      return Bad("stream_options", absl::StrCat("must be an object, got ", options->type_name()));
    }
    if (!*stream) return Bad("stream_options", "is only allowed when stream is true");
    auto usage = Bool(*options, "include_usage");
    if (!usage.ok()) return Bad("stream_options.include_usage", "must be true or false");
    *include_usage = usage->value_or(false);
  }
  return absl::OkStatus();
}

// messages[i].content: a string, or text parts.
absl::StatusOr<std::string> Content(const Json& m, const std::string& at, const std::string& role) {
  const Json* c = Find(m, "content");
  if (c == nullptr) {
    if (role == "assistant") return std::string();  // a reply with tool calls only
    return Bad(at + ".content", "is required");
  }
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) {
    return Bad(at + ".content",
               absl::StrCat("must be a string or an array of text parts, got ", c->type_name()));
  }
  std::string text;
  for (size_t j = 0; j < c->size(); ++j) {
    const Json& part = (*c)[j];
    const std::string pat = absl::StrCat(at, ".content[", j, "]");
    if (!part.is_object())
      return Bad(pat, absl::StrCat("must be an object, got ", part.type_name()));
    RECALL_ASSIGN_OR_RETURN(const std::optional<std::string> type, String(part, "type"));
    if (type.value_or("") != "text") {
      return Bad(pat + ".type",
                 absl::StrCat("\"", type.value_or(""), "\" is not supported (text parts only)"));
    }
    RECALL_ASSIGN_OR_RETURN(const std::optional<std::string> t, String(part, "text"));
    if (!t.has_value()) return Bad(pat + ".text", "is required");
    if (j > 0) text += "\n";
    text += *t;
  }
  return text;
}

absl::StatusOr<std::vector<Message>> Messages(const Json& o, const RequestLimits& limits) {
  const Json* list = Find(o, "messages");
  if (list == nullptr) return Bad("messages", "is required");
  if (!list->is_array()) {
    return Bad("messages", absl::StrCat("must be an array, got ", list->type_name()));
  }
  if (list->empty()) return Bad("messages", "must not be empty");
  std::vector<Message> out;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& m = (*list)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(at, absl::StrCat("must be an object, got ", m.type_name()));
    RECALL_ASSIGN_OR_RETURN(std::optional<std::string> role, String(m, "role"));
    if (!role.has_value()) return Bad(at + ".role", "is required");
    if (*role == "developer") role = "system";
    if (*role != "system" && *role != "user" && *role != "assistant") {
      return Bad(at + ".role", absl::StrCat(Shown(*role),
                                            " is not supported (one of system, developer, user, "
                                            "assistant; no tool messages)"));
    }
    if (const Json* calls = Find(m, "tool_calls"); calls != nullptr && !calls->empty()) {
      return Bad(at + ".tool_calls", "is not supported (no tool calling)");
    }
    RECALL_ASSIGN_OR_RETURN(std::string content, Content(m, at, *role));
    // The limit is on what users and system prompts bring; an assistant message is most often
    // the model's own reply sent back, which max_tokens bounds (a reply past the limit made
    // every later request of its conversation a 400).
    RECALL_RETURN_IF_ERROR(CheckText(
        at + ".content", content,
        *role == "assistant" ? std::numeric_limits<size_t>::max() : limits.max_message_bytes));
    out.push_back({*role, std::move(content)});
  }
  if (out.back().role != "user") {
    return Bad(absl::StrCat("messages[", out.size() - 1, "].role"),
               absl::StrCat("the last message must be the user's, got ", out.back().role));
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body, const RequestLimits& limits) {
  RECALL_ASSIGN_OR_RETURN(const Json o, ParseObject(body));
  ChatRequest r;
  RECALL_ASSIGN_OR_RETURN(const std::optional<std::string> model, String(o, "model"));
  r.model = model.value_or("");
  RECALL_ASSIGN_OR_RETURN(r.messages, Messages(o, limits));
  RECALL_RETURN_IF_ERROR(ParseSampling(o, limits, &r.sampling));
  RECALL_ASSIGN_OR_RETURN(const std::optional<bool> logprobs, Bool(o, "logprobs"));
  RECALL_ASSIGN_OR_RETURN(const std::optional<int64_t> top, Integer(o, "top_logprobs"));
  if (top.has_value()) {
    if (*top < 0 || *top > kMaxTopLogprobs) {
      return Bad("top_logprobs", absl::StrCat("must be in [0, ", kMaxTopLogprobs, "], got ", *top));
    }
    if (*top > 0 && !logprobs.value_or(false)) {
      return Bad("top_logprobs", "needs \"logprobs\": true");
    }
  }
  if (logprobs.value_or(false)) {
    r.sampling.set_logprobs(true);
    r.sampling.set_top_logprobs(static_cast<int32_t>(top.value_or(0)));
  }
  RECALL_RETURN_IF_ERROR(ParseStream(o, &r.stream, &r.include_usage));
  RECALL_ASSIGN_OR_RETURN(const std::optional<std::string> session, String(o, "session_id"));
  r.session_id = session.value_or("");
  return r;
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body,
                                                         const RequestLimits& limits) {
  RECALL_ASSIGN_OR_RETURN(const Json o, ParseObject(body));
  CompletionRequest r;
  RECALL_ASSIGN_OR_RETURN(const std::optional<std::string> model, String(o, "model"));
  r.model = model.value_or("");
  const Json* prompt = Find(o, "prompt");
  if (prompt == nullptr) return Bad("prompt", "is required");
  if (prompt->is_array()) {
    if (prompt->size() != 1 || !(*prompt)[0].is_string()) {
      return Bad("prompt",
                 "only one text prompt per request is supported (a string, or an "
                 "array of one string)");
    }
    r.prompt = (*prompt)[0].get<std::string>();
  } else if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
  } else {
    return Bad("prompt", absl::StrCat("must be a string, got ", prompt->type_name()));
  }
  if (r.prompt.empty()) return Bad("prompt", "is empty");
  RECALL_RETURN_IF_ERROR(CheckText("prompt", r.prompt, limits.max_message_bytes));
  RECALL_RETURN_IF_ERROR(ParseSampling(o, limits, &r.sampling));
  // The legacy field: the sampled tokens' logprobs and that many alternatives each.
  RECALL_ASSIGN_OR_RETURN(const std::optional<int64_t> logprobs, Integer(o, "logprobs"));
  if (logprobs.has_value()) {
    if (*logprobs < 0 || *logprobs > kMaxCompletionLogprobs) {
      return Bad("logprobs",
                 absl::StrCat("must be in [0, ", kMaxCompletionLogprobs, "], got ", *logprobs));
    }
    r.sampling.set_logprobs(true);
    r.sampling.set_top_logprobs(static_cast<int32_t>(*logprobs));
  }
  RECALL_ASSIGN_OR_RETURN(const std::optional<bool> echo, Bool(o, "echo"));
  if (echo.value_or(false)) return Bad("echo", "is not supported");
  RECALL_ASSIGN_OR_RETURN(const std::optional<std::string> suffix, String(o, "suffix"));
  if (!suffix.value_or("").empty()) return Bad("suffix", "is not supported");
  RECALL_ASSIGN_OR_RETURN(const std::optional<int64_t> best_of, Integer(o, "best_of"));
  if (best_of.value_or(1) != 1) {
    return Bad("best_of", absl::StrCat("only 1 is supported, got ", *best_of));
  }
  RECALL_RETURN_IF_ERROR(ParseStream(o, &r.stream, &r.include_usage));
  return r;
}

}  // namespace recall::openai
