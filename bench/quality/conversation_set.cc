#include "bench/quality/conversation_set.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace recall::bench {
namespace {

constexpr char kQuestionsHeader[] = "[Questions]";

void Append(std::vector<int32_t>& out, const std::vector<int32_t>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

// A string field of `j`; InvalidArgument naming the line and the field.
absl::StatusOr<std::string> StringField(const nlohmann::json& j, const char* field,
                                        const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field '", field, "' is missing or not a string"));
  }
  return it->get<std::string>();
}

}  // namespace

absl::StatusOr<std::vector<QaConversation>> LoadQaConversations(const std::string& path,
                                                                const model::Tokenizer& tokenizer,
                                                                int max_conversations,
                                                                int max_questions, int max_tokens) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open conversations file ", path));
  const std::optional<int32_t> nl = tokenizer.PieceToId("\n");
  if (!nl.has_value() || tokenizer.bos_id() < 0) {
    return absl::InvalidArgumentError(
        "the tokenizer needs a BOS token and a \"\\n\" piece (tools/train/train_tokenizer.py "
        "makes one)");
  }
  auto encode_line = [&](absl::string_view text, bool newline) {
    std::vector<int32_t> ids = tokenizer.Encode(std::string_view(text.data(), text.size()),
                                                /*add_bos=*/false, /*parse_special=*/false);
    if (newline) ids.push_back(*nl);
    return ids;
  };
  std::vector<QaConversation> out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    if (max_conversations > 0 && static_cast<int>(out.size()) == max_conversations) break;
    const std::string where = absl::StrCat(path, ":", line_no);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    QaConversation c;
    if (auto it = j.find("seed"); it != j.end() && it->is_number_unsigned()) {
      c.seed = it->get<uint64_t>();
    }
    auto text = StringField(j, "text", where);
    if (!text.ok()) return text.status();
    c.context.push_back(tokenizer.bos_id());
    absl::string_view body = *text;
    if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
    for (absl::string_view l : absl::StrSplit(body, '\n')) Append(c.context, encode_line(l, true));
    c.conversation_tokens = static_cast<int>(c.context.size());
    Append(c.context, encode_line(kQuestionsHeader, true));

    auto qs = j.find("questions");
    if (qs == j.end() || !qs->is_array() || qs->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field 'questions' is missing or not a non-empty array"));
    }
    size_t total = c.context.size();
    for (const nlohmann::json& qj : *qs) {
      if (max_questions > 0 && static_cast<int>(c.questions.size()) == max_questions) break;
      const std::string qwhere = absl::StrCat(where, " question ", c.questions.size());
      if (!qj.is_object()) return absl::InvalidArgumentError(qwhere + ": not an object");
      QaQuestion q;
      auto qt = StringField(qj, "q", qwhere);
      if (!qt.ok()) return qt.status();
      auto at = StringField(qj, "a", qwhere);
      if (!at.ok()) return at.status();
      if (at->empty()) return absl::InvalidArgumentError(qwhere + ": field 'a' is empty");
      q.q = *qt;
      q.a = *at;
      if (auto k = qj.find("kind"); k != qj.end() && k->is_string()) q.kind = k->get<std::string>();
      if (auto d = qj.find("distance_tokens"); d != qj.end() && d->is_number_integer()) {
        q.distance_tokens = d->get<int>();
      }
      q.ask = encode_line("Q: " + q.q, true);
      Append(q.ask, encode_line("A:", false));
      q.answer = encode_line(" " + q.a, true);
      total += q.ask.size() + q.answer.size();
      c.questions.push_back(std::move(q));
    }
    if (static_cast<int>(total) > max_tokens) {
      return absl::OutOfRangeError(absl::StrCat(where, ": the conversation and its questions are ",
                                                total, " tokens, over the model's context of ",
                                                max_tokens));
    }
    out.push_back(std::move(c));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no conversations"));
  return out;
}

std::vector<int32_t> QaSequence(const QaConversation& c, std::vector<int>* answer_starts) {
  std::vector<int32_t> s = c.context;
  answer_starts->clear();
  for (const QaQuestion& q : c.questions) {
    Append(s, q.ask);
    answer_starts->push_back(static_cast<int>(s.size()));
    Append(s, q.answer);
  }
  return s;
}

}  // namespace recall::bench
