// Consumer: for one token row x,
//   y = sum over active j of  (g_j * (x . Wu_j)) * Wd[:, j]     (Config::gated)
//   y = sum over active j of  g_j * Wd[:, j]                    (non-gated: twell.down)
// where the active set {j, g_j} is read from the TwELL tile-rows the gate kernel wrote (paper §3: the
// up projection is computed only for active neurons, so both the up and the down projection are
// sparse). One CTA per token row. The row's active entries are gathered into a shared-memory list,
// tiles in ascending order and entries in ascending column order, up to kChunk entries at a time;
// each chunk then gets its up projection (one warp per neuron) and its down projection (one thread
// per output column, ascending j), so the fp32 sums run in the same order every time (bitwise
// deterministic) and the CTA synchronizes per chunk, not per tile.
//
// Overflowing tile-rows (nnz > slots) are read densely from the backup area, or, when the backup was
// full, recomputed from x and Wg: exact for every input (TWELL_FORMAT.md, requirement 1).
//
// The down weight is best read as rows of Wd^T ([d_ff, d_model], in_out): coalesced. The runtime
// transposes an nn.Linear (out_in) Wd into that layout on the stream before the launch (runtime/src/plan_launch.cpp).
#pragma once
#include "twell/device/consumer/consumer_common.cuh"
#include "twell/device/consumer/gated_down_block.cuh"

namespace twell::device {

template <class Config>
__device__ __forceinline__ void gated_down_cta(const GatedDownParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int THREADS = Config::threads;
  constexpr int WARPS = THREADS / 32;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  // With the tensor-core gate, K % 8 == 0 and the runtime guarantees 16-byte aligned rows of x, Wu and
  // Wd^T (FfnPlan::run checks them): every load is then 16 bytes wide, 8 values, and each thread owns
  // 8 consecutive outputs per step. Otherwise 2-byte loads, one output per thread per step.
  constexpr bool kVector = Config::gate_mainloop >= 1 && Config::down_in_out;
  constexpr int Y_WIDTH = kVector ? 8 : 1;
  constexpr int Y_STEPS = (K + THREADS * Y_WIDTH - 1) / (THREADS * Y_WIDTH);
  constexpr int Y_PER_THREAD = Y_STEPS * Y_WIDTH;
  constexpr int kChunk = TILE_N > 1024 ? TILE_N : 1024;  // entries gathered before a projection pass

  __shared__ int active_col[kChunk];       // column in d_ff of each gathered entry
  __shared__ float active_h[kChunk];       // g_j, then g_j * u_j
  __shared__ uint16_t dense_tile[TILE_N];  // an overflowing tile-row, activated, from backup or recomputed
  __shared__ int overflow_count;           // entries warp 0 appended from an overflowing tile-row
  // The row's nnz headers, loaded by all threads at once (one memory latency, not one per tile).
  constexpr int kHeaderWindow = TILES < 1024 ? TILES : 1024;
  __shared__ uint32_t tile_nnz[kHeaderWindow];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int64_t row = blockIdx.x;
  if (row >= p.m) return;
  const uint16_t* x = p.x + row * p.ldx;
  const uint32_t* twell_row = p.twell + row * WORDS_PER_ROW;

  float y[Y_PER_THREAD];
#pragma unroll
  for (int q = 0; q < Y_PER_THREAD; ++q) y[q] = 0.0f;
  float row_l1 = 0.0f;  // thread 0's sum of |h_j| (GatedDownParams::row_l1)

  // Up and down projections of the gathered entries [0, count); leaves the list free for reuse.
  auto project = [&](int count) {
    __syncthreads();  // the gathered list is complete
    if constexpr (Config::gated) {  // non-gated: h_j = g_j as gathered
      for (int e = warp; e < count; e += WARPS) {
        const uint16_t* wu = p.w_up + static_cast<int64_t>(active_col[e]) * p.ldwu;
        const float u = kVector ? warp_dot_16B<Value, K>(x, wu, lane) : warp_dot<Value, K>(x, wu, lane);
        if (lane == 0) active_h[e] *= u;
      }
      __syncthreads();  // every h_j is final
    }
    // The row's L1 term (GatedDownParams::row_l1), in entry order by one thread: a few dozen adds
    // per chunk at training densities, the same order as the warp-per-row consumer's.
    if (p.row_l1 != nullptr && tid == 0)
      for (int i = 0; i < count; ++i) row_l1 += fabsf(active_h[i]);
    int e = 0;
    if constexpr (kVector) {
      // Four neurons' Wd^T rows in flight before their FMAs (the loads, not the math, bound this
      // loop); the FMAs still run in ascending j, so the sums keep their order.
      constexpr int kBatch = 4;
      for (; e + kBatch <= count; e += kBatch) {
        uint4 v[kBatch][Y_STEPS];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const uint16_t* wd = p.w_down + static_cast<int64_t>(active_col[e + b]) * p.ldwd;
#pragma unroll
          for (int q = 0; q < Y_STEPS; ++q) {
            const int i = (tid + q * THREADS) * 8;
            v[b][q] = i < K ? *reinterpret_cast<const uint4*>(wd + i) : uint4{0u, 0u, 0u, 0u};
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const float h = active_h[e + b];
#pragma unroll
          for (int q = 0; q < Y_STEPS; ++q) axpy8<Value>(&y[q * 8], h, v[b][q]);
        }
      }
    }
    for (; e < count; ++e) {
      const float h = active_h[e];
      const int64_t j = active_col[e];
      if constexpr (kVector) {
        const uint16_t* wd = p.w_down + j * p.ldwd;
#pragma unroll
        for (int q = 0; q < Y_STEPS; ++q) {
          const int i = (tid + q * THREADS) * 8;
          if (i < K) axpy8<Value>(&y[q * 8], h, *reinterpret_cast<const uint4*>(wd + i));
        }
        continue;
      }
#pragma unroll
      for (int q = 0; q < Y_PER_THREAD; ++q) {
        const int i = tid + q * THREADS;
        if (i < K) {
          // in_out: row j of Wd^T, coalesced. out_in: column j of Wd, one sector per element (slow;
          // the runtime transposes out_in weights first, so only ahead-of-time users see this path).
          const uint16_t w =
              Config::down_in_out ? p.w_down[j * p.ldwd + i] : p.w_down[static_cast<int64_t>(i) * p.ldwd + j];
          y[q] = fmaf(h, Value::to_float(w), y[q]);
        }
      }
    }
    __syncthreads();  // the list may be overwritten
  };

  int count = 0;  // entries gathered so far in this chunk; uniform across the CTA
  for (int window = 0; window < TILES; window += kHeaderWindow) {
    const int window_end = window + kHeaderWindow < TILES ? window + kHeaderWindow : TILES;
    __syncthreads();  // the previous window's headers are no longer read
    for (int t = window + tid; t < window_end; t += THREADS) tile_nnz[t - window] = twell_row[t * (SLOTS + 1)];
    __syncthreads();
    for (int tile = window; tile < window_end; ++tile) {
      const uint32_t* header = twell_row + tile * (SLOTS + 1);
      const uint32_t nnz = tile_nnz[tile - window];  // the same for every thread: uniform control flow
      if (nnz == 0) continue;
      const int n0 = tile * TILE_N;
      const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
      const int most = nnz <= SLOTS ? static_cast<int>(nnz) : valid_n;
      if (count + most > kChunk) {
        project(count);
        count = 0;
      }
      if (nnz <= SLOTS) {
        for (int e = tid; e < static_cast<int>(nnz); e += THREADS) {
          const uint32_t word = header[1 + e];
          active_col[count + e] = n0 + static_cast<int>(word & 0xFFFFu);
          active_h[count + e] = Value::to_float(static_cast<uint16_t>(word >> 16));
        }
        count += static_cast<int>(nnz);
        continue;
      }
      const uint32_t slot = header[1];
      __syncthreads();  // dense_tile may still be read by warp 0 for the previous overflowing tile-row
      load_overflow_tile<Config>(p, slot, x, n0, valid_n, dense_tile, tid, THREADS, 0, WARPS);
      __syncthreads();
      if (warp == 0) {
        const int added = list_active_columns<Config>(dense_tile, valid_n, n0, active_col, active_h, count, lane);
        if (lane == 0) overflow_count = added;
      }
      __syncthreads();
      count += overflow_count;
    }
  }
  if (count > 0) project(count);
  if (p.row_l1 != nullptr && tid == 0) p.row_l1[row] = row_l1;

#pragma unroll
  for (int q = 0; q < Y_PER_THREAD; ++q) {
    const int i = kVector ? (tid + q / 8 * THREADS) * 8 + q % 8 : tid + q * THREADS;
    if (i < K) p.y[row * p.ldy + i] = Value::from_float(y[q]);
  }
}

// Warp-per-row consumer (Config::cta_m = threads / 32; after a tensor-core gate, in_out down weights,
// d_model % 8 == 0 and <= 2048). Persistent: the launcher starts at most as many CTAs as fit on the
// GPU at once (KernelSource::persistent), and each warp claims rows one at a time from a counter
// (p.row_counter), so the GPU stays busy to the last row however unevenly the rows' nnz fall, and a
// row's serial start is short:
//   - while a warp computes one row it has already claimed the next and prefetched that row's x and
//     first nnz headers into L2 (`prefetch.global.L2`: no registers held; x and the TwELL matrix
//     otherwise come from DRAM);
//   - a row's entry words are fetched 32 at a time by all lanes at once (lane l finds the tile of entry
//     base + l from the prefix sums of the header counts): one round trip per 32 entries, not one per
//     active tile (at 0.5% density a row has ~28 entries in ~16 tiles).
// Per row: x in shared memory, fp32 y in registers (lane l holds columns 8l + 256i .. +7); entries go
// in tile then column order, two at a time: the 16-byte loads of both entries' Wu and Wd^T rows are
// issued together (four L2 round trips overlapped), x . Wu_j is reduced over the warp (butterfly: every
// lane gets the same bits), and h_j * Wd^T_j is added to y (non-gated, twell.down: h_j = g_j, four
// entries' Wd^T rows at a time). Overflowing tile-rows come from the backup
// or are recomputed by the warp with the gate's arithmetic (recompute_gate_tile), then scanned 32
// columns per ballot. Sums run in entry order: bitwise deterministic whichever warp takes a row.
// Registers are at the limit (254, no spills: kernel_resources_test): the next row waits in shared
// memory, and the 32-tile window is recomputed from the walk's position, rather than held.
// Entries whose weight rows one warp of gated_down_warp loads together: two gated (their Wu and Wd^T
// rows, 128 registers), four non-gated (Wd^T rows only).
template <class Config>
inline constexpr int kWarpRowInFlight = Config::gated ? 2 : 4;

template <class Config>
__device__ __forceinline__ void gated_down_warp(const GatedDownParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int WARPS = Config::threads / 32;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr int XS = (K + 255) / 256;  // 16-byte chunks per lane
  constexpr uint32_t FULL = 0xFFFFFFFFu;
  static_assert(Config::cta_m == WARPS && Config::gate_mainloop >= 1 && Config::down_in_out && K % 8 == 0 && XS <= 8,
                "warp-per-row consumer: cta_m = warps, tensor-core gate, in_out Wd, d_model % 8 == 0 and <= 2048");
  __shared__ uint16_t dense_tiles[WARPS][TILE_N];  // an overflowing tile-row per warp (backup or recompute)
  __shared__ uint32_t next_row[WARPS];             // the row each warp claimed to take after its current one
  // GatedDownParams::entry_u_after_words: lane 0's count of the row's entries so far, in shared memory (the
  // registers are at the limit); the row's o-th entry stores u at element o of its row while o < words_per_row.
  __shared__ uint32_t u_ordinal[WARPS];
  // Dynamic: the warps' x rows, XS * 256 values each (shared memory, not registers: two entries' loads in
  // flight need the registers; the host sizes it by the same shared_memory.h function).
  extern __shared__ __align__(128) unsigned char smem[];
  require_dynamic_smem(shared_memory::warp_row_consumer_bytes(K, WARPS));  // the x rows (XS * 256 values per warp)

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Rows are claimed one at a time from p.row_counter (zeroed by the launcher), so warps that drew
  // light rows take more of them: real rows' nnz vary several-fold.
  uint32_t row = 0;
  if (lane == 0) row = atomicAdd(p.row_counter, 1u);
  row = __shfl_sync(FULL, row, 0);
  if (row >= p.m) return;  // whole warps leave; nothing below synchronizes the CTA
  uint16_t* const xs = reinterpret_cast<uint16_t*>(smem) + warp * XS * 256;
  auto in_k = [&](int i) { return (8 * lane + 256 * i) < K; };
  // Lane l: the nnz header of tile window + l of row r (0 past the last tile).
  auto load_headers = [&](int64_t r, int window) -> uint32_t {
    const int tile = window + lane;
    return tile < TILES ? __ldg(p.twell + r * WORDS_PER_ROW + static_cast<int64_t>(tile) * (SLOTS + 1)) : 0u;
  };

  float y[XS * 8];
  // The row's sum of |h_j| in entry order (GatedDownParams::row_l1; every lane holds the same bits).
  float row_l1 = 0.0f;
  // Active entries (column j of d_ff, activated gate value g), P at a time: the 16-byte loads of all P
  // Wu rows and Wd^T rows are issued before any math, so P neurons' L2 round trips overlap. y is then
  // updated entry by entry in order: the same sums as one at a time. Non-gated (h_j = g_j): only the
  // Wd^T rows, four entries at a time (their registers are what two gated entries' Wu rows take).
  constexpr int IN_FLIGHT = kWarpRowInFlight<Config>;
  // (The parameters' bound is the namespace-scope constant: a local constexpr there crashes NVRTC
  // 13.0's front end, on d_model 520 f16 at least.)
  auto entries = [&](auto count, const int (&j)[kWarpRowInFlight<Config>], const float (&g)[kWarpRowInFlight<Config>]) {
    constexpr int P = decltype(count)::value;
    if constexpr (!Config::gated) {
      uint4 d4[P][XS];
#pragma unroll
      for (int q = 0; q < P; ++q) {
        const uint16_t* wd = p.w_down + static_cast<int64_t>(j[q]) * p.ldwd + 8 * lane;
#pragma unroll
        for (int i = 0; i < XS; ++i) d4[q][i] = in_k(i) ? load_keep_in_l2(wd + 256 * i) : uint4{0u, 0u, 0u, 0u};
      }
#pragma unroll
      for (int q = 0; q < P; ++q) {
        row_l1 += fabsf(g[q]);
#pragma unroll
        for (int i = 0; i < XS; ++i) axpy8<Value>(&y[8 * i], g[q], d4[q][i]);
      }
      return;
    }
    uint4 u4[P][XS], d4[P][XS];
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const uint16_t* wu = p.w_up + static_cast<int64_t>(j[q]) * p.ldwu + 8 * lane;
      const uint16_t* wd = p.w_down + static_cast<int64_t>(j[q]) * p.ldwd + 8 * lane;
#pragma unroll
      for (int i = 0; i < XS; ++i) {
        u4[q][i] = in_k(i) ? load_keep_in_l2(wu + 256 * i) : uint4{0u, 0u, 0u, 0u};
        d4[q][i] = in_k(i) ? load_keep_in_l2(wd + 256 * i) : uint4{0u, 0u, 0u, 0u};
      }
    }
#pragma unroll
    for (int q = 0; q < P; ++q) {
      float u = 0.0f;
#pragma unroll
      for (int i = 0; i < XS; ++i) u = dot8<Value>(*reinterpret_cast<const uint4*>(xs + 8 * lane + 256 * i), u4[q][i], u);
      u = warp_sum(u);
      if (p.entry_u_after_words != 0u && lane == 0) {
        const uint32_t o = u_ordinal[warp];
        float* const entry_u = reinterpret_cast<float*>(const_cast<uint32_t*>(p.twell) + p.m * WORDS_PER_ROW);
        if (o < static_cast<uint32_t>(WORDS_PER_ROW)) entry_u[static_cast<int64_t>(row) * WORDS_PER_ROW + o] = u;
        u_ordinal[warp] = o + 1;
      }
      const float h = g[q] * u;
      row_l1 += fabsf(h);
#pragma unroll
      for (int i = 0; i < XS; ++i) axpy8<Value>(&y[8 * i], h, d4[q][i]);
    }
  };
  // Entries arrive one by one (in order); IN_FLIGHT go out together, a row's last ones as they are.
  int pending_j[IN_FLIGHT] = {};
  float pending_g[IN_FLIGHT] = {};
  int waiting = 0;       // non-gated: entries in pending_*
  bool pending = false;  // gated: an entry in pending_*[0]
  auto entry = [&](int j, float g) {
    if constexpr (!Config::gated) {
#pragma unroll
      for (int q = 0; q < IN_FLIGHT; ++q)  // constant indices: the arrays stay in registers
        if (q == waiting) {
          pending_j[q] = j;
          pending_g[q] = g;
        }
      if (++waiting == IN_FLIGHT) {
        entries(integral_constant<int, IN_FLIGHT>{}, pending_j, pending_g);
        waiting = 0;
      }
      return;
    }
    if (!pending) {
      pending_j[0] = j;
      pending_g[0] = g;
      pending = true;
      return;
    }
    pending_j[1] = j;
    pending_g[1] = g;
    entries(integral_constant<int, 2>{}, pending_j, pending_g);
    pending = false;
  };

  for (;;) {
    // The next row, claimed now; its x and first 32 nnz header lines are prefetched into L2 once the
    // claim has returned (after this row's first entry words: the claim's round trip off the path).
    uint32_t claimed = 0;
    if (lane == 0) claimed = atomicAdd(p.row_counter, 1u);
    {
      const uint16_t* x = p.x + static_cast<int64_t>(row) * p.ldx + 8 * lane;
#pragma unroll
      for (int i = 0; i < XS; ++i)
        *reinterpret_cast<uint4*>(xs + 8 * lane + 256 * i) = in_k(i) ? *reinterpret_cast<const uint4*>(x + 256 * i) : uint4{0u, 0u, 0u, 0u};
    }
    __syncwarp();  // x is in shared memory for every lane
#pragma unroll
    for (int i = 0; i < XS * 8; ++i) y[i] = 0.0f;
    row_l1 = 0.0f;
    if (lane == 0) u_ordinal[warp] = 0;

    // Tiles are walked in windows of 32 (lane t holds tile window + t's header). The walk's position
    // is one register, pos = window * 64 + (b + 1) with b the last tile walked in the window (-1 at its
    // start): window and b each held apart spill one register on the multi-window shapes.
#pragma unroll 1
    for (int pos = 0; pos / 64 * 32 < TILES; pos = (pos / 64 + 1) * 64) {
      const int window = pos / 64 * 32;
      // Lane t: the nnz header of tile window + t, and the end of its entries when the window's packed
      // entries (tiles within their slots) are numbered in tile order: [end - count, end).
      const uint32_t my_nnz = load_headers(static_cast<int64_t>(row), window);
      uint32_t end = my_nnz <= SLOTS ? my_nnz : 0u;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(FULL, end, o);
        if (lane >= o) end += v;
      }
      // Lane l loads the word of entry e0 + l (e0 % 32 == 0): its tile t is the number of tiles whose
      // entries all lie before it (binary search over the prefix sums, by shuffles).
      auto fetch = [&](uint32_t e0) -> uint32_t {
        const uint32_t e = e0 + lane;
        int t = 0;
#pragma unroll
        for (int step = 16; step > 0; step >>= 1)
          if (__shfl_sync(FULL, end, t + step - 1) <= e) t += step;
        const uint32_t nnz_t = __shfl_sync(FULL, my_nnz, t);  // t = 32 (past the last entry): unused
        const uint32_t first = __shfl_sync(FULL, end, t) - (nnz_t <= SLOTS ? nnz_t : 0u);
        return e < __shfl_sync(FULL, end, 31)
                   ? __ldg(p.twell + static_cast<int64_t>(row) * WORDS_PER_ROW + static_cast<int64_t>(pos / 64 * 32 + t) * (SLOTS + 1) + 1 + (e - first))
                   : 0u;
      };
      uint32_t words = fetch(0);  // the words of entries [e & ~31, (e & ~31) + 32)
      if (window == 0) {
        const uint32_t next = __shfl_sync(FULL, claimed, 0);
        if (lane == 0) next_row[warp] = next;
        if (next < p.m) {
          const char* xn = reinterpret_cast<const char*>(p.x + static_cast<int64_t>(next) * p.ldx);
          for (int b = 128 * lane; b < K * 2; b += 128 * 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(xn + b));
          if (lane < TILES)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p.twell + static_cast<int64_t>(next) * WORDS_PER_ROW + lane * (SLOTS + 1)));
        }
      }
      // The active tiles in order: each step takes the first one after the last (a ballot per step
      // instead of a mask held across the loop: one register fewer).
      for (;;) {
        const uint32_t busy = __ballot_sync(FULL, my_nnz != 0 && lane >= pos % 64);
        if (busy == 0) break;
        const int b = __ffs(busy) - 1;
        pos = pos / 64 * 64 + b + 1;
        const int tile = pos / 64 * 32 + b;
        const uint32_t nnz = __shfl_sync(FULL, my_nnz, b);
        const int n0 = tile * TILE_N;
        if (nnz <= SLOTS) {
          const uint32_t last = __shfl_sync(FULL, end, b);
          for (uint32_t e = last - nnz; e < last; ++e) {
            if (e % 32 == 0 && e > 0) words = fetch(e);  // one round trip per 32 entries
            const uint32_t w = __shfl_sync(FULL, words, static_cast<int>(e % 32));
            entry(n0 + static_cast<int>(w & 0xFFFFu), Value::to_float(static_cast<uint16_t>(w >> 16)));
          }
          continue;
        }
        // Overflowing tile-row: its dense activated values, then every active column in order.
        const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
        const uint32_t slot = p.twell[static_cast<int64_t>(row) * WORDS_PER_ROW + static_cast<int64_t>(tile) * (SLOTS + 1) + 1];
        uint16_t* dense_tile = dense_tiles[warp];
        load_overflow_tile<Config>(p, slot, p.x + static_cast<int64_t>(row) * p.ldx, n0, valid_n, dense_tile, lane, 32, warp, 1);
        __syncwarp();
        for (int c0 = 0; c0 < valid_n; c0 += 32) {
          const int c = c0 + lane;
          const uint16_t v = c < valid_n ? dense_tile[c] : static_cast<uint16_t>(0);
          uint32_t active = __ballot_sync(FULL, c < valid_n && is_active<Value, Config::activation>(v, Config::threshold));
          while (active != 0) {
            const int bit = __ffs(active) - 1;
            active &= active - 1;
            entry(n0 + c0 + bit, Value::to_float(__shfl_sync(FULL, v, bit)));
          }
        }
        __syncwarp();  // dense_tile is free for the next overflowing tile-row
      }
    }
    if constexpr (Config::gated) {
      if (pending) entries(integral_constant<int, 1>{}, pending_j, pending_g);
      pending = false;
    } else {
      if (waiting == 1) entries(integral_constant<int, 1>{}, pending_j, pending_g);
      if (waiting == 2) entries(integral_constant<int, 2>{}, pending_j, pending_g);
      if (waiting == 3) entries(integral_constant<int, 3>{}, pending_j, pending_g);
      waiting = 0;
    }

    if (p.row_l1 != nullptr && lane == 0) p.row_l1[row] = row_l1;
    uint16_t* out = p.y + static_cast<int64_t>(row) * p.ldy + 8 * lane;
#pragma unroll
    for (int i = 0; i < XS; ++i) {
      if (!in_k(i)) continue;
      uint32_t w[4];
#pragma unroll
      for (int t = 0; t < 4; ++t)
        w[t] = static_cast<uint32_t>(Value::from_float(y[8 * i + 2 * t])) |
               (static_cast<uint32_t>(Value::from_float(y[8 * i + 2 * t + 1])) << 16);
      *reinterpret_cast<uint4*>(out + 256 * i) = uint4{w[0], w[1], w[2], w[3]};
    }
    __syncwarp();  // every lane is done with this row's x before the next row overwrites it; next_row
    row = next_row[warp];  // is visible
    if (row >= p.m) break;
  }
}

// The variant is the config's `consumer` (#twell.config consumer = cta_row (1), warp_row (2),
// token_block (3)): 16 token rows per CTA on tensor cores, one row per warp, or one row per CTA.
template <class Config>
__device__ __forceinline__ void gated_down(const GatedDownParams& p) {
  static_assert(Config::consumer >= 1 && Config::consumer <= 3, "consumer: cta_row (1), warp_row (2) or token_block (3)");
  if constexpr (Config::consumer == 3)
    gated_down_block<Config>(p);
  else if constexpr (Config::consumer == 2)
    gated_down_warp<Config>(p);
  else
    gated_down_cta<Config>(p);
}

}  // namespace twell::device
