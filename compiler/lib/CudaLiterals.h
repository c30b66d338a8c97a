// C++ spellings the emitters (EmitCuda.cpp, EmitAuxiliary.cpp) write into generated CUDA.
#pragma once
#include <cstdio>
#include <string>

namespace twell::compiler {

// An exact C++ spelling of an f32: a hexadecimal floating literal ("0x1.99999ap-4f").
inline std::string hexFloat(float value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%a", static_cast<double>(value));
  return std::string(buffer) + "f";
}

}  // namespace twell::compiler
