// twell's one exception type. Every message names the argument or resource, what was expected and
// what was given, e.g. "FfnPlan::run: x: expected a 2-byte aligned device pointer, got 0x7f..01".
#pragma once
#include <stdexcept>
#include <string>

namespace twell {

enum class ErrorCode {
  InvalidArgument,  // a caller's argument is out of contract (shape, dtype, pointer, alignment, name)
  NotFound,         // a file, a named tensor or a kernel (in the bundles, without a JIT) does not exist
  Io,               // a file could not be written (read-only or full disk) or read
  Parse,            // malformed input: a .mlir file, a safetensors header, a cache entry, a bundle
  Compile,          // NVRTC or the MLIR pipeline rejected generated code
  Cuda,             // a CUDA driver or cuBLASLt call failed
  NoDevice,         // no CUDA driver or no GPU: compile-only paths still work
  Unsupported,      // valid input that this version does not implement (names the issue that will)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace twell
