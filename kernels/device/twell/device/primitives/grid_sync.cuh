// Grid-wide synchronization of a kernel whose CTAs are all resident at once (a cooperative launch:
// CU_LAUNCH_ATTRIBUTE_COOPERATIVE, which the driver refuses where they cannot be), and the loads and
// stores by which its CTAs read what others wrote. The barrier: train/weight_grad.cuh; the loads and
// stores: it and decode/decode_fused.cuh (which waits on other CTAs' words instead of a barrier).
#pragma once
#include "twell/device/params.h"  // uint32_t, as every device header gets it under NVRTC

namespace twell::device {

// The grid barrier: arrivals are counted in barrier[0]; the last CTA to arrive resets the count and
// advances the generation (barrier[1]) the others wait on, so the two words are ready for the next
// barrier and the next call without a memset (a CUDA graph replays the kernel alone). Both words must
// be zero before the kernel's first launch.
__device__ __forceinline__ void grid_barrier(uint32_t* barrier) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile uint32_t* generation = barrier + 1;
    const uint32_t seen = *generation;
    __threadfence();  // this CTA's writes before its arrival
    if (atomicAdd(barrier, 1u) == gridDim.x * gridDim.y * gridDim.z - 1) {
      *reinterpret_cast<volatile uint32_t*>(barrier) = 0u;
      __threadfence();
      atomicAdd(barrier + 1, 1u);
    } else {
      while (*generation == seen) __nanosleep(64);
    }
    __threadfence();  // the others' writes before this CTA's reads
  }
  __syncthreads();
}

// Words other CTAs of this kernel wrote before a grid barrier (or a release this CTA acquired), through L2
// (ld.global.cg: a non-coherent L1 line might hold them stale).
__device__ __forceinline__ uint32_t load_l2_u32(const uint32_t* ptr) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint2 load_l2_pair(const uint32_t* ptr) {
  uint2 v;
  asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(ptr));
  return v;
}

// Words that CTAs of a running kernel hand to each other without a grid barrier (decode/decode_fused.cuh:
// a word written twice, first without and then with its value, read until the value is there): relaxed
// stores and loads at GPU scope (PTX ISA, "Memory Consistency Model": morally strong, so the reads see
// the writes' coherence order, never a torn word; a 64-bit aligned access is single-copy atomic), which
// bypass a non-coherent L1 line. Relaxed loads, unlike acquire ones, may be in flight together.
__device__ __forceinline__ unsigned long long load_relaxed_u64(const unsigned long long* ptr) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void store_relaxed_u64(unsigned long long* ptr, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(ptr), "l"(v) : "memory");
}

}  // namespace twell::device
