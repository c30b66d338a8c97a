// The gate screen's device helpers (decode_fused.cuh reads it; the host builds it: runtime/src/gate_screen.h).
//
// A screen of Wg holds, per row and k group of 64 values, int8 values q (sign-magnitude bytes), a scale s and a
// bound coefficient c, such that for any x, |x . Wg_row - sum_groups s (x_group . q_group)| plus the float
// sums' rounding errors is at most sum_groups ||x_group||_2 c (Cauchy-Schwarz per group on the residual
// Wg - s q, and a relative slack for the sums; gate_screen.h). decode_fused streams the int8 values
// instead of Wg (half the bytes), takes the rows whose upper bound could be active as candidates, and
// recomputes their gate exactly from Wg's 16-bit rows: no active neuron is ever missed.
#pragma once
#include "twell/device/primitives/numerics.cuh"
#include "twell/device/primitives/tile_primitives.cuh"

namespace twell::device {

// 4 bytes global -> shared (cp.async allows 4, 8 or 16 bytes; 4 takes the .ca path).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_address(smem)), "l"(gmem));
}

// Two values of a 32-bit word of screen bytes (sign-magnitude: bit 7 the sign, bits 0-6 |q| <= 127) as a
// pair of the value type, exactly, in four full-rate instructions and no conversion: SEL (a prmt
// selector) repeats the two bytes into both halves of their 16-bit lanes, so that the high byte's bit 7
// lands on the value's sign bit; masked and or-ed with the magic M (a value whose ulp is 1: bf16 128, fp16
// 1024), each lane is +-(M + |q|); a packed fma adds -+M: +-|q| = q (PTX ISA, "prmt", "lop3",
// "fma.rn.bf16x2" / "fma.rn.f16x2"; sm_80).
template <class Value>
struct ScreenMagic;
template <>
struct ScreenMagic<BF16> {
  static constexpr uint32_t kMagic2 = 0x43004300u, kOne2 = 0x3F803F80u;
  static __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
};
template <>
struct ScreenMagic<FP16> {
  static constexpr uint32_t kMagic2 = 0x64006400u, kOne2 = 0x3C003C00u;
  static __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
};
// SEL 0x1100: bytes 0 and 1 of the word; 0x3322: bytes 2 and 3.
template <class Value, uint32_t SEL>
__device__ __forceinline__ uint32_t screen_pair(uint32_t word) {
  using M = ScreenMagic<Value>;
  const uint32_t t = __byte_perm(word, 0u, SEL);
  const uint32_t v = (t & 0x807F807Fu) | M::kMagic2;   // +-(magic + |q|)
  const uint32_t c = (~t & 0x80008000u) | M::kMagic2;  // -+magic
  return M::fma2(v, M::kOne2, c);
}

}  // namespace twell::device
