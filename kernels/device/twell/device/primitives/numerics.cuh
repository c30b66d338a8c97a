// 16-bit float conversions and the activation/sparsity predicate shared by every twell kernel.
//
// Generated kernels include no CUDA headers (each costs NVRTC time, and NVRTC ships no cuda_bf16.h);
// bf16 and fp16 travel as raw uint16_t bits and are converted with the PTX `cvt` instructions
// (PTX ISA, "Data Movement and Conversion Instructions: cvt"; bf16 forms need sm_80).
#pragma once
#include "twell/device/params.h"

namespace twell::device {

// A compile-time value as a type (NVRTC has no <type_traits>): passes constants through generic lambdas.
template <class T, T V>
struct integral_constant {
  static constexpr T value = V;
};


struct BF16 {
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  }
  static __device__ __forceinline__ uint16_t from_float(float v) {
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
  }
};

struct FP16 {
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(bits));
    return r;
  }
  static __device__ __forceinline__ uint16_t from_float(float v) {
    uint16_t r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
  }
};

enum : int { kReLU = 0, kSiLU = 1 };

// a = act(g) for a gate pre-activation g already rounded to the value type, rounded again to it (a
// dense framework stores the activation in the dtype). Returns the bits of a.
template <class Value, int Act>
__device__ __forceinline__ uint16_t activate(uint16_t g_bits) {
  if constexpr (Act == kReLU) {
    const float g = Value::to_float(g_bits);
    return g > 0.0f || g != g ? g_bits : Value::from_float(0.0f);
  } else {
    const float g = Value::to_float(g_bits);
    return Value::from_float(g / (1.0f + expf(-g)));
  }
}

// Whether an activated value is a nonzero of the TwELL matrix (spec.h, Activation). NaN is active so
// that NaN propagates to y as in the dense computation.
template <class Value, int Act>
__device__ __forceinline__ bool is_active(uint16_t a_bits, float threshold) {
  const float a = Value::to_float(a_bits);
  if constexpr (Act == kReLU) {
    return !(a <= threshold);
  } else {
    return !(fabsf(a) <= threshold);
  }
}

// SiLU's derivative at g (training_reference.h, activation_derivative): s (1 + g (1 - s)), s = 1 / (1 + e^-g).
__device__ __forceinline__ float silu_derivative(float g) {
  const float s = 1.0f / (1.0f + expf(-g));
  return s * (1.0f + g * (1.0f - s));
}

// sign(h) in {-1, 0, +1}, NaN for NaN (torch.sign; the reference's sign_of).
__device__ __forceinline__ float sign_of(float h) { return h > 0.0f ? 1.0f : h < 0.0f ? -1.0f : h == 0.0f ? 0.0f : h; }

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

}  // namespace twell::device
