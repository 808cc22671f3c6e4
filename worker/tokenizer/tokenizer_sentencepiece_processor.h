// A std-only facade over sentencepiece::SentencePieceProcessor, loaded from a separate
// module (librecall_sentencepiece.so) with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a module: Debian's libsentencepiece carries its own copy of protobuf-lite and exports
// its symbols. Linked into a binary that also uses libprotobuf (gRPC), the two copies
// interpose each other and the process crashes during static initialisation. Loaded
// locally and deep-bound, the library keeps its protobuf to itself.
//
// sentencepiece_processor.h also declares `namespace absl { using std::string_view; }`, which
// clashes with Debian's Abseil; only the module's source includes it.
// Thread safety: const methods are safe to call concurrently (as the library's).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace recall::model::internal {

class SentencePieceProcessor {
 public:
  virtual ~SentencePieceProcessor() = default;

  // Parses a serialized ModelProto; false with the library's message in *error.
  virtual bool LoadFromSerializedProto(const std::string& data, std::string* error) = 0;

  // False with *error on failure.
  virtual bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const = 0;
  virtual bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const = 0;

  virtual int GetPieceSize() const = 0;
  virtual std::string IdToPiece(int id) const = 0;
  virtual int PieceToId(std::string_view piece) const = 0;
  virtual bool IsControl(int id) const = 0;
  virtual bool IsByte(int id) const = 0;
  virtual bool IsUnknown(int id) const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
};

// A new processor from the module, or null with *error saying why the module could not be
// loaded. The module is looked for at $RECALL_SENTENCEPIECE_MODULE, where the build put it,
// and beside the running executable.
std::unique_ptr<SentencePieceProcessor> NewSentencePieceProcessor(std::string* error);

}  // namespace recall::model::internal
