// Loads librecall_sentencepiece.so (see tokenizer_sentencepiece_processor.h).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "worker/tokenizer/tokenizer_sentencepiece_processor.h"

namespace recall::model::internal {
namespace {

using Factory = SentencePieceProcessor* (*)();
constexpr char kModuleName[] = "librecall_sentencepiece.so";

std::string ExecutableDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "" : exe.parent_path().string();
}

struct Module {
  Factory factory = nullptr;
  std::string error;
};

const Module& LoadModule() {
  static const Module* module = [] {
    auto* m = new Module();
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("RECALL_SENTENCEPIECE_MODULE"); env != nullptr && *env) {
      candidates.push_back(env);
    }
    // Beside the executable (installed: PREFIX/lib) before the build tree it was built in,
    // which an installed copy would otherwise load while that tree is there.
    candidates.push_back(ExecutableDir() + "/" + kModuleName);
    candidates.push_back(ExecutableDir() + "/../lib/" + kModuleName);
    candidates.push_back(std::string(RECALL_SENTENCEPIECE_MODULE_DIR) + "/" + kModuleName);
    std::string tried;
    for (const std::string& path : candidates) {
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) {
        tried += " " + path + " (missing)";
        continue;
      }
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle == nullptr) {
        tried += " " + path + " (" + dlerror() + ")";
        continue;
      }
      m->factory = reinterpret_cast<Factory>(dlsym(handle, "recall_new_sentencepiece_processor"));
      if (m->factory != nullptr) return m;
      tried += " " + path + " (no entry point)";
    }
    m->error = "cannot load the SentencePiece module; tried" + tried +
               "; set RECALL_SENTENCEPIECE_MODULE to its path";
    return m;
  }();
  return *module;
}

}  // namespace

std::unique_ptr<SentencePieceProcessor> NewSentencePieceProcessor(std::string* error) {
  const Module& m = LoadModule();
  if (m.factory == nullptr) {
    *error = m.error;
    return nullptr;
  }
  return std::unique_ptr<SentencePieceProcessor>(m.factory());
}

}  // namespace recall::model::internal
