// SentencePiece tokenizer.model through libsentencepiece: a thin wrapper.
//
// Encode and Decode are SentencePieceProcessor's (Decode drops control tokens such as
// BOS/EOS whatever skip_special says, as the library does). Extension: with parse_special,
// the literal text of the BOS and EOS pieces ("<s>", "</s>") becomes those ids and the text
// between them is encoded segment by segment (as Meta's Llama 2 chat code encodes turns).
// TokenBytes follows llama2.c's run.c: "▁" is a space, a leading space is dropped only
// after BOS, byte pieces "<0xHH>" are that byte, control tokens are empty.
// end_ids(): the SentencePiece EOS and, in a Hugging Face model directory, every id of the
// eos_token_id of generation_config.json (else config.json) beside the file, as for
// tokenizer.json (tokenizer_eos_ids.h).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_eos_ids.h"
#include "worker/tokenizer/tokenizer_internal.h"
#include "worker/tokenizer/tokenizer_sentencepiece_charsmap.h"
#include "worker/tokenizer/tokenizer_sentencepiece_processor.h"

namespace recall::model {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 "▁"

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<internal::SentencePieceProcessor> sp)
      : sp_(std::move(sp)) {
    if (bos_id() >= 0) specials_.push_back({sp_->IdToPiece(bos_id()), bos_id()});
    if (eos_id() >= 0) specials_.push_back({sp_->IdToPiece(eos_id()), eos_id()});
    for (const auto& [piece, id] : specials_) literals_.push_back(piece);
  }

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const override {
    std::vector<int32_t> ids;
    if (add_bos && bos_id() >= 0) ids.push_back(bos_id());
    if (!parse_special) {
      EncodeSegment(text, &ids);
      return ids;
    }
    for (const internal::TextSegment& seg : internal::SplitOnLiterals(text, literals_)) {
      if (seg.special_index >= 0) {
        ids.push_back(specials_[seg.special_index].second);
      } else {
        EncodeSegment(seg.text, &ids);
      }
    }
    return ids;
  }

  std::string Decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<int> valid;
    valid.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size()) valid.push_back(id);
    }
    std::string out, error;
    if (!sp_->Decode(valid, &out, &error)) return "";
    return out;
  }

  std::string TokenBytes(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size() || sp_->IsControl(id)) return "";
    std::string piece = sp_->IdToPiece(id);
    if (sp_->IsByte(id) && piece.size() == 6) {
      return std::string(1,
                         static_cast<char>(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16)));
    }
    if (sp_->IsUnknown(id)) piece = " \xE2\x81\x87 ";  // the library's unknown surface " ⁇ "
    std::string out;
    for (size_t pos = 0; pos < piece.size();) {
      if (piece.compare(pos, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
        out.push_back(' ');
        pos += kSpaceSymbol.size();
      } else {
        out.push_back(piece[pos++]);
      }
    }
    if (prev >= 0 && prev == bos_id() && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

  int vocab_size() const override { return sp_->GetPieceSize(); }
  int32_t bos_id() const override { return sp_->bos_id(); }
  int32_t eos_id() const override { return sp_->eos_id(); }
  std::vector<int32_t> end_ids() const override { return end_ids_; }

  // eos_id() (if any), then each of `model_ids` not already there.
  void set_end_ids(const std::vector<int32_t>& model_ids) {
    end_ids_ = Tokenizer::end_ids();
    for (int32_t id : model_ids) {
      if (std::find(end_ids_.begin(), end_ids_.end(), id) == end_ids_.end()) end_ids_.push_back(id);
    }
  }

  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    const int id = sp_->PieceToId(piece);
    if (id < 0 || (sp_->IsUnknown(id) && sp_->IdToPiece(id) != piece)) return std::nullopt;
    return id;
  }

 private:
  void EncodeSegment(std::string_view text, std::vector<int32_t>* out) const {
    std::vector<int> ids;
    std::string error;
    if (!sp_->Encode(text, &ids, &error)) return;
    out->insert(out->end(), ids.begin(), ids.end());
  }

  std::unique_ptr<internal::SentencePieceProcessor> sp_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // literal piece -> id
  std::vector<std::string> literals_;
  std::vector<int32_t> end_ids_;  // each below vocab_size()
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path) {
  // Read the file ourselves for uniform NotFound/IO errors; the library parses the proto.
  RECALL_ASSIGN_OR_RETURN(const std::string data, internal::ReadFileBytes(path));
  if (absl::Status st = internal::CheckCharsMaps(data); !st.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a valid SentencePiece model (", st.message(), ")"));
  }
  std::string error;
  std::unique_ptr<internal::SentencePieceProcessor> sp =
      internal::NewSentencePieceProcessor(&error);
  if (sp == nullptr) return absl::FailedPreconditionError(absl::StrCat(path, ": ", error));
  if (!sp->LoadFromSerializedProto(data, &error)) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a valid SentencePiece model (", error, ")"));
  }
  auto tok = std::make_unique<SentencePieceTokenizer>(std::move(sp));
  RECALL_ASSIGN_OR_RETURN(
      const std::vector<int32_t> model_eos,
      hf::ReadModelEosIds(std::filesystem::path(path).parent_path().string(), tok->vocab_size()));
  tok->set_end_ids(model_eos);
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace recall::model
