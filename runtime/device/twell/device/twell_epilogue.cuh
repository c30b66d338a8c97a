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

}  // namespace twell::device
