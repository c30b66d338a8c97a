// Reading a FILE.mlir argument (twellc emit, twellc compile): a path that is a directory, missing,
// unreadable or empty is named as such, not handed to the generator as an empty module ("expected
// one FFN, got 0").
#pragma once
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "twell/error.h"

namespace twellc {

// The text of `path`. Throws twell::Error(NotFound) when it does not exist ("No such file or
// directory"), Error(InvalidArgument) when it is a directory or holds nothing, Error(Io) when it cannot
// be read. Pipes and devices (`<(...)`, /dev/stdin) are read like files.
inline std::string read_mlir_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status))
    throw twell::Error(twell::ErrorCode::InvalidArgument,
                       fmt::format("FILE.mlir: expected a file, got '{}', a directory", path));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw twell::Error(std::filesystem::exists(status) ? twell::ErrorCode::Io : twell::ErrorCode::NotFound,
                       fmt::format("FILE.mlir: cannot open '{}': {}", path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw twell::Error(twell::ErrorCode::Io, fmt::format("FILE.mlir: reading '{}' failed", path));
  if (text.str().empty())
    throw twell::Error(twell::ErrorCode::InvalidArgument,
                       fmt::format("FILE.mlir: expected a module with one FFN, got '{}', an empty file", path));
  return text.str();
}

}  // namespace twellc
