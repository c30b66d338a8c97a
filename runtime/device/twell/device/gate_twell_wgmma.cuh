// D2T on the sm_90a feature set (Config::mainloop == 2): a persistent, warp-specialized gate GEMM
// H = act(X Wg^T) whose epilogue packs TwELL straight from the wgmma accumulators.
//
//   warpgroup 0   producer: one thread issues TMA loads of the x block (cta_m x 64) and the Wg tile
//                 (tile_n x 64) of each K step into a `stages`-deep shared-memory ring; `full[s]`
//                 completes when both boxes landed (expect_tx), `empty[s]` when both consumer
//                 warpgroups are done reading stage s. setmaxnreg gives its registers to the consumers.
//   warpgroups 1-2  consumers: each owns 64 rows of the 128-row CTA tile and issues wgmma m64nNk16
//                 (N = tile_n) from the ring, fp32 accumulators in registers (N / 2 per thread), then
//                 the TwELL epilogue below while the producer already fills the ring for the next tile.
//
// CTA tiles are taken persistently (tile b, b + gridDim.x, ...), the tile index of d_ff fastest: the
// CTAs running together share one block of x rows, and Wg (d_ff x d_model) stays in L2.
//
// Epilogue (paper §3; TWELL_FORMAT.md requirements 1-4): a row's tile_n values live in the 4 lanes of a
// quad, lane t holding columns 8j + 2t + {0, 1}. Each lane sets its active columns in a bit mask laid
// out in column order (32 columns per word), the quad ORs the masks with two shuffles, and an entry's
// slot is the popcount of the active columns before it: ascending column order, deterministic, no
// shared memory. Overflowing tile-rows go to the backup, else are marked for recompute, as in
// twell_epilogue.cuh.
//
// Arithmetic: each output is the K-ordered chain of k16 tensor-core steps (zero-filled past K), the
// chain the consumer's overflow recompute (gated_down.cuh) repeats with mma.sync.
#pragma once
#include "twell/device/hopper_primitives.cuh"

namespace twell::device {

template <class T, T V>
struct integral_constant {  // NVRTC has no <type_traits>
  static constexpr T value = V;
};

template <class Config>
__device__ __forceinline__ void gate_twell_wgmma(const GateParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int SLOTS = Config::slots;
  constexpr int CTA_M = Config::cta_m;
  constexpr int CTA_K = 64;  // one 128-byte swizzle row of 16-bit values
  constexpr int STAGES = Config::stages;
  static_assert(Config::cta_k == CTA_K && CTA_M == 128 && Config::threads == 384,
                "wgmma main loop: cta_m 128 (two consumer warpgroups of 64 rows), cta_k 64, 384 threads");
  static_assert(TILE_N == 64 || TILE_N == 128 || TILE_N == 256, "wgmma N is the tile width: 64, 128 or 256");
  static_assert(STAGES >= 2, "the TMA ring needs at least 2 stages");
  constexpr int A_BYTES = CTA_M * CTA_K * 2;
  constexpr int B_BYTES = TILE_N * CTA_K * 2;
  constexpr int STAGE_BYTES = A_BYTES + B_BYTES;  // multiple of 1024: every tile stays swizzle-aligned
  constexpr int KT = (K + CTA_K - 1) / CTA_K;
  constexpr int TILES_N = (N + TILE_N - 1) / TILE_N;
  constexpr int WORDS_PER_ROW = TILES_N * (SLOTS + 1);
  constexpr int ACC = TILE_N / 2;
  constexpr int MASK_WORDS = TILE_N / 32;

  extern __shared__ __align__(1024) unsigned char dynamic_smem[];
  // The runtime allocates 1 KiB extra: align the ring to the 1024 bytes 128-byte swizzling needs.
  unsigned char* ring = dynamic_smem + ((1024 - (smem_address(dynamic_smem) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + STAGES * STAGE_BYTES);
  uint64_t* empty = full + STAGES;

  const int tid = threadIdx.x;
  const int64_t m_blocks = (p.m + CTA_M - 1) / CTA_M;
  const int64_t tiles = m_blocks * TILES_N;

  if (tid == 0) {
    tma_prefetch_descriptor(&p.x_map);
    tma_prefetch_descriptor(&p.w_map);
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 256);  // every consumer thread arrives
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (tid < 128) {
    // ---- producer ----
    setmaxnreg_dec<40>();
    if (tid != 0) return;
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int m0 = static_cast<int>(t / TILES_N * CTA_M);
      const int n0 = static_cast<int>(t % TILES_N) * TILE_N;
      for (int kt = 0; kt < KT; ++kt) {
        mbarrier_wait(&empty[stage], phase ^ 1);  // a fresh barrier's "previous" phase counts as done
        unsigned char* a = ring + stage * STAGE_BYTES;
        mbarrier_arrive_expect_tx(&full[stage], STAGE_BYTES);
        tma_load_2d(a, &p.x_map, &full[stage], kt * CTA_K, m0);
        tma_load_2d(a + A_BYTES, &p.w_map, &full[stage], kt * CTA_K, n0);
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<232>();
  const int wg = tid / 128 - 1;  // 64-row slab of the CTA tile
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int quad_t = lane % 4;
  int stage = 0;
  uint32_t phase = 0;
  float acc[ACC];

  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t m0 = t / TILES_N * CTA_M;
    const int tile = static_cast<int>(t % TILES_N);
    const int n0 = tile * TILE_N;

    // One K step: wait for the stage, issue its 4 wgmma k16 steps, release the previous stage once
    // its wgmma finished reading it (this step's stay in flight). The first step of a tile is peeled
    // so that the compiler sees the accumulators overwritten there (mma_first): they are dead during
    // the previous tile's epilogue instead of doubling its register demand.
    auto k_step = [&](auto first, int kt) {
      mbarrier_wait(&full[stage], phase);
      const unsigned char* a = ring + stage * STAGE_BYTES;
      const uint64_t desc_a = wgmma_descriptor_sw128(a + wg * 64 * CTA_K * 2);
      const uint64_t desc_b = wgmma_descriptor_sw128(a + A_BYTES);
      wgmma_fence();
      if constexpr (decltype(first)::value)
        Wgmma<Value, TILE_N>::mma_first(acc, desc_a, desc_b);
      else
        Wgmma<Value, TILE_N>::mma(acc, desc_a, desc_b);
#pragma unroll
      for (int kk = 1; kk < CTA_K / 16; ++kk) Wgmma<Value, TILE_N>::mma(acc, desc_a + 2 * kk, desc_b + 2 * kk);
      wgmma_commit();
      wgmma_fence_operands(acc);
      wgmma_wait<1>();
      if (kt > 0) mbarrier_arrive(&empty[stage == 0 ? STAGES - 1 : stage - 1]);
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
    };
    k_step(integral_constant<bool, true>{}, 0);
    for (int kt = 1; kt < KT; ++kt) k_step(integral_constant<bool, false>{}, kt);
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    mbarrier_arrive(&empty[stage == 0 ? STAGES - 1 : stage - 1]);

    // ---- TwELL epilogue from registers ----
    // h(j, half, e): the activated value of column 8j + 2t + e in row half `half` of this lane's pair.
    auto value = [&](int j, int half, int e) {
      return activate<Value, Config::activation>(Value::from_float(acc[4 * j + 2 * half + e]));
    };
    auto active = [&](int j, int half, int e) {
      return n0 + 8 * j + 2 * quad_t + e < N && is_active<Value, Config::activation>(value(j, half, e), Config::threshold);
    };
    // mask[half][q]: bit c % 32 of word c / 32 is set when column c of the tile-row is active.
    uint32_t mask[2][MASK_WORDS];
#pragma unroll
    for (int q = 0; q < MASK_WORDS; ++q)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t own = 0;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
          for (int e = 0; e < 2; ++e) own |= (active(q * 4 + jj, half, e) ? 1u : 0u) << (8 * jj + e);
        own <<= 2 * quad_t;
        own |= __shfl_xor_sync(0xFFFFFFFFu, own, 1);
        own |= __shfl_xor_sync(0xFFFFFFFFu, own, 2);
        mask[half][q] = own;
      }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = m0 + wg * 64 + warp * 16 + lane / 4 + half * 8;
      const bool row_valid = row < p.m;
      uint32_t nnz = 0;
#pragma unroll
      for (int q = 0; q < MASK_WORDS; ++q) nnz += __popc(mask[half][q]);
      const bool overflow = row_valid && nnz > SLOTS;
      uint32_t slot = 0;
      if (overflow && quad_t == 0) slot = atomicAdd(p.overflow_count, 1u);
      slot = __shfl_sync(0xFFFFFFFFu, slot, lane & ~3);
      if (!row_valid) continue;
      uint32_t* out = p.twell + row * WORDS_PER_ROW + tile * (SLOTS + 1);
      if (!overflow) {
        uint32_t before = 0;
#pragma unroll
        for (int q = 0; q < MASK_WORDS; ++q) {
          const uint32_t mine = mask[half][q] & (0x03030303u << (2 * quad_t));
          if (mine != 0) {
#pragma unroll
            for (int jj = 0; jj < 4; ++jj)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int bit = 8 * jj + 2 * quad_t + e;
                if (mine & (1u << bit)) {
                  const uint32_t pos = before + __popc(mask[half][q] & ((1u << bit) - 1u));
                  const int j = q * 4 + jj;
                  out[1 + pos] = (static_cast<uint32_t>(value(j, half, e)) << 16) | static_cast<uint32_t>(8 * j + 2 * quad_t + e);
                }
              }
          }
          before += __popc(mask[half][q]);
        }
        if (quad_t == 0) out[0] = nnz;
      } else {
        const bool stored = slot < p.backup_capacity;
        if (stored) {
          uint16_t* dst = p.backup + static_cast<int64_t>(slot) * TILE_N;
#pragma unroll
          for (int j = 0; j < TILE_N / 8; ++j)
            *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * quad_t) =
                static_cast<uint32_t>(active(j, half, 0) ? value(j, half, 0) : 0) |
                (static_cast<uint32_t>(active(j, half, 1) ? value(j, half, 1) : 0) << 16);
        }
        if (quad_t == 0) {
          out[0] = nnz;
          out[1] = stored ? slot : kBackupMissing;
        }
      }
    }
  }
}

}  // namespace twell::device
