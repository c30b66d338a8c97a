// safetensors reader (twell/safetensors.h).
#include "twell/safetensors.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "quoted_text.h"
#include "twell/error.h"

namespace twell {
namespace {

using detail::excerpt;

int64_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

// A safetensors header nests 3 deep ({name: {shape: [...]}}); the bound keeps a hostile header from
// exhausting the stack in nlohmann's recursive dump (a header nested 70000 deep did).
constexpr int kMaxHeaderDepth = 64;
// Dimensions of a tensor (real ones have a few): its shape is quoted in messages.
constexpr size_t kMaxRank = 64;

}  // namespace

int64_t TensorView::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafeTensors SafeTensors::read(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    throw Error(ErrorCode::NotFound, fmt::format("safetensors file '{}': cannot open ({})", path.string(),
                                                 ec ? ec.message() : "no such file"));
  if (!std::filesystem::is_regular_file(status))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("safetensors file '{}': expected a regular file, got a {}", path.string(),
                            std::filesystem::is_directory(status) ? "directory" : "special file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::NotFound, fmt::format("safetensors file '{}': cannot open ({})", path.string(), std::strerror(errno)));
  std::vector<uint8_t> bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    throw Error(ErrorCode::Parse, fmt::format("safetensors file '{}': read failed ({})", path.string(), e.what()));
  }
  if (in.bad()) throw Error(ErrorCode::Parse, fmt::format("safetensors file '{}': read failed", path.string()));
  return parse(std::move(bytes), path.string());
}

SafeTensors SafeTensors::parse(std::vector<uint8_t> bytes, const std::string& source) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::Parse, fmt::format("'{}' is not a valid safetensors file: {}", source, what));
  };
  if (bytes.size() < 8) fail(fmt::format("expected at least 8 bytes (header length), got {}", bytes.size()));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];
  if (header_len > bytes.size() - 8)
    fail(fmt::format("header length {} exceeds the {} bytes after it", header_len, bytes.size() - 8));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_len),
                                   [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
                                     if (depth > kMaxHeaderDepth) throw std::length_error("header nested too deep");
                                     return true;
                                   });
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("header is not JSON: {}", excerpt(e.what())));
  } catch (const std::length_error&) {
    fail(fmt::format("expected a header nested at most {} levels deep (safetensors nests 3), got one nested deeper",
                     kMaxHeaderDepth));
  }
  if (!header.is_object()) fail("header is not a JSON object");
  SafeTensors st;
  st.source_ = source;
  st.bytes_ = std::move(bytes);
  const uint64_t data_begin = 8 + header_len, data_size = st.bytes_.size() - data_begin;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (const auto& [k, v] : entry.items()) st.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets") ||
        !entry["dtype"].is_string() || !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      fail(fmt::format("tensor '{}': expected {{dtype, shape, data_offsets: [begin, end]}}, got {}", excerpt(name),
                       excerpt(entry.dump())));
    TensorView t;
    t.dtype = entry["dtype"].get<std::string>();
    const int64_t esize = dtype_size(t.dtype);
    if (esize == 0) fail(fmt::format("tensor '{}': unknown dtype '{}'", excerpt(name), excerpt(t.dtype)));
    // Every extent and the byte count must fit in int64 (no wrap-around can make a shape "match").
    if (entry["shape"].size() > kMaxRank)
      fail(fmt::format("tensor '{}': expected at most {} dimensions, got a shape of {}", excerpt(name), kMaxRank,
                       entry["shape"].size()));
    int64_t bytes_needed = esize;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 48))
        fail(fmt::format("tensor '{}': shape entries must be integers in 0..2^48, got {}", excerpt(name), excerpt(d.dump())));
      t.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(bytes_needed, t.shape.back(), &bytes_needed))
        fail(fmt::format("tensor '{}': shape [{}] overflows a 64-bit byte count", excerpt(name), fmt::join(t.shape, ", ")));
    }
    const auto& off = entry["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(fmt::format("tensor '{}': data_offsets must be non-negative integers", excerpt(name)));
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      fail(fmt::format("tensor '{}': data_offsets [{}, {}] outside the {} data bytes", excerpt(name), b, e, data_size));
    if (static_cast<int64_t>(e - b) != bytes_needed)
      fail(fmt::format("tensor '{}': {} {} x {} needs {} bytes, data_offsets give {}", excerpt(name), t.dtype,
                       fmt::join(t.shape, "x"), esize, t.elements() * esize, e - b));
    t.offset = data_begin + b;
    t.data = std::span<const uint8_t>(static_cast<const uint8_t*>(nullptr), e - b);  // bound in at()
    st.tensors_.emplace(name, std::move(t));
  }
  return st;
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : tensors_) n.push_back(k);
  return n;
}

TensorView SafeTensors::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw Error(ErrorCode::NotFound,
                fmt::format("tensor '{}' not found in '{}'; it has: {}", excerpt(name), source_, detail::short_list(names())));
  TensorView t = it->second;
  t.data = std::span<const uint8_t>(bytes_.data() + t.offset, t.data.size());
  return t;
}

std::vector<uint16_t> SafeTensors::matrix16(const std::string& name, DType dtype, int64_t rows, int64_t cols,
                                            int64_t* rows_out, int64_t* cols_out) const {
  const TensorView t = at(name);
  const char* want = dtype == DType::BF16 ? "BF16" : "F16";
  if (t.dtype != want)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor '{}' in '{}': expected dtype {}, got {}", name, source_, want, t.dtype));
  if (t.shape.size() != 2 || (rows >= 0 && t.shape[0] != rows) || (cols >= 0 && t.shape[1] != cols))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor '{}' in '{}': expected shape [{}, {}], got [{}]", name, source_,
                            rows >= 0 ? std::to_string(rows) : "any", cols >= 0 ? std::to_string(cols) : "any",
                            fmt::join(t.shape, ", ")));
  std::vector<uint16_t> out(t.elements());
  std::memcpy(out.data(), t.data.data(), t.data.size());
  if (rows_out) *rows_out = t.shape[0];
  if (cols_out) *cols_out = t.shape[1];
  return out;
}

}  // namespace twell
