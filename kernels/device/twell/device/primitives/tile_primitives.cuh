// Tensor-core and async-copy primitives of the portable feature set (sm_80 and newer), as inline PTX
// (PTX ISA: "cp.async", "ldmatrix", "mma.sync.aligned.m16n8k16"). Fragment layouts are the ISA's
// "Matrix Fragments for mma.m16n8k16 with floating point type".
#pragma once
#include "twell/device/primitives/numerics.cuh"
#include "twell/device/shared_memory.h"

namespace twell::device {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  uint32_t r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// The dynamic shared memory the launch gave this CTA, in bytes (PTX special register %dynamic_smem_size).
__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
  uint32_t bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(bytes));
  return bytes;
}

// Kernels whose shared-memory layout the host sizes (shared_memory.h, through constraints.h) check it on entry: a launch
// with less than `bytes` traps (a loud launch error) instead of writing past the allocation.
__device__ __forceinline__ void require_dynamic_smem(uint32_t bytes) {
  if (dynamic_smem_bytes() < bytes) __trap();
}

// 16 bytes global -> shared, bypassing L1; `valid` false zero-fills the destination (masked tails).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 b16 matrices from shared memory; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

// D = A (16x16, row) * B (16x8, col) + D with fp32 accumulators; Value selects bf16 or f16 inputs.
template <class Value>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<BF16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<FP16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One k16 step of a warp's (MT m16) x (NT n8) tile of the gate's mma chain, from one shared-memory
// stage: A = x rows [16 MT][ld] from `a_rows`, B = Wg rows [8 NT][ld] from `b_rows`, K-values kk ..
// kk + 15 of the stage. The D2T's portable mainloop and decode_gate run their chains through it
// (decode_gate_small and the consumers' overflow recompute build the same fragments from bulk-copied
// rows or global memory), so their gate values are the same bits (ldmatrix fragments as the ISA's
// "Matrix Fragments for mma.m16n8k16").
template <class Value, int MT, int NT>
__device__ __forceinline__ void mma_k16_step(float (&acc)[MT][NT][4], const uint16_t* a_rows, const uint16_t* b_rows,
                                             int ld, int kk, int lane) {
  static_assert(NT % 2 == 0, "B fragments come in pairs of n8 tiles (one ldmatrix.x4)");
  uint32_t a[MT][4], b[NT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) ldmatrix_x4(a[i], a_rows + (i * 16 + lane % 16) * ld + kk + (lane / 16) * 8);
#pragma unroll
  for (int j = 0; j < NT; j += 2) {
    uint32_t r[4];
    ldmatrix_x4(r, b_rows + (j * 8 + lane % 8 + (lane / 16) * 8) * ld + kk + (lane / 8) % 2 * 8);
    b[j][0] = r[0];
    b[j][1] = r[1];
    b[j + 1][0] = r[2];
    b[j + 1][1] = r[3];
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) mma_16816<Value>(acc[i][j], a[i], b[j][0], b[j][1]);
}

}  // namespace twell::device
