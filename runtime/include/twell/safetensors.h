// A reader for safetensors files (https://huggingface.co/docs/safetensors: an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw data), built on
// nlohmann-json. Used by twellc and the tests to load real weights and activations.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "twell/spec.h"

namespace twell {

struct TensorView {
  std::string dtype;            // safetensors dtype string: "BF16", "F16", "F32", "I32", "I16", ...
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;  // row-major bytes inside the SafeTensors that returned this view
  uint64_t offset = 0;            // of data from the start of the file
  int64_t elements() const;
};

class SafeTensors {
 public:
  // Reads and validates the whole file: header length within the file, JSON well formed, every
  // tensor's dtype known, offsets in range and matching dtype size x shape. Throws Error(NotFound)
  // if the file cannot be opened, Error(InvalidArgument) if it is a directory or special file, and
  // Error(Parse) naming the file and the fault otherwise (a header nested deeper than 64 levels or a
  // shape of more than 64 dimensions is a fault). Messages quote at most 200 bytes of any text from
  // the file.
  static SafeTensors read(const std::filesystem::path& path);
  // Same from bytes already in memory (the embedded sample); `source` names it in messages.
  static SafeTensors parse(std::vector<uint8_t> bytes, const std::string& source);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source() const { return source_; }

  // Throws Error(NotFound) naming the tensor, the file and the tensors it has (the first 20). The view's data lives
  // as long as this object (copies of a SafeTensors own their bytes).
  TensorView at(const std::string& name) const;

  // The tensor as 16-bit float bits, checked: dtype must be `dtype` and the shape [rows, cols] where
  // a negative expected extent accepts any. Throws Error(InvalidArgument) naming tensor, expected and
  // given dtype/shape.
  std::vector<uint16_t> matrix16(const std::string& name, DType dtype, int64_t rows, int64_t cols,
                                 int64_t* rows_out = nullptr, int64_t* cols_out = nullptr) const;

 private:
  std::string source_;
  std::vector<uint8_t> bytes_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace twell
