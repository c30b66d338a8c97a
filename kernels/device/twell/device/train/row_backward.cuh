// The training backward of the sparse gated FFN by token row (design/TRAINING.md, "The gradients"; the
// CPU oracle is twell/training_reference.h). For one token row t and the forward's TwELL matrix of
// a = act(g), per active entry j (in the row consumer's order: tiles ascending, columns ascending):
//   dh = dy_t . Wd^T_j  (+ l1_scale * sign(h) where the L1 term is on),  u = x_t . Wu_j,  h = a u,
//   du = dh a,  dg = (dh u) act'(g)       (non-gated: h = a, dg = dh act'(g), no du)
//   dx_t = sum_j du Wu_j + dg Wg_j        (one fp32 accumulator per column, du's term before dg's)
// act'(g) is 1 for ReLU on its active set; for SiLU, g is recomputed from x and Wg with the gate
// kernel's arithmetic (recompute_gate_tile's chain, eight entries per mma), so it is the gate's g bit
// for bit. Overflowing tile-rows are read from the backup or recomputed exactly as the row consumer
// does (load_overflow_tile): the support is the forward's whatever the backup capacity was.
//
// One CTA per token row (gated_down_cta's structure): the row's entries are gathered into shared memory
// in chunks; per chunk one warp per entry computes the two dot products (butterfly reduction: every
// lane gets the same bits), writes the entry's {dg, du, h, a} where TrainRowBackwardParams says (one
// 16-byte store: what the weight gradients' kernel, train/weight_grad.cuh, reads), and then
// every thread adds the chunk's terms to its dx columns in entry order. Bitwise deterministic: no
// atomics touch a value (the only atomic claims grad rows for tile-rows the forward could not back up,
// and which row a tile-row gets does not change any value).
#pragma once
#include "twell/device/consumer/consumer_common.cuh"

namespace twell::device {

template <class Config>
__device__ __forceinline__ void train_row_backward_cta(const TrainRowBackwardParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int THREADS = Config::threads;
  constexpr int WARPS = THREADS / 32;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr bool kVector = Config::vector;  // d_model % 8 == 0 and 16-byte aligned rows (the host checks)
  constexpr int X_WIDTH = kVector ? 8 : 1;
  constexpr int X_STEPS = (K + THREADS * X_WIDTH - 1) / (THREADS * X_WIDTH);
  constexpr int X_PER_THREAD = X_STEPS * X_WIDTH;
  constexpr int kChunk = TILE_N > 512 ? TILE_N : 512;
  // Entries whose weight rows are loaded before their FMAs in the dx pass (the loads bound it), as many
  // as keep the registers in bounds at this d_model.
  constexpr int kBatch = X_STEPS == 1 ? 4 : X_STEPS == 2 ? 2 : 1;
  static_assert(THREADS == 256 && Config::cta_m == 1, "the CTA-per-row backward: 256 threads, one row per CTA");
  static_assert(!kVector || K % 8 == 0, "16-byte rows need d_model % 8 == 0");
  static_assert(Config::gate_mainloop == 0 || K % 8 == 0, "a tensor-core gate's recompute needs d_model % 8 == 0");
  // Where an entry's {dg, du, h, a} goes: >= 0 a quad of entry_grad, < 0 the quad -1 - out of backup_grad,
  // kNowhere when backup_grad had no room (the host sees it from grad_overflow_count).
  constexpr long long kNowhere = -(1ll << 62);

  __shared__ int active_col[kChunk];        // column j in d_ff
  __shared__ float active_a[kChunk];        // a_j
  __shared__ long long active_out[kChunk];  // where its gradients go
  __shared__ float active_slope[kChunk];    // act'(g_j) (SiLU)
  __shared__ float active_du[kChunk];
  __shared__ float active_dg[kChunk];
  __shared__ uint16_t dense_tile[TILE_N];  // an overflowing tile-row, activated
  __shared__ int overflow_added;
  __shared__ uint32_t grad_row;  // the backup_grad row of the current overflowing tile-row
  constexpr int kHeaderWindow = TILES < 1024 ? TILES : 1024;
  __shared__ uint32_t tile_nnz[kHeaderWindow];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int64_t row = blockIdx.x;
  if (row >= p.m) return;
  const uint16_t* x = p.x + row * p.ldx;
  const uint16_t* dy = p.dy + row * p.lddy;
  const uint32_t* twell_row = p.twell + row * WORDS_PER_ROW;
  // The recompute's view of the forward (load_overflow_tile reads these fields only).
  GatedDownParams gate{};
  gate.x = p.x;
  gate.w_gate = p.w_gate;
  gate.backup = p.backup;
  gate.ldx = p.ldx;
  gate.ldwg = p.ldwg;
  gate.backup_capacity = p.backup_capacity;

  float dx[X_PER_THREAD];
#pragma unroll
  for (int q = 0; q < X_PER_THREAD; ++q) dx[q] = 0.0f;

  // The gradients of the gathered entries [0, count), then their terms of dx; leaves the list free.
  auto backward = [&](int count) {
    __syncthreads();  // the gathered list is complete
    if constexpr (Config::activation == kSiLU) {
      if constexpr (Config::gate_mainloop >= 1) {
        // The gate's k16 mma chain (recompute_gate_tile) with eight entries as the n8 tile's columns:
        // each column's sums depend on its own B column only, so g is the gate's bits.
        constexpr int K_CHUNKS = (K + Config::gate_cta_k - 1) / Config::gate_cta_k * (Config::gate_cta_k / 16);
        auto pair = [](const uint16_t* r, int k) { return k < K ? *reinterpret_cast<const uint32_t*>(r + k) : 0u; };
        for (int e0 = warp * 8; e0 < count; e0 += WARPS * 8) {
          const int c = e0 + lane / 4;
          const bool valid = c < count;
          const uint16_t* w = p.w_gate + static_cast<int64_t>(valid ? active_col[c] : 0) * p.ldwg;
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          for (int kc = 0; kc < K_CHUNKS; ++kc) {
            const int k = kc * 16 + (lane % 4) * 2;
            const uint32_t a[4] = {lane < 4 ? pair(x, k) : 0u, 0u, lane < 4 ? pair(x, k + 8) : 0u, 0u};
            mma_16816<Value>(d, a, valid ? pair(w, k) : 0u, valid ? pair(w, k + 8) : 0u);
          }
          if (lane < 4) {
            const int e = e0 + lane * 2;
            if (e < count) active_slope[e] = silu_derivative(Value::to_float(Value::from_float(d[0])));
            if (e + 1 < count) active_slope[e + 1] = silu_derivative(Value::to_float(Value::from_float(d[1])));
          }
        }
      } else {
        // The gate's fma chain: ascending k, one thread per entry.
        for (int e = tid; e < count; e += THREADS) {
          const uint16_t* w = p.w_gate + static_cast<int64_t>(active_col[e]) * p.ldwg;
          float g = 0.0f;
          for (int k = 0; k < K; ++k) g = fmaf(Value::to_float(x[k]), Value::to_float(w[k]), g);
          active_slope[e] = silu_derivative(Value::to_float(Value::from_float(g)));
        }
      }
      __syncthreads();
    }
    for (int e = warp; e < count; e += WARPS) {
      const int64_t j = active_col[e];
      const uint16_t* wd = p.w_down + j * p.ldwd;
      float dh = kVector ? warp_dot_16B<Value, K>(dy, wd, lane) : warp_dot<Value, K>(dy, wd, lane);
      const float a = active_a[e];
      float u = 0.0f, h = a;
      if constexpr (Config::gated) {
        const uint16_t* wu = p.w_up + j * p.ldwu;
        u = kVector ? warp_dot_16B<Value, K>(x, wu, lane) : warp_dot<Value, K>(x, wu, lane);
        h = a * u;
      }
      // The L1 coefficient: l1_scale, times the device scalar l1_weight where given (autograd's
      // gradient of the L1 term, read here rather than on the host: no synchronization).
      if (p.apply_l1) dh = dh + (p.l1_weight != nullptr ? p.l1_scale * *p.l1_weight : p.l1_scale) * sign_of(h);
      const float slope = Config::activation == kSiLU ? active_slope[e] : 1.0f;
      const float du = Config::gated ? dh * a : 0.0f;
      const float dg = Config::gated ? (dh * u) * slope : dh * slope;
      if (lane == 0) {
        active_du[e] = du;
        active_dg[e] = dg;
        const long long out = active_out[e];
        if (out != kNowhere) {
          float* at = out >= 0 ? p.entry_grad + 4 * out : p.backup_grad + 4 * (-1 - out);
          *reinterpret_cast<float4*>(at) = make_float4(dg, du, h, a);
        }
      }
    }
    __syncthreads();  // every du, dg is in shared memory
    // dx += du Wu_j + dg Wg_j, entries in order; kBatch entries' rows loaded before their FMAs.
    int e = 0;
    if constexpr (kVector) {
      for (; e + kBatch <= count; e += kBatch) {
        uint4 vu[kBatch][X_STEPS], vg[kBatch][X_STEPS];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int64_t j = active_col[e + b];
#pragma unroll
          for (int q = 0; q < X_STEPS; ++q) {
            const int i = (tid + q * THREADS) * 8;
            vg[b][q] = i < K ? *reinterpret_cast<const uint4*>(p.w_gate + j * p.ldwg + i) : uint4{0u, 0u, 0u, 0u};
            if constexpr (Config::gated)
              vu[b][q] = i < K ? *reinterpret_cast<const uint4*>(p.w_up + j * p.ldwu + i) : uint4{0u, 0u, 0u, 0u};
            else
              vu[b][q] = uint4{0u, 0u, 0u, 0u};  // unused
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const float du = active_du[e + b], dg = active_dg[e + b];
#pragma unroll
          for (int q = 0; q < X_STEPS; ++q) {
            // Per column: du's term, then dg's (the reference's order), one fma each.
            const uint32_t wu[4] = {vu[b][q].x, vu[b][q].y, vu[b][q].z, vu[b][q].w};
            const uint32_t wg[4] = {vg[b][q].x, vg[b][q].y, vg[b][q].z, vg[b][q].w};
#pragma unroll
            for (int t = 0; t < 8; ++t) {
              const uint16_t ub = static_cast<uint16_t>(wu[t / 2] >> (16 * (t % 2)));
              const uint16_t gb = static_cast<uint16_t>(wg[t / 2] >> (16 * (t % 2)));
              float& acc = dx[q * 8 + t];
              if constexpr (Config::gated) acc = fmaf(du, Value::to_float(ub), acc);
              acc = fmaf(dg, Value::to_float(gb), acc);
            }
          }
        }
      }
    }
    for (; e < count; ++e) {
      const int64_t j = active_col[e];
      const float du = active_du[e], dg = active_dg[e];
#pragma unroll
      for (int q = 0; q < X_PER_THREAD; ++q) {
        const int i = kVector ? (tid + q / 8 * THREADS) * 8 + q % 8 : tid + q * THREADS;
        if (i < K) {
          if constexpr (Config::gated) dx[q] = fmaf(du, Value::to_float(p.w_up[j * p.ldwu + i]), dx[q]);
          dx[q] = fmaf(dg, Value::to_float(p.w_gate[j * p.ldwg + i]), dx[q]);
        }
      }
    }
    __syncthreads();  // the list may be overwritten
  };

  int count = 0;  // entries gathered in this chunk; uniform across the CTA
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
        backward(count);
        count = 0;
      }
      const long long word0 = row * WORDS_PER_ROW + static_cast<long long>(tile) * (SLOTS + 1);
      if (nnz <= SLOTS) {
        for (int e = tid; e < static_cast<int>(nnz); e += THREADS) {
          const uint32_t word = header[1 + e];
          active_col[count + e] = n0 + static_cast<int>(word & 0xFFFFu);
          active_a[count + e] = Value::to_float(static_cast<uint16_t>(word >> 16));
          active_out[count + e] = word0 + 1 + e;
        }
        count += static_cast<int>(nnz);
        continue;
      }
      // Overflowing: its activated values (backup or recompute, as the consumer), its grad row, then
      // every active column in order (one ballot per 32 columns, by warp 0).
      const uint32_t slot = header[1];
      __syncthreads();  // dense_tile and grad_row may still be read for the previous overflowing tile-row
      load_overflow_tile<Config>(gate, slot, x, n0, valid_n, dense_tile, tid, THREADS, 0, WARPS);
      if (tid == 0) {
        uint32_t b = slot;
        if (slot == kBackupMissing || slot >= p.backup_capacity) {
          const uint32_t i = atomicAdd(p.grad_overflow_count, 1u);
          b = i < p.grad_capacity - p.backup_capacity ? p.backup_capacity + i : kBackupMissing;
        }
        grad_row = b;
        *reinterpret_cast<float4*>(p.entry_grad + 4 * (word0 + 1)) = make_float4(__uint_as_float(b), 0.0f, 0.0f, 0.0f);
      }
      __syncthreads();
      const uint32_t b = grad_row;
      if (b != kBackupMissing)
        for (int c = tid; c < TILE_N; c += THREADS)
          if (!(c < valid_n && is_active<Value, Config::activation>(dense_tile[c], Config::threshold)))
            *reinterpret_cast<float4*>(p.backup_grad + 4 * (static_cast<long long>(b) * TILE_N + c)) =
                make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (warp == 0) {
        int added = 0;
        for (int c0 = 0; c0 < valid_n; c0 += 32) {
          const int c = c0 + lane;
          const bool active = c < valid_n && is_active<Value, Config::activation>(dense_tile[c], Config::threshold);
          const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, active);
          if (active) {
            const int e = count + added + __popc(ballot & lanemask_lt());
            active_col[e] = n0 + c;
            active_a[e] = Value::to_float(dense_tile[c]);
            active_out[e] = b != kBackupMissing ? -1 - (static_cast<long long>(b) * TILE_N + c) : kNowhere;
          }
          added += __popc(ballot);
        }
        if (lane == 0) overflow_added = added;
      }
      __syncthreads();
      count += overflow_added;
    }
  }
  if (count > 0) backward(count);

  uint16_t* out = p.dx + row * p.lddx;
#pragma unroll
  for (int q = 0; q < X_PER_THREAD; ++q) {
    const int i = kVector ? (tid + q / 8 * THREADS) * 8 + q % 8 : tid + q * THREADS;
    if (i < K) out[i] = Value::from_float(dx[q]);
  }
}

// The warp-per-row form (Config::warp_row: ReLU, d_model % 8 == 0 and <= 2048, a tensor-core gate,
// tile_n <= 512; TrainRowBackwardConstraints::warpRow), the row consumer's (gated_down_warp) shape for the
// backward: persistent CTAs of Config::threads / 32 warps, warp w of the grid takes rows w, w + warps, ...
// It runs as two launches on the stream (TrainRowBackwardParams::pass): one pass holding dx and three weight
// rows per entry took 223 registers (2 CTAs per SM) and had one entry's rows in flight per warp; split, each
// pass keeps fewer values live and the dx pass loads two entries' rows at once (bench/README.md v45: 2.00
// -> 1.72 ms at M = 16384, 0.5%; smaller weight working sets per pass did not help, loads in flight did):
//   kTrainRowEntries: per row, x and dy wait in the warp's shared memory, the row's TwELL words are read a
//     window at a time (one coalesced load per lane and word group), and each active entry j, in the CTA
//     form's order, loads its Wd^T and Wu rows together (lane l: columns 8l + 256i .. +7), reduces
//     dh = dy . Wd^T_j and u = x . Wu_j over the warp and stores {dg, du, h, a} (Wd^T and Wu only); where
//     the forward kept u (TrainRowBackwardParams::entry_u, the consumer's bits) entries within their slots
//     read it and load Wd^T rows only, two entries at a time (an L2 prefetch of the next entry's rows was
//     slower: bench/README.md v47);
//   kTrainRowDx: per 1024-column slice of d_model (slices outermost; 32 fp32 dx values per lane), per row,
//     dx += du Wu_j + dg Wg_j over the row's entries from their quads, two entries' rows loaded before
//     their FMAs.
// The sums are the CTA form's, term for term (per-lane chunks ascending, the same butterfly; per column
// du's term then dg's, entries ascending), so both forms give the same bits. No shared-memory barrier
// spans warps: warps of a CTA never wait for each other.
template <class Config>
__device__ __forceinline__ void train_row_backward_warp(const TrainRowBackwardParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int WARPS = Config::threads / 32;
  constexpr int TILES = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES * (SLOTS + 1);
  constexpr int XS = (K + 255) / 256;  // 16-byte chunks per lane
  // The dx pass: 4 chunks per lane (1024 columns) per slice, two entries' rows loaded before their FMAs.
  // Measured on the H200 (bench/README.md v45): narrower slices (smaller working sets) and one entry at a
  // time were slower; the pass is bound by loads in flight, not by L2's capacity.
  constexpr int SC = XS < 4 ? XS : 4;
  constexpr int DXB = 2;
  constexpr int SLICES = (XS + SC - 1) / SC;
  constexpr int kWindowWords = 512;    // TwELL words per warp in shared memory
  constexpr int kWindowTiles = kWindowWords / (SLOTS + 1) < 32 ? kWindowWords / (SLOTS + 1) : 32;
  constexpr uint32_t FULL = 0xFFFFFFFFu;
  constexpr long long kNowhere = -(1ll << 62);
  static_assert(Config::cta_m == WARPS && Config::gate_mainloop >= 1 && K % 8 == 0 && XS <= 8 && TILE_N <= 512 &&
                    kWindowTiles >= 1 && Config::activation == kReLU,
                "warp-per-row backward: cta_m = warps, tensor-core gate, ReLU, d_model % 8 == 0 and <= 2048, tile_n <= 512");
  __shared__ __align__(16) uint16_t xs_all[WARPS][XS * 256];
  __shared__ __align__(16) uint16_t dys_all[WARPS][XS * 256];
  __shared__ uint32_t words_all[WARPS][kWindowTiles * (SLOTS + 1)];
  __shared__ uint16_t dense_tiles[WARPS][TILE_N];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint16_t* const xs = xs_all[warp];
  uint16_t* const dys = dys_all[warp];
  uint32_t* const words = words_all[warp];
  uint16_t* const dense_tile = dense_tiles[warp];
  auto in_k = [&](int i) { return (8 * lane + 256 * i) < K; };
  // The recompute's view of the forward (load_overflow_tile reads these fields only).
  GatedDownParams gate{};
  gate.x = p.x;
  gate.w_gate = p.w_gate;
  gate.backup = p.backup;
  gate.ldx = p.ldx;
  gate.ldwg = p.ldwg;
  gate.backup_capacity = p.backup_capacity;
  // The L1 coefficient: l1_scale, times the device scalar l1_weight where given (autograd's gradient of
  // the L1 term, read on the device: no host synchronization).
  const float l1_scale = p.l1_weight != nullptr ? p.l1_scale * *p.l1_weight : p.l1_scale;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * WARPS;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * WARPS + warp;

  // x and dy of `row` into the warp's shared memory (the dot products read them).
  auto stage_row = [&](int64_t row) {
    const uint16_t* x = p.x + row * p.ldx + 8 * lane;
    const uint16_t* dy = p.dy + row * p.lddy + 8 * lane;
    __syncwarp();  // the previous row's x and dy are read
#pragma unroll
    for (int i = 0; i < XS; ++i) {
      *reinterpret_cast<uint4*>(xs + 8 * lane + 256 * i) = in_k(i) ? *reinterpret_cast<const uint4*>(x + 256 * i) : uint4{0u, 0u, 0u, 0u};
      *reinterpret_cast<uint4*>(dys + 8 * lane + 256 * i) = in_k(i) ? *reinterpret_cast<const uint4*>(dy + 256 * i) : uint4{0u, 0u, 0u, 0u};
    }
    __syncwarp();
  };
  // One active entry's gradients from the staged row: column j of d_ff, its activated gate a.
  struct Grads {
    float dg, du, h;
  };
  // The gradients from dh = dy . Wd^T_j (before the L1 term) and u = x . Wu_j (non-gated: unused).
  auto grads_of = [&](float dh, float u, float a) {
    const float h = Config::gated ? a * u : a;
    if (p.apply_l1) dh = dh + l1_scale * sign_of(h);
    // ReLU: act'(g) = 1 on the active set.
    return Grads{Config::gated ? dh * u : dh, Config::gated ? dh * a : 0.0f, h};
  };
  // dy . Wd^T_j over the staged dy, from the row's chunks d4 (lane l: chunks 8l + 256i).
  auto dot_dy = [&](const uint4 (&d4)[XS]) {
    float dh = 0.0f;
#pragma unroll
    for (int i = 0; i < XS; ++i)
      if (in_k(i)) dh = dot8<Value>(*reinterpret_cast<const uint4*>(dys + 8 * lane + 256 * i), d4[i], dh);
    return warp_sum(dh);
  };
  // Two weight rows at the lane's chunks (8l + 256i), both in flight before either is used: v0 = r0's
  // (a row pointer), v1 = r1's where live1, zeros past d_model or where !live1.
  auto load_two_rows = [&](const uint16_t* r0, uint4 (&v0)[XS], const uint16_t* r1, bool live1, uint4 (&v1)[XS]) {
    r0 += 8 * lane;
    r1 += 8 * lane;
#pragma unroll
    for (int i = 0; i < XS; ++i) {
      v0[i] = in_k(i) ? *reinterpret_cast<const uint4*>(r0 + 256 * i) : uint4{0u, 0u, 0u, 0u};
      v1[i] = live1 && in_k(i) ? *reinterpret_cast<const uint4*>(r1 + 256 * i) : uint4{0u, 0u, 0u, 0u};
    }
  };
  auto entry_grads = [&](int64_t j, float a) {
    uint4 d4[XS], u4[XS];
    // Non-gated: u4 zeros, unused.
    load_two_rows(p.w_down + j * p.ldwd, d4, p.w_up + j * p.ldwu, Config::gated, u4);
    const float dh = dot_dy(d4);
    float u = 0.0f;
    if constexpr (Config::gated) {
#pragma unroll
      for (int i = 0; i < XS; ++i)
        if (in_k(i)) u = dot8<Value>(*reinterpret_cast<const uint4*>(xs + 8 * lane + 256 * i), u4[i], u);
      u = warp_sum(u);
    }
    return grads_of(dh, u, a);
  };
  // Calls tile_row(tile, nnz, header, word0) for each tile-row of `row` with entries, in order; header
  // points at the tile-row's words in shared memory (valid until tile_row returns).
  auto for_each_tile_row = [&](int64_t row, auto&& tile_row) {
    const long long row_word0 = row * WORDS_PER_ROW;
#pragma unroll 1
    for (int t0 = 0; t0 < TILES; t0 += kWindowTiles) {
      const int tiles = TILES - t0 < kWindowTiles ? TILES - t0 : kWindowTiles;
      __syncwarp();  // the previous window's words (and, at a row's start, the last row's) are read
      for (int w = lane; w < tiles * (SLOTS + 1); w += 32) words[w] = __ldg(p.twell + row_word0 + t0 * (SLOTS + 1) + w);
      __syncwarp();  // the window's words are visible to every lane
      const uint32_t my_nnz = lane < tiles ? words[lane * (SLOTS + 1)] : 0u;
      uint32_t busy = __ballot_sync(FULL, my_nnz != 0);
      while (busy != 0) {
        const int b = __ffs(busy) - 1;
        busy &= busy - 1;
        const int tile = t0 + b;
        tile_row(tile, __shfl_sync(FULL, my_nnz, b), words + b * (SLOTS + 1),
                 row_word0 + static_cast<long long>(tile) * (SLOTS + 1));
      }
    }
  };
  // An overflowing tile-row's activated values into dense_tile (backup or recompute, as the consumer).
  auto load_overflow = [&](int64_t row, int n0, int valid_n, uint32_t slot) {
    __syncwarp();  // the previous overflowing tile-row's values are read
    load_overflow_tile<Config>(gate, slot, p.x + row * p.ldx, n0, valid_n, dense_tile, lane, 32, warp, 1);
    __syncwarp();  // dense_tile is complete
  };
  // Calls active(column, a) for each active column of the overflowing tile-row in dense_tile, ascending.
  auto for_each_active = [&](int valid_n, auto&& active_column, auto&& inactive_column) {
    for (int c0 = 0; c0 < valid_n; c0 += 32) {
      const int c = c0 + lane;
      const uint16_t v = c < valid_n ? dense_tile[c] : static_cast<uint16_t>(0);
      const bool active = c < valid_n && is_active<Value, Config::activation>(v, Config::threshold);
      if (!active) inactive_column(c);
      uint32_t ballot = __ballot_sync(FULL, active);
      while (ballot != 0) {
        const int bit = __ffs(ballot) - 1;
        ballot &= ballot - 1;
        active_column(c0 + bit, Value::to_float(__shfl_sync(FULL, v, bit)));
      }
    }
  };

  if (p.pass == kTrainRowEntries) {
#pragma unroll 1
    for (int64_t row = first_row; row < p.m; row += warps_total) {
      stage_row(row);
      // The row's entries so far: entry o's u is element o of the row in entry_u (o < WORDS_PER_ROW).
      uint32_t ordinal = 0;
      for_each_tile_row(row, [&](int tile, uint32_t nnz, const uint32_t* header, long long word0) {
        const int n0 = tile * TILE_N;
        if (nnz <= SLOTS) {
          const uint32_t first = ordinal;
          ordinal += nnz;
          if (Config::gated && p.entry_u != nullptr && first + nnz <= static_cast<uint32_t>(WORDS_PER_ROW)) {
            const float* u_of = p.entry_u + row * WORDS_PER_ROW + first;
            // u from the forward (GatedDownParams::entry_u_after_words, its bits): only Wd^T rows to read,
            // two entries' at a time (the registers one entry's Wd^T and Wu rows take).
            for (uint32_t e = 0; e < nnz; e += 2) {
              const bool two = e + 1 < nnz;
              const uint32_t w0 = header[1 + e], w1 = two ? header[2 + e] : w0;
              uint4 d4[2][XS];
              load_two_rows(p.w_down + static_cast<int64_t>(n0 + static_cast<int>(w0 & 0xFFFFu)) * p.ldwd, d4[0],
                            p.w_down + static_cast<int64_t>(n0 + static_cast<int>(w1 & 0xFFFFu)) * p.ldwd, two, d4[1]);
              const float u0 = u_of[e], u1 = two ? u_of[e + 1] : 0.0f;
              const float a0 = Value::to_float(static_cast<uint16_t>(w0 >> 16)), a1 = Value::to_float(static_cast<uint16_t>(w1 >> 16));
              const Grads g0 = grads_of(dot_dy(d4[0]), u0, a0);
              const Grads g1 = grads_of(dot_dy(d4[1]), u1, a1);
              if (lane == 0) {
                *reinterpret_cast<float4*>(p.entry_grad + 4 * (word0 + 1 + e)) = make_float4(g0.dg, g0.du, g0.h, a0);
                if (two) *reinterpret_cast<float4*>(p.entry_grad + 4 * (word0 + 2 + e)) = make_float4(g1.dg, g1.du, g1.h, a1);
              }
            }
            return;
          }
          for (uint32_t e = 0; e < nnz; ++e) {
            const uint32_t w = header[1 + e];
            const float a = Value::to_float(static_cast<uint16_t>(w >> 16));
            const Grads g = entry_grads(n0 + static_cast<int>(w & 0xFFFFu), a);
            if (lane == 0) *reinterpret_cast<float4*>(p.entry_grad + 4 * (word0 + 1 + e)) = make_float4(g.dg, g.du, g.h, a);
          }
          return;
        }
        // Overflowing: its activated values, its grad row (word 1's quad says which), then every active
        // column in order; inactive columns' quads are zeros.
        const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
        const uint32_t slot = header[1];
        load_overflow(row, n0, valid_n, slot);
        uint32_t grad_row = slot;
        if (lane == 0 && (slot == kBackupMissing || slot >= p.backup_capacity)) {
          const uint32_t i = atomicAdd(p.grad_overflow_count, 1u);
          grad_row = i < p.grad_capacity - p.backup_capacity ? p.backup_capacity + i : kBackupMissing;
        }
        grad_row = __shfl_sync(FULL, grad_row, 0);
        if (lane == 0)
          *reinterpret_cast<float4*>(p.entry_grad + 4 * (word0 + 1)) = make_float4(__uint_as_float(grad_row), 0.0f, 0.0f, 0.0f);
        if (grad_row == kBackupMissing) {  // no room: the dx pass recomputes these entries (they still count)
          for_each_active(valid_n, [&](int, float) { ++ordinal; }, [](int) {});
          return;
        }
        float* const quads = p.backup_grad + 4 * static_cast<long long>(grad_row) * TILE_N;
        for_each_active(
            valid_n,
            [&](int col, float a) {
              ++ordinal;
              const Grads g = entry_grads(n0 + col, a);
              if (lane == 0) *reinterpret_cast<float4*>(quads + 4 * col) = make_float4(g.dg, g.du, g.h, a);
            },
            [&](int c) { *reinterpret_cast<float4*>(quads + 4 * c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f); });
        // Columns valid_n .. TILE_N - 1 of the last tile: inactive, zeroed like the CTA form's.
        for (int c = (valid_n + 31) / 32 * 32 + lane; c < TILE_N; c += 32)
          *reinterpret_cast<float4*>(quads + 4 * c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      });
    }
    return;
  }

  // kTrainRowDx. Per column: du's term, then dg's (the reference's order), one fma each; entries wait in
  // batches of DXB so that the batch's rows are all loaded before its first FMA (the loads in flight bound
  // the pass; a batch held in registers, shifted on each arrival, keeps every index static).
#pragma unroll 1
  for (int s = 0; s < SLICES; ++s) {
    const int chunk0 = s * SC;
    float dx[SC * 8];
    // The entries waiting for their batch: the last `pending` of DXB places, oldest first.
    int64_t wait_j[DXB] = {};
    float wait_du[DXB] = {}, wait_dg[DXB] = {};
    int pending = 0;
    auto load = [&](int64_t j, bool live, uint4 (&u4)[SC], uint4 (&g4)[SC]) {
      const uint16_t* wu = p.w_up + j * p.ldwu + 8 * lane;
      const uint16_t* wg = p.w_gate + j * p.ldwg + 8 * lane;
#pragma unroll
      for (int i = 0; i < SC; ++i) {
        const bool in = live && chunk0 + i < XS && in_k(chunk0 + i);
        if constexpr (Config::gated)
          u4[i] = in ? *reinterpret_cast<const uint4*>(wu + 256 * (chunk0 + i)) : uint4{0u, 0u, 0u, 0u};
        else
          u4[i] = uint4{0u, 0u, 0u, 0u};  // unused
        g4[i] = in ? *reinterpret_cast<const uint4*>(wg + 256 * (chunk0 + i)) : uint4{0u, 0u, 0u, 0u};
      }
    };
    auto accumulate = [&](float du, float dg, const uint4 (&u4)[SC], const uint4 (&g4)[SC]) {
#pragma unroll
      for (int i = 0; i < SC; ++i) {
        const uint32_t vu[4] = {u4[i].x, u4[i].y, u4[i].z, u4[i].w};
        const uint32_t vg[4] = {g4[i].x, g4[i].y, g4[i].z, g4[i].w};
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          float& acc = dx[8 * i + t];
          if constexpr (Config::gated) acc = fmaf(du, Value::to_float(static_cast<uint16_t>(vu[t / 2] >> (16 * (t % 2)))), acc);
          acc = fmaf(dg, Value::to_float(static_cast<uint16_t>(vg[t / 2] >> (16 * (t % 2)))), acc);
        }
      }
    };
    // The waiting entries' rows, all loaded before the first FMA, then their terms in order.
    auto drain = [&] {
      uint4 u4[DXB][SC], g4[DXB][SC];
#pragma unroll
      for (int b = 0; b < DXB; ++b) load(wait_j[b], b >= DXB - pending, u4[b], g4[b]);
#pragma unroll
      for (int b = 0; b < DXB; ++b)
        if (b >= DXB - pending) accumulate(wait_du[b], wait_dg[b], u4[b], g4[b]);
      pending = 0;
    };
    auto add = [&](int64_t j, float du, float dg) {
#pragma unroll
      for (int b = 0; b + 1 < DXB; ++b) {
        wait_j[b] = wait_j[b + 1];
        wait_du[b] = wait_du[b + 1];
        wait_dg[b] = wait_dg[b + 1];
      }
      wait_j[DXB - 1] = j;
      wait_du[DXB - 1] = du;
      wait_dg[DXB - 1] = dg;
      if (++pending == DXB) drain();
    };
    auto flush = [&] {
      if (pending > 0) drain();
    };
#pragma unroll 1
    for (int64_t row = first_row; row < p.m; row += warps_total) {
#pragma unroll
      for (int i = 0; i < SC * 8; ++i) dx[i] = 0.0f;
      bool staged = false;  // x and dy are staged only for a tile-row the entries pass had no grad row for
      for_each_tile_row(row, [&](int tile, uint32_t nnz, const uint32_t* header, long long word0) {
        const int n0 = tile * TILE_N;
        if (nnz <= SLOTS) {
          // The tile-row's quads, 32 at a time, one per lane, then handed on in entry order.
          for (uint32_t e0 = 0; e0 < nnz; e0 += 32) {
            const uint32_t e = e0 + lane;
            const float4 q = e < nnz ? *reinterpret_cast<const float4*>(p.entry_grad + 4 * (word0 + 1 + e))
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const uint32_t count = nnz - e0 < 32 ? nnz - e0 : 32;
            for (uint32_t k = 0; k < count; ++k) {
              const uint32_t w = header[1 + e0 + k];
              add(n0 + static_cast<int>(w & 0xFFFFu), __shfl_sync(FULL, q.y, k), __shfl_sync(FULL, q.x, k));
            }
          }
          return;
        }
        const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
        const uint32_t grad_row = __float_as_uint(p.entry_grad[4 * (word0 + 1)]);
        if (grad_row != kBackupMissing) {
          // The entries pass's quads of the tile-row: active where a is (a = 0 marks an inactive column).
          const float* quads = p.backup_grad + 4 * static_cast<long long>(grad_row) * TILE_N;
          for (int c0 = 0; c0 < valid_n; c0 += 32) {
            const int c = c0 + lane;
            const float4 q = c < valid_n ? *reinterpret_cast<const float4*>(quads + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const bool active = c < valid_n && is_active<Value, Config::activation>(Value::from_float(q.w), Config::threshold);
            uint32_t ballot = __ballot_sync(FULL, active);
            while (ballot != 0) {
              const int bit = __ffs(ballot) - 1;
              ballot &= ballot - 1;
              add(n0 + c0 + bit, __shfl_sync(FULL, q.y, bit), __shfl_sync(FULL, q.x, bit));
            }
          }
          return;
        }
        // No grad row (backup_grad was full): the entries again from x, dy and the recomputed tile-row.
        if (!staged) stage_row(row);
        staged = true;
        load_overflow(row, n0, valid_n, header[1]);
        for_each_active(
            valid_n, [&](int col, float a) {
              const Grads g = entry_grads(n0 + col, a);
              add(n0 + col, g.du, g.dg);
            },
            [](int) {});
      });
      flush();
      uint16_t* out = p.dx + row * p.lddx + 8 * lane;
#pragma unroll
      for (int i = 0; i < SC; ++i) {
        if (!(chunk0 + i < XS && in_k(chunk0 + i))) continue;
        uint32_t w[4];
#pragma unroll
        for (int t = 0; t < 4; ++t)
          w[t] = static_cast<uint32_t>(Value::from_float(dx[8 * i + 2 * t])) |
                 (static_cast<uint32_t>(Value::from_float(dx[8 * i + 2 * t + 1])) << 16);
        *reinterpret_cast<uint4*>(out + 256 * (chunk0 + i)) = uint4{w[0], w[1], w[2], w[3]};
      }
    }
  }
}

// The form is the config's: warp_row (persistent, a row per warp; launched once per pass) or one row per
// CTA (kTrainRowAll: everything in one launch).
template <class Config>
__device__ __forceinline__ void train_row_backward(const TrainRowBackwardParams& p) {
  if constexpr (Config::warp_row)
    train_row_backward_warp<Config>(p);
  else
    train_row_backward_cta<Config>(p);
}

}  // namespace twell::device
