#include "worker/tokenizer/tokenizer_hf_pretokenizer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace recall::model::hf {
namespace {

struct Segment {
  size_t start;
  size_t end;
  bool is_match;
};

// The segments covering `text`: the regex matches and the gaps between them.
std::vector<Segment> FindSegments(const Regex& regex, std::string_view text, bool invert) {
  std::vector<Segment> segments;
  size_t prev = 0;
  for (const auto& [start, end] : regex.FindAll(text)) {
    if (start > prev) segments.push_back({prev, start, invert});
    segments.push_back({start, end, !invert});
    prev = end;
  }
  if (prev < text.size()) segments.push_back({prev, text.size(), invert});
  return segments;
}

// Applies a split behavior the way the reference library's NormalizedString::split does.
std::vector<Segment> ApplyBehavior(std::vector<Segment> segments, SplitBehavior behavior) {
  std::vector<Segment> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return segments;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case SplitBehavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
  }
  return segments;
}

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("pre_tokenizer Split: unknown behavior \"", name, "\""));
}

absl::StatusOr<std::shared_ptr<const Regex>> CompileShared(std::string_view pattern, bool literal) {
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Regex> regex, Regex::Compile(pattern, literal));
  return std::shared_ptr<const Regex>(std::move(regex));
}

}  // namespace

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& json) {
  PreTokenizer pre;
  if (!json.is_null()) RECALL_RETURN_IF_ERROR(pre.AddStep(json));
  if (!pre.has_byte_level_) {
    return absl::InvalidArgumentError(
        "pre_tokenizer has no ByteLevel step: only byte-level BPE tokenizers are supported");
  }
  return pre;
}

absl::Status PreTokenizer::AddStep(const nlohmann::json& json) {
  const std::string type = json.value("type", "");
  if (type == "Sequence") {
    for (const nlohmann::json& child : json.at("pretokenizers")) {
      RECALL_RETURN_IF_ERROR(AddStep(child));
    }
    return absl::OkStatus();
  }
  if (has_byte_level_) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre_tokenizer: a ", type, " step after ByteLevel is not supported"));
  }
  Step step;
  if (type == "ByteLevel") {
    has_byte_level_ = true;
    step.add_prefix_space = json.value("add_prefix_space", false);
    if (json.value("use_regex", true)) {
      RECALL_ASSIGN_OR_RETURN(step.regex,
                              CompileShared(OnigurumaCompatiblePattern(kGpt2Pattern), false));
    }
  } else if (type == "Split") {
    const nlohmann::json& pattern = json.at("pattern");
    absl::StatusOr<std::shared_ptr<const Regex>> regex;
    if (pattern.contains("Regex")) {
      regex =
          CompileShared(OnigurumaCompatiblePattern(pattern.at("Regex").get<std::string>()), false);
    } else if (pattern.contains("String")) {
      regex = CompileShared(pattern.at("String").get<std::string>(), true);
    } else {
      return absl::InvalidArgumentError("pre_tokenizer Split: pattern is neither Regex nor String");
    }
    if (!regex.ok()) return Annotate(regex.status(), "pre_tokenizer Split pattern");
    step.regex = *std::move(regex);
    RECALL_ASSIGN_OR_RETURN(step.behavior, ParseBehavior(json.at("behavior").get<std::string>()));
    step.invert = json.value("invert", false);
  } else if (type == "Digits") {
    RECALL_ASSIGN_OR_RETURN(step.regex, CompileShared("\\p{N}", false));
    step.behavior = json.value("individual_digits", false) ? SplitBehavior::kIsolated
                                                           : SplitBehavior::kContiguous;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("pre_tokenizer type \"", type, "\" is not supported"));
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string>* words) const {
  std::vector<std::string> current;
  if (!text.empty()) current.emplace_back(text);
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string& piece : current) {
      if (step.add_prefix_space && piece[0] != ' ') piece.insert(piece.begin(), ' ');
      if (step.regex == nullptr) {
        next.push_back(std::move(piece));
        continue;
      }
      for (const Segment& s :
           ApplyBehavior(FindSegments(*step.regex, piece, step.invert), step.behavior)) {
        if (s.end > s.start) next.emplace_back(piece, s.start, s.end - s.start);
      }
    }
    current.swap(next);
  }
  for (std::string& word : current) words->push_back(std::move(word));
}

}  // namespace recall::model::hf
