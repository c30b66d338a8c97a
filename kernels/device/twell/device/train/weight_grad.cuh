// The weight gradients of the sparse gated FFN's training backward (design/TRAINING.md, "The
// gradients"; the CPU oracle is twell/training_reference.h), from the forward's TwELL words and the
// per-entry quads {dg, du, h, a} the backward by token row wrote (train/row_backward.cuh):
//   dWg[j, k] = sum_t dg_tj x_tk,  dWu[j, k] = sum_t du_tj x_tk,  dWd^T[j, k] = sum_t h_tj dy_tk
// over the tokens t that activate neuron j, in fp32.
//
// Each neuron's gradient rows are a sum over its tokens only, so the kernel first sorts the entries by
// neuron (a stable counting sort, the transposed structure of design/TRAINING.md), then gives every
// (neuron, 256 columns) to one warp, which gathers its tokens' x and dy rows. One persistent kernel,
// one CTA per SM, launched cooperatively, four phases between grid barriers (primitives/grid_sync.cuh):
//   1. count: CTA c of P owns the token range [c M / P, (c + 1) M / P); it counts each neuron's entries
//      there (shared-memory counters) and writes counts[j][c]. Tile-rows that overflowed without a
//      grad row mark their tile (flags).
//   2. one warp per neuron: the exclusive prefix of counts[j][0..P) in place, and the neuron's total;
//      then CTA 0 scans the totals into starts[0..N] (starts[N]: all entries).
//   3. fill: CTA c walks its range again and writes each entry {token, quad} to
//      list[starts[j] + counts[j][c] + rank], rank the number of its range's earlier tokens that
//      activate j: a warp takes one tile for 32 tokens at a time (lane = token), marks the columns each
//      lane's tile-row holds in a per-warp mask, and ranks by the lanes below it in that column's mask.
//      So each neuron's list is its tokens ascending, whatever the grid.
//   4. one warp per (neuron, 256 columns), chunk-major, taken from a counter by the next free warp (an
//      odd d_model: every gwarps-th item): one fmaf per entry and output from +0, in list order, x and
//      dy read 8 columns per lane (16-byte loads where d_model % 8 == 0: 6 entries in flight, kept packed;
//      else 4).
// Every output is the sum reference_training_backward makes, in its order (tokens ascending, one fma
// per term): on the same per-entry values, its bits; and the same bits run after run (no float atomics:
// the only atomics count integers). A tile that met an overflowing tile-row without a grad row
// (kBackupMissing, or a row >= grad_capacity) has no gradients to sum: its neurons' outputs are NaN.
//
// Cost (bench/README.md v39): the bytes of a gather are each entry's x and dy rows (2 * d_model * 2
// bytes per entry), about the forward's consumer reads; a neuron that many tokens activate is one
// warp's long loop (the hot/cold split's dense neurons take those).
#pragma once
#include "twell/device/primitives/grid_sync.cuh"
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
  constexpr int WARPS = THREADS / 32;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr int COLUMNS = static_cast<int>(shared_memory::kTrainWeightGradColumns);  // a warp's item
  constexpr int CHUNKS = (K + COLUMNS - 1) / COLUMNS;
  constexpr bool VEC = K % 8 == 0;  // 16-byte loads of x and dy (the runtime checks their alignment)
  constexpr int UNROLL = 4;      // entries in flight per warp in phase 4 (unpacked: 8 registers per 8 values)
  constexpr int VEC_UNROLL = 6;  // the same with 16-byte chunks kept packed (d_model % 8 == 0)
  static_assert(THREADS == static_cast<int>(shared_memory::kTrainWeightGradWarps) * 32, "the contract's CTA");
  static_assert(COLUMNS == 256, "8 columns per lane");

  extern __shared__ __align__(16) unsigned char shared[];
  uint32_t* local = reinterpret_cast<uint32_t*>(shared);  // [N]: counts (phase 1), next positions (phase 3)
  uint32_t* colmask = local + shared_memory::train_weight_grad_counters(N);  // [WARPS][TILE_N]
  __shared__ uint32_t warp_sums[WARPS];

  using W = shared_memory::TrainWeightGradWorkspace;
  uint32_t* barrier = p.workspace + W::kBarrier;
  uint32_t* flags = p.workspace + W::kFlags;
  uint32_t* starts = p.workspace + W::starts(TILES);
  uint32_t* counts = p.workspace + W::counts(TILES, N);  // [N][P]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int P = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
  const long long t_begin = p.m * c / P, t_end = p.m * (c + 1) / P;
  const long long quad_base = p.m * WORDS_PER_ROW;  // list quads from here on are backup_grad's

  // Every entry of one lane's tile-row (token t, tile): f(column, quad). The walk of phases 1 and 3.
  auto for_each_entry = [&](long long t, int tile, int valid_n, auto&& f) {
    const long long word0 = t * WORDS_PER_ROW + static_cast<long long>(tile) * (SLOTS + 1);
    const uint32_t nnz = p.twell[word0];
    if (nnz == 0) return;
    if (nnz <= SLOTS) {
      for (uint32_t e = 0; e < nnz; ++e) {
        const int column = static_cast<int>(p.twell[word0 + 1 + e] & 0xFFFFu);
        if (column < valid_n) f(column, static_cast<uint32_t>(word0 + 1 + e));
      }
      return;
    }
    const uint32_t b = __float_as_uint(p.entry_grad[4 * (word0 + 1)]);
    if (b == kBackupMissing || b >= p.grad_capacity) {
      flags[tile] = 1u;  // every writer stores the same word
      return;
    }
    const long long row = static_cast<long long>(b) * TILE_N;
    for (int column = 0; column < valid_n; ++column)
      if (p.backup_grad[4 * (row + column) + 3] != 0.0f) f(column, static_cast<uint32_t>(quad_base + row + column));
  };

  // Phase 1: this range's entries per neuron. (CTA 0 also zeroes phase 4's item counter, which the
  // launch's memset cleared too: three grid barriers order it before the first claim, so a replay of the
  // kernel alone still takes every item.)
  if (c == 0 && tid == 0) p.workspace[W::kItems] = 0u;
  for (int j = tid; j < N; j += THREADS) local[j] = 0u;
  for (int i = tid; i < WARPS * TILE_N; i += THREADS) colmask[i] = 0u;
  __syncthreads();
  for (int tile = warp; tile < TILES; tile += WARPS) {
    const int valid_n = N - tile * TILE_N < TILE_N ? N - tile * TILE_N : TILE_N;
    for (long long t = t_begin + lane; t < t_end; t += 32)
      for_each_entry(t, tile, valid_n, [&](int column, uint32_t) { atomicAdd(&local[tile * TILE_N + column], 1u); });
  }
  __syncthreads();
  for (int j = tid; j < N; j += THREADS) counts[static_cast<long long>(j) * P + c] = local[j];
  grid_barrier(barrier);

  // Phase 2: per neuron, the exclusive prefix over the ranges and the total.
  const int gwarp = c * WARPS + warp, gwarps = P * WARPS;
  for (int j = gwarp; j < N; j += gwarps) {
    uint32_t carry = 0;
    for (int r0 = 0; r0 < P; r0 += 32) {
      const int r = r0 + lane;
      const uint32_t v = r < P ? load_l2_u32(counts + static_cast<long long>(j) * P + r) : 0u;
      uint32_t inclusive = v;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const uint32_t n = __shfl_up_sync(0xFFFFFFFFu, inclusive, o);
        if (lane >= o) inclusive += n;
      }
      if (r < P) counts[static_cast<long long>(j) * P + r] = carry + inclusive - v;
      carry += __shfl_sync(0xFFFFFFFFu, inclusive, 31);
    }
    if (lane == 0) starts[j] = carry;
  }
  grid_barrier(barrier);

  // Phase 2b: CTA 0 turns the totals into starts (each thread a run of consecutive neurons).
  if (c == 0) {
    constexpr int PER = (N + THREADS - 1) / THREADS;
    const int j0 = tid * PER;
    uint32_t sum = 0;
    for (int j = j0; j < j0 + PER && j < N; ++j) sum += load_l2_u32(starts + j);
    uint32_t inclusive = sum;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const uint32_t n = __shfl_up_sync(0xFFFFFFFFu, inclusive, o);
      if (lane >= o) inclusive += n;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    uint32_t before = inclusive - sum;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    for (int j = j0; j < j0 + PER && j < N; ++j) {
      const uint32_t total = load_l2_u32(starts + j);
      starts[j] = before;
      before += total;
    }
    if (tid == THREADS - 1) starts[N] = before;
  }
  grid_barrier(barrier);

  // Phase 3: the entries into their places, tokens ascending within each neuron.
  for (int j = tid; j < N; j += THREADS)
    local[j] = load_l2_u32(starts + j) + load_l2_u32(counts + static_cast<long long>(j) * P + c);
  __syncthreads();
  uint32_t* mask = colmask + warp * TILE_N;
  for (int tile = warp; tile < TILES; tile += WARPS) {
    const int valid_n = N - tile * TILE_N < TILE_N ? N - tile * TILE_N : TILE_N;
    uint32_t* next = local + tile * TILE_N;
    for (long long t0 = t_begin; t0 < t_end; t0 += 32) {
      const long long t = t0 + lane;
      const bool mine = t < t_end;
      if (mine) for_each_entry(t, tile, valid_n, [&](int column, uint32_t) { atomicOr(&mask[column], 1u << lane); });
      __syncwarp();
      if (mine)
        for_each_entry(t, tile, valid_n, [&](int column, uint32_t quad) {
          const uint32_t at = next[column] + static_cast<uint32_t>(__popc(mask[column] & lanemask_lt()));
          *reinterpret_cast<uint2*>(p.entry_list + 2 * static_cast<long long>(at)) = make_uint2(static_cast<uint32_t>(t), quad);
        });
      __syncwarp();
      for (int column = lane; column < valid_n; column += 32) {
        const uint32_t m = mask[column];
        if (m != 0u) {
          next[column] += static_cast<uint32_t>(__popc(m));
          mask[column] = 0u;
        }
      }
      __syncwarp();
    }
  }
  grid_barrier(barrier);

  // Phase 4: per (neuron, 256 columns), the sums over the neuron's list.
  auto column_of = [&](int chunk, int i) { return VEC ? chunk * COLUMNS + lane * 8 + i : chunk * COLUMNS + lane + 32 * i; };
  // 8 values of a row at a lane's columns (d_model % 8 != 0: one element at a time).
  auto load8 = [&](const uint16_t* row, int chunk, float (&v)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = column_of(chunk, i) < K ? Value::to_float(row[column_of(chunk, i)]) : 0.0f;
  };
  // Items column-chunk-major (all neurons of one 256-column chunk, then the next): the warps in flight
  // gather one chunk of x and dy (2 * M * 512 bytes: 16 MB at M = 16384), which L2 holds, where
  // neuron-major items gathered all of x and dy (128 MB) at once from DRAM (bench/README.md v52).
  // Each warp takes its next item from a counter (one atomicAdd per item, issued when the previous item
  // starts so that its latency hides behind that item's work) instead of every gwarps-th item: a hot
  // neuron's list is many times the mean (v53: 7136 of 16384 tokens on a real layer against ~800), and a
  // static share left the warps that drew several such items running long after the others. Which warp
  // sums an item changes nothing in the sum: the same bits.
  // The unpacked form (d_model % 8 != 0) holds 8 more registers per entry in flight: there the counter's
  // loop spilled (sm_80, and f16 on sm_90a), so it keeps the static share (every gwarps-th item).
  uint32_t* next_item = p.workspace + W::kItems;  // zeroed with the workspace's cleared words
  const long long items = static_cast<long long>(N) * CHUNKS;
  uint32_t claimed = 0u;
  if constexpr (VEC) claimed = lane == 0 ? atomicAdd(next_item, 1u) : 0u;
  for (long long item = VEC ? __shfl_sync(0xFFFFFFFFu, claimed, 0) : gwarp; item < items;
       item = VEC ? __shfl_sync(0xFFFFFFFFu, claimed, 0) : item + gwarps) {
    if constexpr (VEC) claimed = lane == 0 ? atomicAdd(next_item, 1u) : 0u;  // the next one, in flight during this one
    const int chunk = static_cast<int>(item / N), j = static_cast<int>(item % N);
    const uint32_t begin = load_l2_u32(starts + j), end = load_l2_u32(starts + j + 1);
    const bool poison = load_l2_u32(flags + j / TILE_N) != 0u;
    float ag[8], au[8], ad[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) ag[i] = au[i] = ad[i] = 0.0f;
    // 64-bit positions: e0 + 32 cannot wrap past a list that ends near 2^32.
    for (long long e0 = poison ? end : begin; e0 < end; e0 += 32) {
      const int n = end - e0 < 32 ? static_cast<int>(end - e0) : 32;
      uint32_t token = 0;
      float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (lane < n) {
        const uint2 entry = load_l2_pair(p.entry_list + 2 * (e0 + lane));
        token = entry.x;
        q = entry.y < quad_base ? *reinterpret_cast<const float4*>(p.entry_grad + 4 * static_cast<long long>(entry.y))
                                : *reinterpret_cast<const float4*>(p.backup_grad + 4 * (entry.y - quad_base));
      }
      // Entry k of these 32 (past n: a repeat of the last, loaded but not summed): its token; dg, du, h.
      auto take = [&](int k, float& dg, float& du, float& h) -> long long {
        k = k < n ? k : n - 1;
        dg = __shfl_sync(0xFFFFFFFFu, q.x, k);
        du = __shfl_sync(0xFFFFFFFFu, q.y, k);
        h = __shfl_sync(0xFFFFFFFFu, q.z, k);
        return __shfl_sync(0xFFFFFFFFu, token, k);
      };
      if constexpr (VEC) {
        // The 16-byte chunks stay packed until their FMAs (4 registers per 8 values, not 8): VEC_UNROLL
        // entries' x and dy chunks in flight within the 128 registers of 512 threads per SM.
        for (int k0 = 0; k0 < n; k0 += VEC_UNROLL) {
          uint4 xr[VEC_UNROLL], dr[VEC_UNROLL];
          float dg[VEC_UNROLL], du[VEC_UNROLL], h[VEC_UNROLL];
          const int k_first = chunk * COLUMNS + lane * 8;
#pragma unroll
          for (int u = 0; u < VEC_UNROLL; ++u) {
            const long long t = take(k0 + u, dg[u], du[u], h[u]);
            xr[u] = k_first < K ? *reinterpret_cast<const uint4*>(p.x + t * p.ldx + k_first) : uint4{0u, 0u, 0u, 0u};
            dr[u] = k_first < K ? *reinterpret_cast<const uint4*>(p.dy + t * p.lddy + k_first) : uint4{0u, 0u, 0u, 0u};
          }
#pragma unroll
          for (int u = 0; u < VEC_UNROLL; ++u) {
            if (k0 + u >= n) break;
            const uint32_t xw[4] = {xr[u].x, xr[u].y, xr[u].z, xr[u].w}, dw[4] = {dr[u].x, dr[u].y, dr[u].z, dr[u].w};
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const float xv = Value::to_float(static_cast<uint16_t>(xw[i / 2] >> (16 * (i % 2))));
              const float dyv = Value::to_float(static_cast<uint16_t>(dw[i / 2] >> (16 * (i % 2))));
              ag[i] = fmaf(dg[u], xv, ag[i]);
              if constexpr (GATED) au[i] = fmaf(du[u], xv, au[i]);
              ad[i] = fmaf(h[u], dyv, ad[i]);
            }
          }
        }
        continue;
      }
      for (int k0 = 0; k0 < n; k0 += UNROLL) {
        float xv[UNROLL][8], dyv[UNROLL][8], dg[UNROLL], du[UNROLL], h[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const long long t = take(k0 + u, dg[u], du[u], h[u]);
          load8(p.x + t * p.ldx, chunk, xv[u]);
          load8(p.dy + t * p.lddy, chunk, dyv[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          if (k0 + u >= n) break;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            ag[i] = fmaf(dg[u], xv[u][i], ag[i]);
            if constexpr (GATED) au[i] = fmaf(du[u], xv[u][i], au[i]);
            ad[i] = fmaf(h[u], dyv[u][i], ad[i]);
          }
        }
      }
    }
    const float nan = __uint_as_float(0x7FC00000u);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int k = column_of(chunk, i);
      if (k >= K) continue;
      const float values[3] = {poison ? nan : ag[i], poison ? nan : ad[i], poison ? nan : au[i]};
      for (int mtx = 0; mtx < (GATED ? 3 : 2); ++mtx) {
        void* base = mtx == 0 ? p.dw_gate : mtx == 1 ? p.dw_down : p.dw_up;
        const long long at = static_cast<long long>(j) * (mtx == 0 ? p.ld_dw_gate : mtx == 1 ? p.ld_dw_down : p.ld_dw_up) + k;
        if (p.output_dtype)
          static_cast<uint16_t*>(base)[at] = Value::from_float(values[mtx]);
        else
          static_cast<float*>(base)[at] = values[mtx];
      }
    }
  }
}

}  // namespace twell::device
