// Pieces shared by the gated consumers (gated_down.cuh, gated_down_block.cuh): 16-byte dot and axpy
// helpers, the warp reduction, and the bit-exact recompute of an overflowing tile-row.
#pragma once
#include "twell/device/primitives/tile_primitives.cuh"

namespace twell::device {

// A 16-byte global load that asks the L2 to keep the line over streaming data (PTX ISA: createpolicy
// .fractional.L2::evict_last, ld.global.L2::cache_hint): the consumers' weight rows are re-read by
// every token that activates the neuron, while x, the TwELL matrix and y pass through once.
__device__ __forceinline__ uint4 load_keep_in_l2(const void* ptr) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  uint4 v;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr), "l"(policy));
  return v;
}

// Butterfly sum over the warp: every lane gets the same bits (each step adds the same two values,
// in either order, on both lanes of a pair).
__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  return s;
}

// s + a . b over one 16-byte chunk (8 packed 16-bit values), in ascending order.
template <class Value>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float s) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    s = fmaf(Value::to_float(static_cast<uint16_t>(wa[e])), Value::to_float(static_cast<uint16_t>(wb[e])), s);
    s = fmaf(Value::to_float(static_cast<uint16_t>(wa[e] >> 16)), Value::to_float(static_cast<uint16_t>(wb[e] >> 16)), s);
  }
  return s;
}

// y[0..7] += h * w for one 16-byte chunk of 8 packed 16-bit values.
template <class Value>
__device__ __forceinline__ void axpy8(float* y, float h, const uint4& w) {
  const uint32_t v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    y[2 * t] = fmaf(h, Value::to_float(static_cast<uint16_t>(v[t])), y[2 * t]);
    y[2 * t + 1] = fmaf(h, Value::to_float(static_cast<uint16_t>(v[t] >> 16)), y[2 * t + 1]);
  }
}

// Dot product of two K-long 16-bit rows, fp32 accumulate, reduced over the warp (every lane gets it).
template <class Value, int K>
__device__ __forceinline__ float warp_dot(const uint16_t* a, const uint16_t* b, int lane) {
  float s = 0.0f;
  for (int k = lane; k < K; k += 32) s = fmaf(Value::to_float(a[k]), Value::to_float(b[k]), s);
  return warp_sum(s);
}

// Pre-activations of one tile-row (columns n0 .. n0 + valid_n - 1 of one token row x), activated,
// into dense_tile, computed with the arithmetic of the gate kernel's main loop (Config::gate_mainloop)
// so that they equal, bit for bit, what the gate kernel computed: a tile-row then gives the same y
// whichever overflow path it took.
// The mma chain runs on warps [warp0, warp0 + warps) of the CTA (the whole CTA, or one warp of the
// warp-per-row consumer); the fma chain on the whole CTA.
template <class Config>
__device__ __forceinline__ void recompute_gate_tile(const GatedDownParams& p, const uint16_t* x, int n0, int valid_n,
                                                    uint16_t* dense_tile, int warp0 = 0, int warps = Config::threads / 32) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int THREADS = Config::threads;
  if constexpr (Config::gate_mainloop >= 1) {  // mma_sync or wgmma: the same k16 tensor-core chain
    // The gate's mma.sync chain: k16 chunks in ascending order, as many as its cta_k loop runs (zero
    // padded past K). Token row x is row 0 of the A fragment; each warp takes n8 column tiles.
    constexpr int K_CHUNKS = (K + Config::gate_cta_k - 1) / Config::gate_cta_k * (Config::gate_cta_k / 16);
    static_assert(K % 8 == 0, "mma_sync gate: d_model % 8 == 0");
    const int warp = threadIdx.x / 32 - warp0;
    const int lane = threadIdx.x % 32;
    auto pair = [](const uint16_t* row, int k) {
      return k < K ? *reinterpret_cast<const uint32_t*>(row + k) : 0u;  // k even; K % 8 == 0: both in or out
    };
    for (int nt = warp; nt * 8 < valid_n; nt += warps) {
      const int c = nt * 8 + lane / 4;  // this lane's B column
      const uint16_t* w = p.w_gate + static_cast<int64_t>(n0 + c) * p.ldwg;
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int kc = 0; kc < K_CHUNKS; ++kc) {
        const int k = kc * 16 + (lane % 4) * 2;
        const uint32_t a[4] = {lane < 4 ? pair(x, k) : 0u, 0u, lane < 4 ? pair(x, k + 8) : 0u, 0u};
        const bool col_valid = c < valid_n;
        mma_16816<Value>(d, a, col_valid ? pair(w, k) : 0u, col_valid ? pair(w, k + 8) : 0u);
      }
      if (lane < 4) {
        dense_tile[nt * 8 + lane * 2] = activate<Value, Config::activation>(Value::from_float(d[0]));
        dense_tile[nt * 8 + lane * 2 + 1] = activate<Value, Config::activation>(Value::from_float(d[1]));
      }
    }
  } else {
    // The gate's fma chain: one thread per column, ascending k.
    for (int c = threadIdx.x; c < valid_n; c += THREADS) {
      const uint16_t* w = p.w_gate + static_cast<int64_t>(n0 + c) * p.ldwg;
      float g = 0.0f;
      for (int k = 0; k < K; ++k) g = fmaf(Value::to_float(x[k]), Value::to_float(w[k]), g);
      dense_tile[c] = activate<Value, Config::activation>(Value::from_float(g));
    }
  }
}

// An overflowing tile-row's activated values (tile_n of them) into dense_tile: copied from its backup
// row where the gate kernel stored one (slot < backup_capacity), else recomputed from x with the gate's
// arithmetic on warps [warp0, warp0 + warps) (recompute_gate_tile). The copy runs on threads first,
// first + stride, ...; the caller synchronizes them before dense_tile is read. Every consumer variant
// takes its overflowing tile-rows through here, so y does not depend on the backup capacity.
template <class Config>
__device__ __forceinline__ void load_overflow_tile(const GatedDownParams& p, uint32_t slot, const uint16_t* x, int n0,
                                                   int valid_n, uint16_t* dense_tile, int first, int stride, int warp0,
                                                   int warps) {
  constexpr int TILE_N = Config::tile_n;
  if (slot != kBackupMissing && slot < p.backup_capacity) {
    for (int c = first; c < TILE_N; c += stride) dense_tile[c] = p.backup[static_cast<int64_t>(slot) * TILE_N + c];
  } else {
    recompute_gate_tile<Config>(p, x, n0, valid_n, dense_tile, warp0, warps);
  }
}

// One warp: the active entries of an activated tile-row (dense_tile: valid_n columns of d_ff from n0),
// in ascending column order, to cols[first ..] (column j in d_ff) and gates[first ..] (g_j, fp32): one
// ballot per 32 columns, positions from the ballot prefix. Returns their count on every lane. How the
// CTA-wide consumers list an overflowing tile-row's entries.
template <class Config>
__device__ __forceinline__ int list_active_columns(const uint16_t* dense_tile, int valid_n, int n0, int* cols,
                                                   float* gates, int first, int lane) {
  using Value = typename Config::Value;
  int added = 0;
  for (int c0 = 0; c0 < valid_n; c0 += 32) {
    const int c = c0 + lane;
    const bool active = c < valid_n && is_active<Value, Config::activation>(dense_tile[c], Config::threshold);
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, active);
    if (active) {
      const int e = first + added + __popc(ballot & lanemask_lt());
      cols[e] = n0 + c;
      gates[e] = Value::to_float(dense_tile[c]);
    }
    added += __popc(ballot);
  }
  return added;
}

// The same with 16-byte loads (8 values per lane per step): for K % 8 == 0 and 16-byte aligned rows.
template <class Value, int K>
__device__ __forceinline__ float warp_dot_16B(const uint16_t* a, const uint16_t* b, int lane) {
  float s = 0.0f;
  for (int k = lane * 8; k < K; k += 32 * 8)
    s = dot8<Value>(*reinterpret_cast<const uint4*>(a + k), *reinterpret_cast<const uint4*>(b + k), s);
  return warp_sum(s);
}

}  // namespace twell::device
