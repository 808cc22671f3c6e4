// Safetensors reader: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the tensor data (offsets relative to the end of the header). The file is mapped
// read-only; tensor data pointers point into the mapping. F32, F16 and BF16 are supported.
// Every error names the file and, where there is one, the tensor.
// Thread safety: immutable after Open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/model/model.h"

namespace recall::model {

struct SafetensorsTensor {
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the mapping; may be unaligned for the dtype
  size_t bytes = 0;

  int64_t numel() const;
  std::string ShapeString() const;  // "[2, 3]"
};

class SafetensorsFile {
 public:
  // Maps and parses `path`. NotFound if it does not exist; DataLoss for a truncated file;
  // InvalidArgument for a malformed header, unsupported dtype or inconsistent tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsTensor* Find(const std::string& name) const;

  // Hands over the mapping (tensor pointers stay valid while the returned Storage lives).
  std::unique_ptr<Storage> ReleaseStorage() { return std::move(storage_); }

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::unique_ptr<Storage> storage_;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace recall::model
