// The seed corpora of the loader fuzzers, one directory per fuzzer under the output folder
// (llama2c_model/, safetensors/, hf_config/, hf_index/, llama2c_tokenizer/, sentencepiece/,
// hf_tokenizer/). Synthetic seeds are small valid files written from code; shared seeds are
// derived at run time from the real files in shared/ (cut down where a whole file would make
// every execution slow) and are never copied into the source tree.
#pragma once

#include <string>

namespace recall::fuzz {

// Writes the synthetic seeds into out/<fuzzer>/.
void WriteSyntheticSeeds(const std::string& out);

// Writes the seeds derived from shared/ into out/<fuzzer>/; returns how many. A missing
// file is reported on stderr and skipped.
int WriteSharedSeeds(const std::string& shared_dir, const std::string& out);

// Helper: writes `bytes` to out/<fuzzer>/<name>.
void WriteSeed(const std::string& out, const std::string& fuzzer, const std::string& name,
               const std::string& bytes);

}  // namespace recall::fuzz
