// Hugging Face tokenizer.json, byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM style).
//
// Encode, as the reference `tokenizers` library does with add_special_tokens=false:
//   1. split the text around added tokens (tokenizer_hf_added.h);
//   2. pre-tokenize each remaining piece (tokenizer_hf_pretokenizer.h);
//   3. BPE each word from its raw bytes (tokenizer_hf_bpe.h).
// With add_bos, the ids the post_processor's TemplateProcessing puts before $A are added
// (a suffix such as an EOS is not: a prompt must not end a sequence); bos_id() is the first
// of them, -1 when the post_processor adds none (SmolLM2, GPT-2).
// Decode joins every token's ByteLevel-decoded bytes (added tokens included, as there) and
// replaces ill-formed UTF-8 by U+FFFD; a leading BOS is dropped, special added tokens too
// with skip_special.
// eos_id() is not in tokenizer.json: it is read from generation_config.json, config.json
// ("eos_token_id") or tokenizer_config.json ("eos_token") beside it, in that order.
// Normalizers: none or NFC (tokenizer_nfc.h); Decode does not undo NFC.
#include <algorithm>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json_limits.h"
#include "common/status.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_eos_ids.h"
#include "worker/tokenizer/tokenizer_hf_added.h"
#include "worker/tokenizer/tokenizer_hf_bpe.h"
#include "worker/tokenizer/tokenizer_hf_pretokenizer.h"
#include "worker/tokenizer/tokenizer_internal.h"
#include "worker/tokenizer/tokenizer_nfc.h"

namespace recall::model {
namespace {

using nlohmann::json;

constexpr int64_t kMaxVocab = int64_t{1} << 24;  // as ModelConfig's limit

// Supported normalizers: none, NFC, or a Sequence of those; *nfc says whether NFC applies.
absl::Status ParseNormalizer(const json& n, bool* nfc) {
  if (n.is_null()) return absl::OkStatus();
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    *nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    for (const json& child : n.at("normalizers")) {
      RECALL_RETURN_IF_ERROR(ParseNormalizer(child, nfc));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("normalizer \"", type, "\" is not supported"));
}

absl::Status CheckDecoder(const json& d) {
  const std::string type = d.is_null() ? "null" : d.value("type", "");
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence" && !d.at("decoders").empty()) {
    for (const json& child : d.at("decoders")) RECALL_RETURN_IF_ERROR(CheckDecoder(child));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("decoder \"", type, "\" is not supported (only ByteLevel)"));
}

// The ids a post_processor puts before the sequence ($A) of a single input.
absl::Status PrefixIds(const json& p, std::vector<int32_t>* prefix) {
  if (p.is_null()) return absl::OkStatus();
  const std::string type = p.value("type", "");
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    for (const json& child : p.at("processors")) RECALL_RETURN_IF_ERROR(PrefixIds(child, prefix));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::InvalidArgumentError(
        absl::StrCat("post_processor \"", type, "\" is not supported"));
  }
  for (const json& item : p.at("single")) {
    if (item.contains("Sequence")) break;
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    const json& special = p.at("special_tokens").at(name);
    for (const json& id : special.at("ids")) {
      RECALL_ASSIGN_OR_RETURN(const int32_t v,
                              hf::TokenIdFromJson(id, "post_processor.special_tokens id"));
      prefix->push_back(v);
    }
  }
  return absl::OkStatus();
}

// The EOS ids named by the model files beside tokenizer.json (the first is eos_id()):
// generation_config.json's or config.json's eos_token_id (ReadModelEosIds: an invalid one is
// an error), else tokenizer_config.json's eos_token; empty if none.
absl::StatusOr<std::vector<int32_t>> SiblingEosIds(const std::string& tokenizer_path,
                                                   const Tokenizer& tokenizer) {
  const std::filesystem::path dir = std::filesystem::path(tokenizer_path).parent_path();
  RECALL_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                          hf::ReadModelEosIds(dir.string(), tokenizer.vocab_size()));
  if (!ids.empty()) return ids;
  absl::StatusOr<std::string> text =
      internal::ReadFileBytes((dir / "tokenizer_config.json").string());
  if (text.ok() && json_limits::CheckJsonDepth(*text).ok()) {
    const json config = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_object() && config.contains("eos_token")) {
      const json& eos = config["eos_token"];
      std::string piece;
      if (eos.is_string()) piece = eos.get<std::string>();
      if (eos.is_object() && eos.contains("content") && eos["content"].is_string()) {
        piece = eos["content"].get<std::string>();
      }
      if (auto id = tokenizer.PieceToId(piece); id.has_value()) return std::vector<int32_t>{*id};
    }
  }
  return std::vector<int32_t>{};
}

class HfTokenizer final : public Tokenizer {
 public:
  // `max_vocab` bounds the ids (the id table is allocated from the largest one).
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(const json& root, int64_t max_vocab);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids = prefix_ids_;
    std::vector<hf::AddedTokenMatcher::Piece> raw_pieces, pieces;
    raw_matcher_.Split(text, parse_special, &raw_pieces);
    std::vector<std::string> words;
    for (const auto& raw : raw_pieces) {
      if (raw.id >= 0) {
        ids.push_back(raw.id);
        continue;
      }
      pieces.clear();
      std::string normalized;
      std::string_view text_view = raw.text;
      if (nfc_) {
        normalized = ToNfc(raw.text);
        text_view = normalized;
      }
      normalized_matcher_.Split(text_view, parse_special, &pieces);
      for (const auto& piece : pieces) {
        if (piece.id >= 0) {
          ids.push_back(piece.id);
          continue;
        }
        words.clear();
        pre_tokenizer_.Split(piece.text, &words);
        for (const std::string& word : words) bpe_->Tokenize(word, &ids);
      }
    }
    return ids;
  }

  std::string Decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string bytes;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= vocab_size()) continue;
      if (i == 0 && id == bos_id_) continue;
      if (skip_special && special_[id]) continue;
      bytes += decoded_[id];
    }
    return utf8::ToValidLossy(bytes);
  }

  std::string TokenBytes(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    if (prev < 0 && id == bos_id_) return "";
    return decoded_[id];
  }

  int vocab_size() const override { return static_cast<int>(decoded_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_ids_.empty() ? -1 : eos_ids_[0]; }
  std::vector<int32_t> end_ids() const override { return eos_ids_; }

  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    if (auto it = added_.find(piece); it != added_.end()) return it->second;
    if (auto it = bpe_->vocab().find(piece); it != bpe_->vocab().end()) return it->second;
    return std::nullopt;
  }

  void set_eos_ids(std::vector<int32_t> ids) { eos_ids_ = std::move(ids); }

 private:
  std::unique_ptr<hf::BpeModel> bpe_;
  hf::PreTokenizer pre_tokenizer_;
  hf::AddedTokenMatcher raw_matcher_;         // added tokens with normalized=false
  hf::AddedTokenMatcher normalized_matcher_;  // added tokens with normalized=true
  std::vector<std::string> decoded_;          // id -> bytes the ByteLevel decoder gives
  std::vector<bool> special_;                 // id -> is a special added token
  hf::StringIdMap added_;                     // added token content -> id
  std::vector<int32_t> prefix_ids_;
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;  // each below vocab_size()
  bool nfc_ = false;  // normalizer: NFC
};

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(const json& root,
                                                                   int64_t max_vocab) {
  auto tok = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  RECALL_RETURN_IF_ERROR(ParseNormalizer(root.value("normalizer", json()), &tok->nfc_));
  RECALL_RETURN_IF_ERROR(CheckDecoder(root.value("decoder", json())));
  RECALL_ASSIGN_OR_RETURN(tok->pre_tokenizer_,
                          hf::PreTokenizer::FromJson(root.value("pre_tokenizer", json())));
  RECALL_ASSIGN_OR_RETURN(tok->bpe_, hf::BpeModel::FromJson(root.at("model")));

  std::vector<hf::AddedToken> raw_tokens, normalized_tokens;
  int32_t max_id = -1;
  for (const auto& [token, id] : tok->bpe_->vocab()) max_id = std::max(max_id, id);
  const json added = root.value("added_tokens", json::array());
  for (const json& a : added) {
    hf::AddedToken t;
    RECALL_ASSIGN_OR_RETURN(t.id, hf::TokenIdFromJson(a.at("id"), "added_tokens id"));
    t.content = a.at("content").get<std::string>();
    t.special = a.value("special", false);
    t.single_word = a.value("single_word", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.normalized = a.value("normalized", false);
    if (t.id < 0) return absl::InvalidArgumentError("added_tokens: negative id");
    max_id = std::max(max_id, t.id);
    tok->added_.emplace(t.content, t.id);
    (t.normalized ? normalized_tokens : raw_tokens).push_back(std::move(t));
  }
  if (max_id < 0) return absl::InvalidArgumentError("model.vocab and added_tokens are empty");
  if (max_id >= max_vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", max_id, " is out of range: ids must be below ", max_vocab,
                     " (the smaller of 2^24 and the file's size; a vocabulary's ids are dense)"));
  }
  tok->decoded_.resize(max_id + 1);
  tok->special_.assign(max_id + 1, false);
  for (const auto& [token, id] : tok->bpe_->vocab()) {
    tok->decoded_[id] = hf::ByteLevelDecodeToken(token);
  }
  for (const auto* list : {&raw_tokens, &normalized_tokens}) {
    for (const hf::AddedToken& t : *list) {
      tok->decoded_[t.id] = hf::ByteLevelDecodeToken(t.content);
      tok->special_[t.id] = t.special;
    }
  }
  RECALL_ASSIGN_OR_RETURN(tok->raw_matcher_, hf::AddedTokenMatcher::Create(std::move(raw_tokens)));
  RECALL_ASSIGN_OR_RETURN(tok->normalized_matcher_,
                          hf::AddedTokenMatcher::Create(std::move(normalized_tokens)));

  RECALL_RETURN_IF_ERROR(PrefixIds(root.value("post_processor", json()), &tok->prefix_ids_));
  for (int32_t id : tok->prefix_ids_) {
    if (id < 0 || id > max_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("post_processor: special token id ", id, " is out of the vocabulary"));
    }
  }
  if (!tok->prefix_ids_.empty()) tok->bos_id_ = tok->prefix_ids_.front();
  return tok;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& tokenizer_json) {
  RECALL_ASSIGN_OR_RETURN(const std::string text, internal::ReadFileBytes(tokenizer_json));
  if (absl::Status s = json_limits::CheckJsonFile(text); !s.ok()) {
    return Annotate(s, tokenizer_json);
  }
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok;
  try {
    const json root = json::parse(text);
    if (!root.is_object()) {
      return absl::DataLossError(absl::StrCat(tokenizer_json, ": not a JSON object"));
    }
    tok = HfTokenizer::FromJson(root, std::min<int64_t>(kMaxVocab, text.size()));
  } catch (const json::parse_error& e) {
    return absl::DataLossError(absl::StrCat(tokenizer_json, ": not valid JSON (", e.what(), ")"));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(tokenizer_json, ": malformed tokenizer.json (", e.what(), ")"));
  }
  if (!tok.ok()) return Annotate(tok.status(), tokenizer_json);
  RECALL_ASSIGN_OR_RETURN(std::vector<int32_t> eos_ids, SiblingEosIds(tokenizer_json, **tok));
  (*tok)->set_eos_ids(std::move(eos_ids));
  return std::unique_ptr<Tokenizer>(*std::move(tok));
}

}  // namespace recall::model
