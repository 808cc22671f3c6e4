// LoadTokenizer dispatch, TokenStreamDecoder, and the helpers in tokenizer_internal.h.
#include "worker/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/utf8.h"
#include "worker/tokenizer/tokenizer_internal.h"

namespace recall::model {
namespace internal {

absl::StatusOr<std::string> ReadFileBytes(const std::string& path) {
  if (absl::Status st = CheckRegularFile(path); !st.ok()) {
    return absl::IsNotFound(st)
               ? absl::NotFoundError(absl::StrCat("tokenizer file not found: ", path))
               : st;
  }
  // Read whole (and JSON copied again to parse): a file of gigabytes took the machine's memory.
  return ReadSmallFile("", path, size_t{256} << 20);  // the largest real ones are ~35 MB
}

std::vector<TextSegment> SplitOnLiterals(std::string_view text,
                                         const std::vector<std::string>& literals) {
  std::vector<TextSegment> segments;
  size_t start = 0;  // beginning of the pending plain text
  size_t pos = 0;
  while (pos < text.size()) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(literals.size()); ++i) {
      const std::string& lit = literals[i];
      if (!lit.empty() && text.substr(pos, lit.size()) == lit &&
          (best < 0 || lit.size() > literals[best].size())) {
        best = i;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    if (pos > start) segments.push_back({text.substr(start, pos - start), -1});
    segments.push_back({text.substr(pos, literals[best].size()), best});
    pos += literals[best].size();
    start = pos;
  }
  if (start < text.size()) segments.push_back({text.substr(start), -1});
  return segments;
}

}  // namespace internal

std::string TokenStreamDecoder::Next(int32_t id) {
  pending_ += tokenizer_.TokenBytes(prev_, id);
  prev_ = id;
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const utf8::Sequence seq = utf8::NextSequence(pending_, pos);
    if (seq.kind == utf8::SequenceKind::kIncomplete) break;  // wait for the next token
    if (seq.kind == utf8::SequenceKind::kValid) {
      out.append(pending_, pos, seq.length);
    } else {
      out.append(utf8::kReplacementChar);
    }
    pos += seq.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string TokenStreamDecoder::Flush() {
  std::string out = utf8::ToValidLossy(pending_);
  pending_.clear();
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path, int vocab_size) {
  namespace fs = std::filesystem;
  if (IsDirectory(path)) {
    const std::string json = (fs::path(path) / "tokenizer.json").string();
    if (Exists(json)) return LoadHfTokenizer(json);
    const std::string model = (fs::path(path) / "tokenizer.model").string();
    if (Exists(model)) return LoadSentencePieceTokenizer(model);
    return absl::NotFoundError(
        absl::StrCat(path, ": directory has neither tokenizer.json nor tokenizer.model"));
  }
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".model") return LoadSentencePieceTokenizer(path);
  if (ext == ".json") return LoadHfTokenizer(path);
  return LoadLlama2cTokenizer(path, vocab_size);
}

}  // namespace recall::model
