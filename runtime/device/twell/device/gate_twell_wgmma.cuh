// D2T on the sm_90a feature set (Config::mainloop == 2): a persistent, warp-specialized gate GEMM
// H = act(X Wg^T) with the TwELL packing epilogue.
//
//   warpgroup 0   producer: one thread issues TMA loads of the x block (cta_m x 64) and the Wg tile
//                 (tile_n x 64) of each K step into a `stages`-deep shared-memory ring; `full[s]`
//                 completes when both boxes landed (expect_tx), `empty[s]` when both consumer
//                 warpgroups are done reading stage s. Its warps 1-3 are the packers of the epilogue
//                 (below). setmaxnreg gives its registers to the consumers.
//   warpgroups 1-2  consumers: each owns 64 rows of the 128-row CTA tile and issues wgmma m64nNk16
//                 (N = tile_n) from the ring, fp32 accumulators in registers (N / 2 per thread), then
//                 the epilogue while the producer already fills the ring for the next tile.
//
// CTA tiles are taken persistently (tile b, b + gridDim.x, ...), the tile index of d_ff fastest: the
// CTAs running together share one block of x rows, and Wg (d_ff x d_model) stays in L2.
//
// Epilogue (paper §3; TWELL_FORMAT.md requirements 1-4): each consumer warpgroup stages its activated
// 64 x tile_n slab in its own shared-memory area (mbarrier `staged[wg]`) and starts its next tile; the
// packer warps pack the slab with pack_twell_tile (twell_epilogue.cuh: ballot + prefix, ascending
// columns, overflowing tile-rows to the backup or marked for recompute) and free the area
// (`packed[wg]`), so the compaction overlaps the tensor cores' next main loop. An
// epilogue straight from the accumulators needs more than the 168 registers a thread has here (ptxas
// spilled, and spilling around in-flight wgmma accumulators produced wrong sums: bench/README.md v8).
//
// Arithmetic: each output is the K-ordered chain of k16 tensor-core steps (zero-filled past K), the
// chain the consumer's overflow recompute (gated_down.cuh) repeats with mma.sync.
#pragma once
#include "twell/device/hopper_primitives.cuh"

namespace twell::device {

template <class Config>
__device__ __forceinline__ void gate_twell_wgmma(const GateParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
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
  constexpr int ACC = TILE_N / 2;
  constexpr int STAGE_STRIDE = TILE_N + 8;  // staging row stride in 16-bit values

  extern __shared__ __align__(1024) unsigned char dynamic_smem[];
  // The runtime allocates 1 KiB extra: align the ring to the 1024 bytes 128-byte swizzling needs.
  unsigned char* ring = dynamic_smem + ((1024 - (smem_address(dynamic_smem) & 1023)) & 1023);
  uint16_t* staging = reinterpret_cast<uint16_t*>(ring + STAGES * STAGE_BYTES);  // [CTA_M][STAGE_STRIDE]
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + CTA_M * STAGE_STRIDE);
  uint64_t* empty = full + STAGES;
  uint64_t* staged = empty + STAGES;  // [2]: a consumer warpgroup's slab is in its staging area
  uint64_t* packed = staged + 2;      // [2]: the packer warps are done with that staging area

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
    for (int w = 0; w < 2; ++w) {
      mbarrier_init(&staged[w], 128);  // every thread of consumer warpgroup w
      mbarrier_init(&packed[w], 96);   // every packer thread (warps 1-3)
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (tid < 128) {
    setmaxnreg_dec<56>();
    if (tid >= 32) {
      // ---- packers (warps 1-3): the TwELL epilogue of each staged slab, overlapped with the
      // consumers' next main loop ----
      uint32_t n = 0;
      for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, ++n) {
        const int64_t m0 = t / TILES_N * CTA_M;
        const int tile = static_cast<int>(t % TILES_N);
        for (int w = 0; w < 2; ++w) {
          mbarrier_wait(&staged[w], n & 1);
          pack_twell_tile<Config, STAGE_STRIDE>(p, staging + w * 64 * STAGE_STRIDE, m0 + w * 64, tile, 64,
                                                tid / 32 - 1, 3);
          mbarrier_arrive(&packed[w]);
        }
      }
      return;
    }
    // ---- producer ----
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
  setmaxnreg_inc<224>();  // 128 x 56 + 256 x 224 <= 64K registers
  const int wg = tid / 128 - 1;  // 64-row slab of the CTA tile
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int quad_t = lane % 4;
  int stage = 0;
  uint32_t phase = 0;
  uint32_t n = 0;  // tiles done by this CTA
  float acc[ACC];

  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
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

    // ---- TwELL epilogue, first half ----
    // The warpgroup rounds and activates its 64 x tile_n slab into its staging area (rows padded by 16
    // bytes: the 8 rows a warp writes at once fall in distinct banks) once the packers are done with
    // the previous slab, and goes on to its next tile; the packer warps pack the slab meanwhile.
    mbarrier_wait(&packed[wg], (n & 1) ^ 1);  // n = 0: a fresh barrier's "previous" phase counts as done
    uint16_t* slab = staging + wg * 64 * STAGE_STRIDE;
#pragma unroll
    for (int j = 0; j < TILE_N / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = warp * 16 + lane / 4 + half * 8;
        const uint32_t pair =
            static_cast<uint32_t>(activate<Value, Config::activation>(Value::from_float(acc[4 * j + 2 * half]))) |
            (static_cast<uint32_t>(activate<Value, Config::activation>(Value::from_float(acc[4 * j + 2 * half + 1])))
             << 16);
        *reinterpret_cast<uint32_t*>(slab + r * STAGE_STRIDE + 8 * j + 2 * quad_t) = pair;
      }
    mbarrier_arrive(&staged[wg]);
    ++n;
  }
}

}  // namespace twell::device
