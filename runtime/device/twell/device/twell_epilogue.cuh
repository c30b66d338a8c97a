// The TwELL packing epilogue of the gate GEMM (paper §3), shared by every main loop: the CTA's
// activated tile (cta_m rows x tile_n columns, value bits, row stride tile_n) is staged in shared
// memory; one warp per tile-row counts the active entries with __ballot_sync, then writes them in
// ascending column order at the positions given by the ballot prefix (popc of the lanes below):
// deterministic, no atomics (TWELL_FORMAT.md, requirement 2).
//
// A tile-row with more than `slots` entries is never truncated (requirement 1): it claims a backup
// slot with one atomicAdd and stores its whole activated tile-row there; word 1 of the header then
// holds the backup index, or kBackupMissing when the backup is full (the consumer recomputes the
// tile-row; the counter tells the host how large the backup must be next time).
#pragma once
#include "twell/device/numerics.cuh"

namespace twell::device {

//
// `rows` staged rows (row r at staged + r * STRIDE, global row m0 + r) are packed by warps
// [0, warps) counted from `warp` (this thread's warp among them): the whole CTA by default, or one
// consumer warpgroup of the wgmma kernel.
template <class Config, int STRIDE = Config::tile_n>
__device__ __forceinline__ void pack_twell_tile(const GateParams& p, const uint16_t* staged, int64_t m0, int tile,
                                                int rows = Config::cta_m, int warp = threadIdx.x / 32,
                                                int warps = Config::threads / 32) {
  using Value = typename Config::Value;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int WORDS_PER_ROW = (N + TILE_N - 1) / TILE_N * (SLOTS + 1);
  const int lane = threadIdx.x % 32;
  const int n0 = tile * TILE_N;
  const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
  for (int r = warp; r < rows; r += warps) {
    const int64_t row = m0 + r;
    if (row >= p.m) break;
    const uint16_t* h = staged + r * STRIDE;
    uint32_t* out = p.twell + row * WORDS_PER_ROW + tile * (SLOTS + 1);
    uint32_t nnz = 0;
    for (int c0 = 0; c0 < TILE_N; c0 += 32) {
      const int c = c0 + lane;
      const bool active = c < valid_n && is_active<Value, Config::activation>(h[c], Config::threshold);
      nnz += __popc(__ballot_sync(0xFFFFFFFFu, active));
    }
    if (nnz <= SLOTS) {
      uint32_t base = 0;
      for (int c0 = 0; c0 < TILE_N; c0 += 32) {
        const int c = c0 + lane;
        const bool active = c < valid_n && is_active<Value, Config::activation>(h[c], Config::threshold);
        const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, active);
        if (active) out[1 + base + __popc(ballot & lanemask_lt())] = (static_cast<uint32_t>(h[c]) << 16) | c;
        base += __popc(ballot);
      }
      if (lane == 0) out[0] = nnz;
    } else {
      uint32_t slot = 0;
      if (lane == 0) slot = atomicAdd(p.overflow_count, 1u);
      slot = __shfl_sync(0xFFFFFFFFu, slot, 0);
      const bool stored = slot < p.backup_capacity;
      if (stored) {
        uint16_t* dst = p.backup + static_cast<int64_t>(slot) * TILE_N;
        for (int c = lane; c < TILE_N; c += 32) {
          const bool active = c < valid_n && is_active<Value, Config::activation>(h[c], Config::threshold);
          dst[c] = active ? h[c] : static_cast<uint16_t>(0);
        }
      }
      if (lane == 0) {
        out[0] = nnz;
        out[1] = stored ? slot : kBackupMissing;
      }
    }
  }
}

// The same packing with 8 columns per lane (one 16-byte shared-memory load per lane and row instead of
// 2 x tile_n / 32 dependent 2-byte loads and ballots): the wgmma gate's packer warps run it beside the
// tensor cores and must finish a tile's two slabs within one main loop (bench/README.md v22). Lane l
// holds columns 8l..8l+7, so lane order then bit order is ascending column order, and the exclusive
// prefix of the per-lane counts (at most 8: 4 bits, one ballot per bit) gives each entry's position:
// the same words, bit for bit, as pack_twell_tile. Needs tile_n <= 256, 16-byte aligned staged rows
// (STRIDE % 8 == 0, `staged` 16-byte aligned) and a 16-byte aligned backup (device allocations are).
template <class Config, int STRIDE>
__device__ __forceinline__ void pack_twell_tile_x8(const GateParams& p, const uint16_t* staged, int64_t m0, int tile,
                                                   int rows, int warp, int warps) {
  using Value = typename Config::Value;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int WORDS_PER_ROW = (N + TILE_N - 1) / TILE_N * (SLOTS + 1);
  constexpr int LANES = TILE_N / 8;  // lanes that hold columns
  static_assert(TILE_N % 8 == 0 && TILE_N <= 256 && STRIDE % 8 == 0, "8 columns per lane, one 16-byte row chunk");
  const int lane = threadIdx.x % 32;
  const int c0 = lane * 8;
  const int n0 = tile * TILE_N;
  const int valid_n = N - n0 < TILE_N ? N - n0 : TILE_N;
  for (int r = warp; r < rows; r += warps) {
    const int64_t row = m0 + r;
    if (row >= p.m) break;
    uint4 chunk = make_uint4(0, 0, 0, 0);
    if (lane < LANES) chunk = *reinterpret_cast<const uint4*>(staged + r * STRIDE + c0);
    const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    uint16_t v[8];
    uint32_t mask = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = static_cast<uint16_t>(words[j / 2] >> (16 * (j % 2)));
      if (c0 + j < valid_n && is_active<Value, Config::activation>(v[j], Config::threshold)) mask |= 1u << j;
    }
    const uint32_t count = __popc(mask);
    uint32_t below = 0, nnz = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (count >> b) & 1u);
      below += static_cast<uint32_t>(__popc(ballot & lanemask_lt())) << b;
      nnz += static_cast<uint32_t>(__popc(ballot)) << b;
    }
    uint32_t* out = p.twell + row * WORDS_PER_ROW + tile * (SLOTS + 1);
    if (nnz <= SLOTS) {
      uint32_t* slot = out + 1 + below;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (mask >> j & 1u) *slot++ = (static_cast<uint32_t>(v[j]) << 16) | static_cast<uint32_t>(c0 + j);
      if (lane == 0) out[0] = nnz;
    } else {
      uint32_t slot = 0;
      if (lane == 0) slot = atomicAdd(p.overflow_count, 1u);
      slot = __shfl_sync(0xFFFFFFFFu, slot, 0);
      const bool stored = slot < p.backup_capacity;
      if (stored && lane < LANES) {
        uint32_t kept[4];
#pragma unroll
        for (int w = 0; w < 4; ++w)
          kept[w] = (mask >> (2 * w) & 1u ? static_cast<uint32_t>(v[2 * w]) : 0u) |
                    (mask >> (2 * w + 1) & 1u ? static_cast<uint32_t>(v[2 * w + 1]) << 16 : 0u);
        *reinterpret_cast<uint4*>(p.backup + static_cast<int64_t>(slot) * TILE_N + c0) =
            make_uint4(kept[0], kept[1], kept[2], kept[3]);
      }
      if (lane == 0) {
        out[0] = nnz;
        out[1] = stored ? slot : kBackupMissing;
      }
    }
  }
}

}  // namespace twell::device
