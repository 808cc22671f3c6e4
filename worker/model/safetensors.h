// Safetensors reader: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the tensor data (offsets relative to the end of the header). The file is mapped
// read-only; tensor data pointers point into the mapping. F32, F16 and BF16 are supported,
// and F8_E4M3 (FP8 checkpoints' linear weights; the loader widens them with their scales).
// Checked before any tensor is used: the header length against the file, the header is a
// JSON object (at most json_limits::kMaxDepth deep), every dtype, shape product (no
// overflow) and data_offsets range; each tensor starts at a multiple of its element size,
// and the tensors tile the data section exactly (no overlap, no hole, nothing after the
// last one), so a header length that is off by a byte is an error, not shifted weights.
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
  // F8_E4M3 (E4M3FN bytes): dtype is then kI8, standing for the 1-byte size only; the bytes
  // are not integers and only the FP8 loader (worker/model/fp8.h) reads them.
  bool e4m3 = false;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the mapping; may be unaligned for the dtype
  size_t bytes = 0;

  int64_t numel() const;
  std::string ShapeString() const;  // "[2, 3]"
};

class SafetensorsFile {
 public:
  // Maps and parses `path`. NotFound if it does not exist; DataLoss for a truncated file or
  // a data section the tensors do not end exactly at; InvalidArgument for a malformed
  // header, unsupported dtype or inconsistent, overlapping or misaligned tensor.
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
