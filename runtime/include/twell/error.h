// twell's one exception type. Every message names the argument or resource, what was expected and
// what was given, e.g. "FfnPlan::run: x: expected a 2-byte aligned device pointer, got 0x7f..01".
#pragma once
#include <stdexcept>
#include <string>

namespace twell {

enum class ErrorCode {
  InvalidArgument,  // a caller's argument is out of contract (shape, dtype, pointer, alignment, name)
  NotFound,         // a file or a named tensor does not exist
  Parse,            // malformed input: a .mlir file, a safetensors header, a cache entry
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
