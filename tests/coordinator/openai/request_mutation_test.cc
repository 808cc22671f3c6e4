// The OpenAI request parsers over many broken bodies: valid requests with bytes changed and
// with values swapped for others of every JSON type and size (seeded, so a failure repeats).
// Every body is either accepted with its fields within the documented ranges, or refused as
// InvalidArgument with a message; none throws or crashes.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "coordinator/openai/request.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace recall::openai {
namespace {

using Json = nlohmann::json;

const char* const kChat = R"({"model":"m","session_id":"s","messages":[
  {"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"a"}]},
  {"role":"assistant","content":"b"},{"role":"user","content":"c"}],
  "temperature":0.5,"top_p":0.9,"max_tokens":7,"max_completion_tokens":9,"stop":["x"],
  "seed":3,"top_k":4,"repetition_penalty":1.1,"frequency_penalty":0.5,"presence_penalty":-1,
  "logit_bias":{"5":-100},"logprobs":true,"top_logprobs":2,"n":1,"stream":true,
  "stream_options":{"include_usage":true},"response_format":{"type":"text"},"tools":[]})";
const char* const kCompletion = R"({"model":"m","prompt":["Once"],"max_tokens":5,
  "temperature":0,"echo":false,"best_of":1,"logprobs":3,"suffix":"","stream":false,"seed":-2,
  "stop":"\n","frequency_penalty":2,"logit_bias":{"1":1}})";

// A value of any JSON type, often out of range or of the wrong kind.
Json AnyValue(std::mt19937& rng) {
  static const std::vector<Json> kValues = {nullptr,
                                            true,
                                            false,
                                            0,
                                            -1,
                                            1,
                                            2,
                                            21,
                                            1e20,
                                            -1e20,
                                            1e308,
                                            -0.0,
                                            0.5,
                                            3.5,
                                            -2.5,
                                            4294967296LL,
                                            -9223372036854775807LL - 1,
                                            18446744073709551615ULL,
                                            "",
                                            "x",
                                            std::string(300, 'y'),
                                            "\xc3\x28",
                                            Json::array(),
                                            Json::array({1, "a", nullptr}),
                                            Json::object(),
                                            Json{{"type", "text"}},
                                            Json{{"role", "user"}, {"content", 5}},
                                            Json::array({Json{{"role", "user"}, {"content", "z"}}}),
                                            Json{{"7", 101}}};
  return kValues[rng() % kValues.size()];
}

// Replaces one value somewhere in `j` (a random path through objects and arrays).
void SwapAValue(Json& j, std::mt19937& rng) {
  Json* at = &j;
  for (int depth = 0; depth < 4; ++depth) {
    if (at->is_object() && !at->empty() && rng() % 3 != 0) {
      auto it = at->begin();
      std::advance(it, rng() % at->size());
      at = &it.value();
    } else if (at->is_array() && !at->empty() && rng() % 3 != 0) {
      at = &(*at)[rng() % at->size()];
    } else {
      break;
    }
  }
  *at = AnyValue(rng);
}

// Changes, inserts or removes a few bytes (JSON's own characters and digits mostly).
std::string ChangeBytes(std::string s, std::mt19937& rng) {
  static const std::string kBytes = "{}[]\",:0123456789.-+eE \\ntfn\x80\xff";
  const int changes = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < changes && !s.empty(); ++i) {
    const size_t at = rng() % s.size();
    const char c = kBytes[rng() % kBytes.size()];
    switch (rng() % 3) {
      case 0:
        s[at] = c;
        break;
      case 1:
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), c);
        break;
      default:
        s.erase(at, 1);
    }
  }
  return s;
}

RequestLimits Limits() {
  RequestLimits l;
  l.max_message_bytes = 200;
  l.max_tokens = 512;
  return l;
}

// What an accepted request may hold (the ranges request.h documents).
void ExpectInRange(const v1::SamplingParams& s, const std::string& body) {
  if (s.has_temperature()) {
    EXPECT_TRUE(s.temperature() >= 0 && s.temperature() <= 2) << body;
  }
  if (s.has_top_p()) {
    EXPECT_TRUE(s.top_p() > 0 && s.top_p() <= 1) << body;
  }
  if (s.has_max_tokens()) {
    EXPECT_TRUE(s.max_tokens() >= 1 && s.max_tokens() <= 512) << body;
  }
  if (s.has_top_k()) {
    EXPECT_GE(s.top_k(), 0) << body;
  }
  if (s.has_frequency_penalty()) {
    EXPECT_LE(std::abs(s.frequency_penalty()), 2.0f) << body;
  }
  if (s.has_presence_penalty()) {
    EXPECT_LE(std::abs(s.presence_penalty()), 2.0f) << body;
  }
  if (s.has_top_logprobs()) {
    EXPECT_TRUE(s.top_logprobs() >= 0 && s.top_logprobs() <= 20) << body;
    EXPECT_TRUE(s.logprobs()) << body;
  }
  for (const auto& [token, bias] : s.logit_bias()) {
    EXPECT_GE(token, 0) << body;
    EXPECT_LE(std::abs(bias), 100.0f) << body;
  }
  EXPECT_LE(s.stop_size(), 4) << body;
}

void Check(const std::string& body, int* accepted, int* refused) {
  absl::StatusOr<ChatRequest> chat = ParseChatRequest(body, Limits());
  if (chat.ok()) {
    ++*accepted;
    ASSERT_FALSE(chat->messages.empty()) << body;
    EXPECT_EQ(chat->messages.back().role, "user") << body;
    ExpectInRange(chat->sampling, body);
  } else {
    ++*refused;
    EXPECT_EQ(chat.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_FALSE(chat.status().message().empty()) << body;
  }
  absl::StatusOr<CompletionRequest> completion = ParseCompletionRequest(body, Limits());
  if (completion.ok()) {
    EXPECT_FALSE(completion->prompt.empty()) << body;
    ExpectInRange(completion->sampling, body);
  } else {
    EXPECT_EQ(completion.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
}

TEST(RequestMutationTest, BrokenBodiesAreAcceptedWithinRangeOrRefusedAsInvalidArgument) {
  std::mt19937 rng(20261128);
  int accepted = 0, refused = 0;
  for (const char* base : {kChat, kCompletion}) {
    const Json valid = Json::parse(base);
    Check(valid.dump(), &accepted, &refused);
    for (int i = 0; i < 3000; ++i) {
      Json j = valid;
      const int swaps = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < swaps; ++k) SwapAValue(j, rng);
      Check(j.dump(-1, ' ', false, Json::error_handler_t::replace), &accepted, &refused);
      Check(ChangeBytes(valid.dump(), rng), &accepted, &refused);
    }
  }
  // Both outcomes were reached (the mutations are neither all harmless nor all fatal).
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 1000);
}

}  // namespace
}  // namespace recall::openai
