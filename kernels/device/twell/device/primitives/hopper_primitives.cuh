// The sm_90a feature set as inline PTX: mbarriers (PTX ISA "mbarrier"), clusters, TMA bulk tensor
// copies ("cp.async.bulk.tensor", multicast included), wgmma synchronization and shared-memory matrix descriptors ("Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Operation", "Matrix Descriptor Format"), and setmaxnreg.
#pragma once
#include "twell/device/primitives/tile_primitives.cuh"
#include "twell/device/primitives/wgmma_ops.cuh"

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

// ---- clusters (PTX ISA "Cluster of Cooperative Thread Arrays", "mapa", "barrier.cluster") ----
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster, release/acquire: shared-memory writes before it (mbarrier
// initializations included) are visible to the peers after it. Not .aligned: the threads of a warp
// may arrive from different branches (the warp-specialized roles).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// One arrival on the barrier at the same shared-memory offset in cluster CTA `rank` (mapa). The
// default (.release.cta) semantics: the arrival only says that this thread's reads of the peer's stage
// are complete (wgmma.wait_group returned), which no write can undo. With .release.cluster here and
// .acquire.cluster on the waits the clustered gate ran 1.4x slower (bench/README.md v20).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_address(bar)),
      "r"(rank)
      : "memory");
}
// mbarrier_wait polling with test_wait, which never suspends the thread (try_wait may sleep up to a
// system-dependent time limit): the TMA producer's wait for a released stage, one thread.
__device__ __forceinline__ void mbarrier_spin(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.test_wait.parity.shared::cta.b64 done, [%0], %1;\n"
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

// The same box written at the same shared-memory offset of every CTA in `cta_mask` (bit r: cluster
// rank r), completing the transaction count of the barrier at the same offset in each
// (".multicast::cluster").
__device__ __forceinline__ void tma_load_2d_multicast(void* smem, const TmaDescriptor* map, uint64_t* bar, int inner,
                                                      int outer, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;\n" ::"r"(smem_address(smem)),
      "l"(map), "r"(smem_address(bar)), "r"(inner), "r"(outer), "h"(cta_mask)
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

// Descriptor of a K-major operand tile written by TMA with ROW_BYTES-byte swizzling (128: rows of 64
// 16-bit values, 64: rows of 32): 8-row groups 8 * ROW_BYTES apart (stride byte offset), tile aligned
// to that (base offset 0), leading byte offset unused for swizzled K-major layouts (1 by convention),
// layout type 1 = 128-byte, 2 = 64-byte swizzle (PTX ISA "Matrix Descriptor Format"). Adding 32 bytes
// to the start address steps K by 16 inside a row.
template <int ROW_BYTES>
__device__ __forceinline__ uint64_t wgmma_descriptor_swizzled(const void* tile) {
  static_assert(ROW_BYTES == 128 || ROW_BYTES == 64, "wgmma descriptors: 128- or 64-byte swizzle rows");
  constexpr uint64_t kLayout = ROW_BYTES == 128 ? 1 : 2;
  const uint64_t address = smem_address(tile);
  return ((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{8 * ROW_BYTES >> 4} << 32) | (kLayout << 62);
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
