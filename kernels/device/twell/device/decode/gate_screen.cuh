// The gate screen's device helpers (decode_fused.cuh reads it; the host builds it: runtime/src/gate_screen.h).
//
// A screen of Wg holds, per row and k group of 64 values, int8 values q, a scale s, a bound coefficient c
// and a norm n (gate_screen.h). decode_fused quantizes x per token and group the same way (x ~ sx px),
// streams q instead of Wg (half the bytes), multiplies px and q exactly in int8 tensor-core steps, and
// takes as candidates the rows whose upper bound sum_g (sx s (px . q) + ||x - sx px|| n + ||sx px|| c)
// could be active; the candidates' gate is then recomputed exactly from Wg's 16-bit rows, so no active
// neuron is ever missed.
#pragma once
#include "twell/device/primitives/numerics.cuh"
#include "twell/device/primitives/tile_primitives.cuh"

namespace twell::device {

// 4 bytes global -> shared (cp.async allows 4, 8 or 16 bytes; 4 takes the .ca path).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_address(smem)), "l"(gmem));
}

// d += a b over 32 k of int8 (exact int32 sums; PTX ISA, "mma.m16n8k32" with .s8, sm_80): A's registers
// 0 and 2 row groupID, k 4 tig .. 4 tig + 3 and 16 + 4 tig .. (1 and 3 row groupID + 8), B's two
// registers the same k of column groupID (tig: the lane's index in its quad), D as the f32 mma's.
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace twell::device
