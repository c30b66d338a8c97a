// Host-side 16-bit float conversions (bit-exact with the device's cvt.rn: round to nearest even).
// Tensors cross the API as raw uint16_t bits; these convert them for the CPU reference and tests.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>

#include "twell/spec.h"

namespace twell {

inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

inline uint16_t float_to_bf16(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float fp16_to_float(uint16_t bits) { return static_cast<float>(std::bit_cast<_Float16>(bits)); }
inline uint16_t float_to_fp16(float v) { return std::bit_cast<uint16_t>(static_cast<_Float16>(v)); }

inline float to_float(DType t, uint16_t bits) { return t == DType::BF16 ? bf16_to_float(bits) : fp16_to_float(bits); }
inline uint16_t from_float(DType t, float v) { return t == DType::BF16 ? float_to_bf16(v) : float_to_fp16(v); }

}  // namespace twell
