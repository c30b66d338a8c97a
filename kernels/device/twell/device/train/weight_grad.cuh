// The weight gradients of the sparse gated FFN's training backward (design/TRAINING.md, "The
// gradients"; the CPU oracle is twell/training_reference.h), from the forward's TwELL words and the
// per-entry quads {dg, du, h, a} the backward by token row wrote (train/row_backward.cuh):
//   dWg[j, k] = sum_t dg_tj x_tk,  dWu[j, k] = sum_t du_tj x_tk,  dWd^T[j, k] = sum_t h_tj dy_tk
// over the tokens t that activate neuron j, in fp32.
//
// No transpose of the support: the TwELL tiles already group neurons. A CTA owns a slice of
// kTrainWeightGradSlice neurons of one tile and kTrainWeightGradColumns columns of d_model (one per
// thread), and walks every token in ascending order, a batch of 32 at a time: each warp gathers the
// slice's entries of 4 consecutive tokens (a tile-row within its slots: the words whose column falls in
// the slice, with their quads from entry_grad; an overflowing one: the active columns of its grad row,
// a != 0) into its segment of a list in shared memory, in token then column order; then every thread
// walks the whole list and adds each entry's terms to its column of the slice's fp32 accumulators
// (shared memory, [matrix][neuron][column]: conflict-free). Every output element is one thread's, and
// gets one fma per active token from +0 in token order: reference_training_backward's summation, so on
// the same per-entry values the outputs are the reference's bit for bit, and bitwise deterministic (no
// atomics, no split of the tokens).
#pragma once
#include "twell/device/primitives/numerics.cuh"
#include "twell/device/shared_memory.h"

namespace twell::device {

template <class Config>
__device__ __forceinline__ void train_weight_grad(const TrainWeightGradParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr bool GATED = Config::gated;
  constexpr int THREADS = Config::threads;
  constexpr int SLICE = static_cast<int>(shared_memory::kTrainWeightGradSlice);
  constexpr int COLUMNS = static_cast<int>(shared_memory::kTrainWeightGradColumns);
  constexpr int WARPS = static_cast<int>(shared_memory::kTrainWeightGradWarps);
  constexpr int TOKENS_PER_WARP = static_cast<int>(shared_memory::kTrainWeightGradTokensPerWarp);
  constexpr int BATCH = WARPS * TOKENS_PER_WARP;
  constexpr int SEGMENT = TOKENS_PER_WARP * SLICE;  // a warp's entries: at most a slice per token
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr int SLICES_PER_TILE = TILE_N / SLICE;
  constexpr int MATRICES = GATED ? 3 : 2;
  constexpr int MATRIX = SLICE * COLUMNS;  // floats of one gradient's accumulators
  static_assert(THREADS == COLUMNS && WARPS * 32 == THREADS, "one column per thread, 8 warps");
  static_assert(TILE_N % SLICE == 0 && SLICE <= 32, "whole slices of a tile, one lane per slice neuron");
  static_assert(BATCH * 256 < (1 << 23) && SLICE <= 256, "an entry's token and column fit its tag's mantissa");

  // Accumulators: 0 dWg, 1 dWd^T, 2 dWu (gated); then the batch's list of quads {dg, du, h, tag}, the tag
  // a float in [1, 2) whose mantissa is (token in the batch) << 8 | (neuron in the slice) (a normal
  // number: no denormal handling can touch it).
  constexpr uint32_t kTagOne = 0x3F800000u;
  extern __shared__ __align__(16) unsigned char shared[];
  float* acc = reinterpret_cast<float*>(shared);
  float4* list = reinterpret_cast<float4*>(shared + static_cast<long long>(MATRICES) * MATRIX * 4);
  __shared__ int segment_count[WARPS];
  __shared__ int missing;  // an overflowing tile-row of this tile had no grad row

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int tile = static_cast<int>(blockIdx.x) / SLICES_PER_TILE;
  const int s0 = static_cast<int>(blockIdx.x) % SLICES_PER_TILE * SLICE;  // the slice's first column in the tile
  const int n0 = tile * TILE_N;
  const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
  const int k = static_cast<int>(blockIdx.y) * COLUMNS + tid;  // this thread's column of d_model

#pragma unroll
  for (int i = 0; i < MATRICES * SLICE; ++i) acc[i * COLUMNS + tid] = 0.0f;
  if (tid == 0) missing = 0;
  __syncthreads();  // before any warp may set it

  if (s0 < valid_n) {  // uniform: slices past d_ff (the last tile's) have nothing to sum or write
    for (long long t0 = 0; t0 < p.m; t0 += BATCH) {
      int count = 0;  // entries in this warp's segment; uniform across the warp
      for (int q = 0; q < TOKENS_PER_WARP; ++q) {
        const int tl = warp * TOKENS_PER_WARP + q;
        const long long t = t0 + tl;
        if (t >= p.m) break;
        const long long word0 = t * WORDS_PER_ROW + static_cast<long long>(tile) * (SLOTS + 1);
        const uint32_t nnz = p.twell[word0];
        if (nnz == 0) continue;
        if (nnz <= SLOTS) {
          for (int e0 = 0; e0 < static_cast<int>(nnz); e0 += 32) {
            const int e = e0 + lane;
            // The entry's column in the slice; unsigned, so columns before the slice wrap past it.
            const uint32_t c = e < static_cast<int>(nnz)
                                   ? (p.twell[word0 + 1 + e] & 0xFFFFu) - static_cast<uint32_t>(s0)
                                   : 0xFFFFFFFFu;
            const bool in = c < static_cast<uint32_t>(SLICE);
            const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, in);
            if (in) {
              float4 v = *reinterpret_cast<const float4*>(p.entry_grad + 4 * (word0 + 1 + e));
              v.w = __uint_as_float(kTagOne | static_cast<uint32_t>(tl) << 8 | c);
              list[warp * SEGMENT + count + __popc(ballot & lanemask_lt())] = v;
            }
            count += __popc(ballot);
          }
          continue;
        }
        // Overflowing: its grad row b (word 1's quad), whose inactive columns are zero quads (a = 0).
        const uint32_t b = __float_as_uint(p.entry_grad[4 * (word0 + 1)]);
        if (b == kBackupMissing || b >= p.grad_capacity) {
          if (lane == 0) missing = 1;
          continue;
        }
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (lane < SLICE && s0 + lane < valid_n)
          v = *reinterpret_cast<const float4*>(p.backup_grad + 4 * (static_cast<long long>(b) * TILE_N + s0 + lane));
        const bool in = lane < SLICE && v.w != 0.0f;
        const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, in);
        if (in) {
          v.w = __uint_as_float(kTagOne | static_cast<uint32_t>(tl) << 8 | static_cast<uint32_t>(lane));
          list[warp * SEGMENT + count + __popc(ballot & lanemask_lt())] = v;
        }
        count += __popc(ballot);
      }
      if (lane == 0) segment_count[warp] = count;
      __syncthreads();  // the list is complete
      if (k < K) {
        int current = -1;  // the token whose x and dy values are loaded
        float xv = 0.0f, dyv = 0.0f;
        for (int w = 0; w < WARPS; ++w) {
          const int n = segment_count[w];
          for (int e = 0; e < n; ++e) {
            const float4 v = list[w * SEGMENT + e];
            const uint32_t tag = __float_as_uint(v.w) & 0x7FFFFFu;
            const int tl = static_cast<int>(tag >> 8);
            if (tl != current) {
              current = tl;
              xv = Value::to_float(p.x[(t0 + tl) * p.ldx + k]);
              dyv = Value::to_float(p.dy[(t0 + tl) * p.lddy + k]);
            }
            float* a = acc + static_cast<int>(tag & 0xFFu) * COLUMNS + tid;
            a[0] = fmaf(v.x, xv, a[0]);
            a[MATRIX] = fmaf(v.z, dyv, a[MATRIX]);
            if constexpr (GATED) a[2 * MATRIX] = fmaf(v.y, xv, a[2 * MATRIX]);
          }
        }
      }
      __syncthreads();  // the list may be overwritten
    }
  }
  __syncthreads();  // `missing` is final
  if (k >= K) return;
  const bool poison = missing != 0;
  for (int j = 0; j < SLICE && s0 + j < valid_n; ++j) {
    const long long n = n0 + s0 + j;
    for (int m = 0; m < MATRICES; ++m) {
      const float value = poison ? __uint_as_float(0x7FC00000u) : acc[(m * SLICE + j) * COLUMNS + tid];
      void* base = m == 0 ? p.dw_gate : m == 1 ? p.dw_down : p.dw_up;
      const long long ld = m == 0 ? p.ld_dw_gate : m == 1 ? p.ld_dw_down : p.ld_dw_up;
      if (p.output_dtype)
        static_cast<uint16_t*>(base)[n * ld + k] = Value::from_float(value);
      else
        static_cast<float*>(base)[n * ld + k] = value;
    }
  }
}

}  // namespace twell::device
