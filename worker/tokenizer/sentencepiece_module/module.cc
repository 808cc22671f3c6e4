// librecall_sentencepiece.so: the SentencePieceProcessor facade implemented on
// libsentencepiece. No Abseil header may be included here (see the facade's header).
#include <sentencepiece_processor.h>

#include <exception>
#include <mutex>
#include <string>

#include "worker/tokenizer/tokenizer_sentencepiece_processor.h"

// Exported by libsentencepiece (its logging.h is not installed): the least severity its LOG
// writes, 0 (INFO) to 3 (FATAL).
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace recall::model::internal {
namespace {

// libsentencepiece reports most bad models with a Status, but some throw: its trie builder
// (darts_clone) throws Darts::Details::Exception for a piece that is empty as a C string,
// e.g. "\0\0". An exception must not cross the module's C boundary (it would terminate the
// worker), so every call that parses or walks the model catches and reports it.
template <typename Call>
bool Guarded(std::string* error, Call call) {
  try {
    return call();
  } catch (const std::exception& e) {
    *error = std::string("libsentencepiece threw: ") + e.what();
  } catch (...) {
    *error = "libsentencepiece threw an unknown exception";
  }
  return false;
}

class LibraryProcessor final : public SentencePieceProcessor {
 public:
  bool LoadFromSerializedProto(const std::string& data, std::string* error) override {
    return Guarded(error, [&] { return Check(sp_.LoadFromSerializedProto(data), error); });
  }
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const override {
    return Guarded(error, [&] { return Check(sp_.Encode(text, ids), error); });
  }
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const override {
    return Guarded(error, [&] { return Check(sp_.Decode(ids, text), error); });
  }
  int GetPieceSize() const override { return sp_.GetPieceSize(); }
  std::string IdToPiece(int id) const override { return sp_.IdToPiece(id); }
  int PieceToId(std::string_view piece) const override { return sp_.PieceToId(piece); }
  bool IsControl(int id) const override { return sp_.IsControl(id); }
  bool IsByte(int id) const override { return sp_.IsByte(id); }
  bool IsUnknown(int id) const override { return sp_.IsUnknown(id); }
  int bos_id() const override { return sp_.bos_id(); }
  int eos_id() const override { return sp_.eos_id(); }

 private:
  static bool Check(const sentencepiece::util::Status& status, std::string* error) {
    if (!status.ok()) {
      // Its log is off (see the entry point below): not "See LOG(INFO)".
      *error = status.ToString();
      const std::string see = ". See LOG(INFO).";
      if (const size_t at = error->find(see); at != std::string::npos) {
        error->replace(at, see.size(), ": its self_test_data does not encode as it says");
      }
    }
    return status.ok();
  }
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace
}  // namespace recall::model::internal

// The module's one entry point (looked up with dlsym).
extern "C" __attribute__((visibility("default"))) recall::model::internal::SentencePieceProcessor*
recall_new_sentencepiece_processor() {
  // The library's LOG writes to std::cerr, which in this deep-bound module is libstdc++'s own
  // copy, never constructed where the executable holds its own (a copy relocation): a model
  // whose self-test failed (LOG(INFO)) crashed `recall generate`. Its log is off below FATAL
  // (once, before any processor exists: other threads' calls read the level); a call's
  // failure is still said by the Status it returns, without the log's detail (a failed
  // self-test's samples, and warnings).
  static std::once_flag quiet;
  std::call_once(quiet, [] { sentencepiece::logging::SetMinLogLevel(3); });
  return new recall::model::internal::LibraryProcessor();
}
