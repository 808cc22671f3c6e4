#include "worker/tokenizer/tokenizer_hf_bpe.h"

#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"

namespace recall::model::hf {
namespace {

struct ByteTables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code point -> byte, -1 if not in the alphabet
  ByteTables() {
    from_cp.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables* tables = new ByteTables();
  return *tables;
}

}  // namespace

char32_t ByteToCodePoint(uint8_t byte) { return Tables().to_cp[byte]; }

bool ByteLevelToBytes(std::string_view token, std::string* bytes) {
  bytes->clear();
  size_t pos = 0;
  while (pos < token.size()) {
    const int32_t cp = utf8::DecodeCodePoint(token, &pos);
    if (cp < 0 || cp >= static_cast<int32_t>(Tables().from_cp.size()) || Tables().from_cp[cp] < 0) {
      return false;
    }
    bytes->push_back(static_cast<char>(Tables().from_cp[cp]));
  }
  return true;
}

std::string ByteLevelDecodeToken(std::string_view token) {
  std::string bytes;
  if (ByteLevelToBytes(token, &bytes)) return bytes;
  return std::string(token);
}

absl::StatusOr<int32_t> TokenIdFromJson(const nlohmann::json& j, absl::string_view what) {
  if (!j.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not an integer"));
  }
  const bool fits = j.is_number_unsigned()
                        ? j.get<uint64_t>() <= uint64_t{INT32_MAX}
                        : j.get<int64_t>() >= 0 && j.get<int64_t>() <= int64_t{INT32_MAX};
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", j.dump(), ", not in [0, 2^31)"));
  }
  return static_cast<int32_t>(j.get<int64_t>());
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& model) {
  auto model_ptr = std::unique_ptr<BpeModel>(new BpeModel());
  BpeModel& m = *model_ptr;
  if (model.contains("type") && model.at("type") != "BPE") {
    return absl::InvalidArgumentError(
        absl::StrCat("model type ", model.at("type").dump(), " is not supported (only BPE)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "") {
      return absl::InvalidArgumentError(absl::StrCat("model.", key, " is not supported"));
    }
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      model.at("dropout").get<double>() > 0) {
    return absl::InvalidArgumentError("model.dropout is not supported");
  }
  m.ignore_merges_ = model.value("ignore_merges", false);

  const nlohmann::json& vocab = model.at("vocab");
  if (!vocab.is_object()) return absl::InvalidArgumentError("model.vocab is not an object");
  m.vocab_.reserve(vocab.size());
  m.bytes_to_id_.reserve(vocab.size());
  m.byte_id_.fill(-1);
  std::string bytes;
  for (const auto& [token, id_json] : vocab.items()) {
    RECALL_ASSIGN_OR_RETURN(
        const int32_t id, TokenIdFromJson(id_json, absl::StrCat("model.vocab: the id of ", token)));
    m.vocab_.emplace(token, id);
    if (ByteLevelToBytes(token, &bytes)) {
      if (bytes.size() == 1) m.byte_id_[static_cast<uint8_t>(bytes[0])] = id;
      m.bytes_to_id_.emplace(bytes, id);
    }
  }
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    auto it = m.vocab_.find(model.at("unk_token").get<std::string>());
    if (it != m.vocab_.end()) m.unk_id_ = it->second;
  }

  const nlohmann::json& merges = model.at("merges");
  if (!merges.is_array()) return absl::InvalidArgumentError("model.merges is not an array");
  m.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const nlohmann::json& merge = merges[rank];
    std::string a, b;
    if (merge.is_string()) {  // "a b"
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.merges[", rank, "] \"", line, "\" is not two tokens"));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {  // ["a", "b"]
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("model.merges[", rank, "] is malformed"));
    }
    auto ia = m.vocab_.find(a);
    auto ib = m.vocab_.find(b);
    auto in = m.vocab_.find(a + b);
    if (ia == m.vocab_.end() || ib == m.vocab_.end() || in == m.vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model.merges[", rank, "] (\"", a, "\", \"", b,
                                                     "\") uses a token not in the vocab"));
    }
    m.merges_[PairKey(ia->second, ib->second)] = {static_cast<int32_t>(rank), in->second};
  }
  return model_ptr;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = bytes_to_id_.find(word); it != bytes_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(std::string(word)); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> result;
  Merge(word, &result);
  ids->insert(ids->end(), result.begin(), result.end());
  if (cacheable) {
    absl::MutexLock lock(&mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(result));
  }
}

// The reference library's Word::merge_all: a heap of (rank, position) candidates, stale
// entries skipped when popped.
void BpeModel::Merge(std::string_view word, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (unsigned char c : word) {
    int32_t id = byte_id_[c];
    if (id < 0) id = unk_id_;
    if (id < 0) continue;  // no token for this byte and no unk: dropped, as the reference
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const {  // top(): lowest rank, then leftmost
      if (rank != o.rank) return rank > o.rank;
      return pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto lookup = [&](int left, int right) -> const MergeInfo* {
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) {
    if (const MergeInfo* m = lookup(i, i + 1)) queue.push({m->rank, i, m->new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const int right_pos = left.next;
    const MergeInfo* m = lookup(top.pos, right_pos);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    Symbol& right = symbols[right_pos];
    left.id = top.new_id;
    left.next = right.next;
    right.alive = false;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeInfo* pm = lookup(left.prev, top.pos)) {
        queue.push({pm->rank, left.prev, pm->new_id});
      }
    }
    if (left.next >= 0) {
      if (const MergeInfo* nm = lookup(top.pos, left.next)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (int i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace recall::model::hf
