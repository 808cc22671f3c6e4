#include "worker/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_limits.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/model/file_storage.h"

namespace recall::model {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit is 100 MB

absl::Status TensorError(const std::string& path, const std::string& name,
                         const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name, "\": ", problem));
}

absl::Status ParseDType(const std::string& s, SafetensorsTensor& t) {
  if (s == "F32") {
    t.dtype = kernels::DType::kF32;
  } else if (s == "F16") {
    t.dtype = kernels::DType::kF16;
  } else if (s == "BF16") {
    t.dtype = kernels::DType::kBF16;
  } else if (s == "F8_E4M3") {
    t.dtype = kernels::DType::kI8;
    t.e4m3 = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype \"", s, "\" (supported: F32, F16, BF16, F8_E4M3)"));
  }
  return absl::OkStatus();
}

const char* StoredName(const SafetensorsTensor& t) {
  return t.e4m3 ? "F8_E4M3" : kernels::DTypeName(t.dtype);
}

// Reads a non-negative JSON integer that fits in uint64.
bool GetUint(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

absl::StatusOr<SafetensorsTensor> ParseTensor(const std::string& path, const std::string& name,
                                              const json& entry, const char* data_base,
                                              uint64_t data_size) {
  if (!entry.is_object()) return TensorError(path, name, "entry is not a JSON object");
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return TensorError(path, name, "missing string field \"dtype\"");
  }
  SafetensorsTensor t;
  if (absl::Status s = ParseDType(dtype_it->get<std::string>(), t); !s.ok()) {
    return TensorError(path, name, std::string(s.message()));
  }
  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return TensorError(path, name, "missing array field \"shape\"");
  }
  // numel with overflow checks: each dim and the product must stay below 2^62.
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  uint64_t numel = 1;
  for (const json& d : *shape_it) {
    uint64_t v;
    if (!GetUint(d, &v) || v >= kLimit) {
      return TensorError(path, name,
                         absl::StrCat("shape entry ", d.dump(), " is not a non-negative integer"));
    }
    if (v != 0 && numel > kLimit / v) return TensorError(path, name, "shape product overflows");
    numel *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  auto off_it = entry.find("data_offsets");
  uint64_t begin = 0, end = 0;
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !GetUint((*off_it)[0], &begin) || !GetUint((*off_it)[1], &end)) {
    return TensorError(path, name, "\"data_offsets\" must be [begin, end] non-negative integers");
  }
  if (begin > end) {
    return TensorError(path, name,
                       absl::StrCat("data_offsets [", begin, ", ", end, "]: begin > end"));
  }
  if (end > data_size) {
    return TensorError(
        path, name,
        absl::StrCat("data_offsets [", begin, ", ", end, "] run past the end of the data section (",
                     data_size, " bytes)"));
  }
  const uint64_t expected = numel * kernels::DTypeSize(t.dtype);
  if (end - begin != expected) {
    return TensorError(
        path, name,
        absl::StrCat("shape ", t.ShapeString(), " of ", StoredName(t), " needs ", expected,
                     " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin));
  }
  if (begin % kernels::DTypeSize(t.dtype) != 0) {
    return TensorError(path, name,
                       absl::StrCat("data_offsets begin ", begin, " is not a multiple of the ",
                                    kernels::DTypeSize(t.dtype), "-byte ", StoredName(t),
                                    " element (misaligned)"));
  }
  t.data = data_base + begin;
  t.bytes = static_cast<size_t>(expected);
  return t;
}

// The tensors must tile the data section: sorted by offset, each begins where the previous
// one ends (no overlap, no hole), and the last ends where the file ends. A header length
// field that is off by a few bytes (the JSON still parsing thanks to its space padding)
// shifts the data section and is caught here, instead of loading every weight misaligned.
absl::Status CheckLayout(const std::string& path,
                         const std::map<std::string, SafetensorsTensor>& tensors,
                         const char* data_base, uint64_t data_size, uint64_t header_len) {
  std::vector<std::tuple<uint64_t, uint64_t, std::string_view>> spans;  // begin, end, name
  spans.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const uint64_t begin = static_cast<uint64_t>(static_cast<const char*>(t.data) - data_base);
    spans.emplace_back(begin, begin + t.bytes, name);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0;  // the data section is tiled up to here
  std::string_view previous;
  for (const auto& [begin, end, name] : spans) {
    if (begin < covered) {
      return TensorError(path, std::string(name),
                         absl::StrCat("data_offsets [", begin, ", ", end, "] overlap tensor \"",
                                      std::string(previous), "\", which ends at ", covered));
    }
    if (begin > covered) {
      return TensorError(
          path, std::string(name),
          absl::StrCat("data_offsets [", begin, ", ", end, "] leave bytes [", covered, ", ", begin,
                       ") of the data section to no tensor (a hole)"));
    }
    covered = end;
    previous = name;
  }
  if (covered != data_size) {
    return absl::DataLossError(absl::StrCat(
        path, ": the tensors end at byte ", covered, " of the data section but the file holds ",
        data_size, " bytes after the ", header_len,
        "-byte header: the header must end exactly where the data begins (is the header "
        "length field wrong?)"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsTensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

const SafetensorsTensor* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage, MapFile(path));
  const uint64_t file_size = storage->size();
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated safetensors file: ", file_size,
                                            " bytes, shorter than the 8-byte header length"));
  }
  const char* base = static_cast<const char*>(storage->data());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(base[i]);
  if (header_len > file_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": safetensors header length ", header_len,
                                            " exceeds the ", file_size - 8,
                                            " bytes after the length field"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": safetensors header length ", header_len,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  const char* data_base = base + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  if (header_len < 2 || base[8] != '{') {
    return absl::InvalidArgumentError(absl::StrCat(path, ": safetensors header (", header_len,
                                                   " bytes) does not start with '{'"));
  }
  const std::string_view header_text(base + 8, header_len);
  if (absl::Status s = json_limits::CheckJsonDepth(header_text); !s.ok()) {
    return Annotate(s, absl::StrCat(path, ": safetensors header"));
  }

  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  json header;
  try {
    header = json::parse(header_text.begin(), header_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": safetensors header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": safetensors header is not a JSON object"));
  }
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": \"__metadata__\" is not a JSON object"));
        }
        for (const auto& [key, value] : entry.items()) {
          file->metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
        }
        continue;
      }
      RECALL_ASSIGN_OR_RETURN(SafetensorsTensor t,
                              ParseTensor(path, name, entry, data_base, data_size));
      file->tensors_.emplace(name, std::move(t));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": malformed safetensors header: ", e.what()));
  }
  RECALL_RETURN_IF_ERROR(CheckLayout(path, file->tensors_, data_base, data_size, header_len));
  file->storage_ = std::move(storage);
  return file;
}

}  // namespace recall::model
