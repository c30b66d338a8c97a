// The sm_90a feature set as inline PTX: mbarriers (PTX ISA "mbarrier"), TMA bulk tensor copies
// ("cp.async.bulk.tensor"), wgmma synchronization and shared-memory matrix descriptors ("Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Operation", "Matrix Descriptor Format"), and setmaxnreg.
#pragma once
#include "twell/device/tile_primitives.cuh"
#include "twell/device/wgmma_ops.cuh"

namespace twell::device {

// ---- mbarrier (shared::cta, 8 bytes each) ----
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals));
}
// Makes the initializations visible to the async proxy (TMA completes transactions on them).
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` of TMA transactions the phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Blocks until the phase with parity `phase` of the barrier has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(phase)
      : "memory");
}

// ---- TMA ----
__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
// Box at (inner, outer) of a 2-D tensor map -> shared memory; completes `bar`'s transaction count.
// Elements outside the tensor are written as zeros (the masked tails of M, N and K).
__device__ __forceinline__ void tma_load_2d(void* smem, const TmaDescriptor* map, uint64_t* bar, int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_address(smem)),
      "l"(map), "r"(smem_address(bar)), "r"(inner), "r"(outer)
      : "memory");
}

// ---- wgmma ----
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across an in-flight wgmma.
template <int R>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major operand tile written by TMA with 128-byte swizzling: rows of 64 16-bit
// values (128 bytes), 8-row groups 1024 bytes apart (stride byte offset), tile 1024-byte aligned
// (base offset 0), leading byte offset unused for swizzled K-major layouts (1 by convention). Adding
// 32 bytes to the start address steps K by 16 inside the 64-wide row.
__device__ __forceinline__ uint64_t wgmma_descriptor_sw128(const void* tile) {
  const uint64_t address = smem_address(tile);
  return ((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// ---- registers ----
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

}  // namespace twell::device
