// D2T on the sm_90a feature set (Config::mainloop == 2): a persistent, warp-specialized gate GEMM
// H = act(X Wg^T) with the TwELL packing epilogue.
//
//   warpgroup 0   producer: one thread issues TMA loads of the x block (cta_m x cta_k) and the Wg
//                 tile (tile_n x cta_k; GatedUp: and the Wu tile) of each K step into a `stages`-deep shared-memory ring; `full[s]`
//                 completes when both boxes landed (expect_tx), `empty[s]` when both consumer
//                 warpgroups are done reading stage s. Its warps 1-3 are the packers of the epilogue
//                 (below). setmaxnreg gives its registers to the consumers.
//   warpgroups 1-2  consumers: each owns 64 rows of the 128-row CTA tile and issues wgmma m64nNk16
//                 (N = tile_n) from the ring, fp32 accumulators in registers (N / 2 per thread), then
//                 the epilogue while the producer already fills the ring for the next tile.
//
// CTA tiles are taken persistently, the tile index of d_ff fastest: the CTAs running together share a
// few blocks of x rows, and Wg (d_ff x d_model) stays in L2. With cluster_m = 2 the CTAs of a cluster
// take neighbouring m-blocks of the same d_ff tile and multicast the Wg tile to each other: every CTA
// reads half of it from L2, and a ring stage is refilled only once the consumers of both released it
// (remote mbarrier arrivals). At tile_n 256 that cuts the bytes an SM reads from L2 per tile by a third
// (Nsight Compute: L2 throughput 72% -> 51% of peak, as cuBLAS's) and the kernel's time by ~5%
// (bench/README.md v20).
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
//
// GatedUp = true: the dense path's fused gate and up GEMMs (the dense neurons of a split plan, and
// the dense fallback; runtime/src/cublas_dense.cpp). Each stage also holds the Wu tile (u_map) right
// after the Wg tile, one wgmma of twice the width computes g and u, and the epilogue stages h = act(g) * u with
// the dense path's roundings (g and u rounded to the dtype, the sparsity predicate applied, the
// product rounded: dense_ops.cuh's gated_mul) instead of the activation; the packer warps then copy
// the slab to p.h with 16-byte stores instead of packing it. x is read once for both GEMMs, and g and
// u never leave the SM.
#pragma once
#include "twell/device/primitives/hopper_primitives.cuh"

namespace twell::device {

template <class Config, bool GatedUp = false>
__device__ __forceinline__ void gate_twell_wgmma(const GateParams& p) {
  using Value = typename Config::Value;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int TILE_N = Config::tile_n;
  constexpr int CTA_M = Config::cta_m;
  // One swizzle row of 16-bit values per operand row: 128 bytes at cta_k 64, 64 bytes at cta_k 32
  // (half the stage, so twice the stages in the same shared memory).
  constexpr int CTA_K = Config::cta_k;
  constexpr int ROW_BYTES = CTA_K * 2;
  constexpr int STAGES = Config::stages;
  constexpr int CLUSTER_M = Config::cluster_m;
  static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 CTAs share the Wg tile");
  static_assert((CTA_K == 64 || CTA_K == 32) && CTA_M == 128 && Config::threads == 384,
                "wgmma main loop: cta_m 128 (two consumer warpgroups of 64 rows), cta_k 32 or 64, 384 threads");
  static_assert(TILE_N == 64 || TILE_N == 128 || TILE_N == 256, "wgmma N is the tile width: 64, 128 or 256");
  static_assert(STAGES >= 2, "the TMA ring needs at least 2 stages");
  // The layout (shared_memory.h, which the host sizes launches by).
  constexpr int A_BYTES = shared_memory::wgmma_gate_a_bytes(CTA_M, CTA_K);
  constexpr int B_BYTES = shared_memory::wgmma_gate_b_bytes(TILE_N, CTA_K);
  constexpr int OPERANDS = GatedUp ? 2 : 1;  // weight tiles per stage: Wg (and Wu)
  // A multiple of 1024: every tile stays swizzle-aligned.
  constexpr int STAGE_BYTES = shared_memory::wgmma_gate_stage_bytes(CTA_M, TILE_N, CTA_K, OPERANDS);
  static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "operand tiles must keep the ring swizzle-aligned");
  constexpr int KT = (K + CTA_K - 1) / CTA_K;
  constexpr int TILES_N = (N + TILE_N - 1) / TILE_N;
  constexpr int ACC = TILE_N / 2;
  // GatedUp: the stage's Wg and Wu tiles lie one after the other (tile_n rows each, the same swizzle
  // pattern), so one wgmma of N = 2 tile_n covers both: accumulators [0, ACC) are g, [ACC, 2 ACC) are
  // u at the same (row, column). One wide instruction reads the x tile from shared memory once for both.
  constexpr int MMA_N = GatedUp ? 2 * TILE_N : TILE_N;
  static_assert(MMA_N <= 256, "GatedUp: tile_n up to 128 (one wgmma of N = 256)");
  static_assert(!GatedUp || N % 8 == 0, "GatedUp: h is stored 8 columns (16 bytes) at a time: d_ff % 8 == 0");
  constexpr int STAGE_STRIDE = shared_memory::wgmma_gate_staging_stride(TILE_N);  // staging row stride in 16-bit values

  extern __shared__ __align__(1024) unsigned char dynamic_smem[];
  // The runtime allocates 1 KiB extra: align the ring to the 1024 bytes 128-byte swizzling needs.
  unsigned char* ring = dynamic_smem + ((1024 - (smem_address(dynamic_smem) & 1023)) & 1023);
  uint16_t* staging = reinterpret_cast<uint16_t*>(ring + STAGES * STAGE_BYTES);  // [CTA_M][STAGE_STRIDE]
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + CTA_M * STAGE_STRIDE);
  uint64_t* empty = full + STAGES;
  uint64_t* staged = empty + STAGES;  // [2]: a consumer warpgroup's slab is in its staging area
  uint64_t* packed = staged + 2;      // [2]: the packer warps are done with that staging area

  const int tid = threadIdx.x;
  // The launcher sizes the dynamic shared memory by the same layout (shared_memory.h): a launch with less
  // than it needs stops here instead of overrunning it.
  static_assert(shared_memory::wgmma_gate_bytes(CTA_M, TILE_N, CTA_K, STAGES, OPERANDS) ==
                    1024 + STAGES * STAGE_BYTES + CTA_M * STAGE_STRIDE * 2 + (2 * STAGES + 4) * 8,
                "the pointers below follow shared_memory.h's wgmma gate layout");
  if (tid == 0 && static_cast<uint32_t>(reinterpret_cast<unsigned char*>(packed + 2) - dynamic_smem) > dynamic_smem_bytes())
    __trap();
  // Work item w: d_ff tile w % TILES_N of the CLUSTER_M consecutive m-blocks CLUSTER_M * (w / TILES_N)
  // + rank; the CTAs of a cluster (cluster_m > 1, __cluster_dims__) take the same items, each its own
  // m-block, and share the Wg tile: each loads TILE_N / CLUSTER_M of its rows and multicasts them to all.
  // Items are taken persistently (w = cluster, cluster + clusters, ...), the d_ff tile fastest: the
  // clusters running together share a few blocks of x rows, and Wg stays in L2.
  const uint32_t rank = CLUSTER_M > 1 ? cluster_ctarank() : 0;
  const int64_t m_blocks = (p.m + CTA_M - 1) / CTA_M;
  const int64_t items = (m_blocks + CLUSTER_M - 1) / CLUSTER_M * TILES_N;
  const int64_t first_item = blockIdx.x / CLUSTER_M, item_step = gridDim.x / CLUSTER_M;
  auto item_m0 = [&](int64_t w) { return (w / TILES_N * CLUSTER_M + rank) * CTA_M; };

  if (tid == 0) {
    tma_prefetch_descriptor(&p.x_map);
    tma_prefetch_descriptor(&p.w_map);
    if constexpr (GatedUp) tma_prefetch_descriptor(&p.u_map);
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 8 * CLUSTER_M);  // every consumer warp of every CTA reading the stage
    }
    for (int w = 0; w < 2; ++w) {
      mbarrier_init(&staged[w], 128);  // every thread of consumer warpgroup w
      mbarrier_init(&packed[w], 96);   // every packer thread (warps 1-3)
    }
    fence_barrier_init();
  }
  // The peers' barriers exist before any multicast or remote arrival reaches them.
  if constexpr (CLUSTER_M > 1) cluster_sync();
  else __syncthreads();

  if (tid < 128) {
    setmaxnreg_dec<56>();
    if (tid >= 32) {
      // ---- packers (warps 1-3): the TwELL epilogue of each staged slab, overlapped with the
      // consumers' next main loop ----
      uint32_t n = 0;
      for (int64_t w_item = first_item; w_item < items; w_item += item_step, ++n) {
        const int64_t m0 = item_m0(w_item);
        const int tile = static_cast<int>(w_item % TILES_N);
        for (int w = 0; w < 2; ++w) {
          mbarrier_wait(&staged[w], n & 1);
          if constexpr (GatedUp) {
            // The slab's rows to p.h, 8 columns (16 bytes) per lane and step (N % 8 == 0).
            const uint16_t* slab = staging + w * 64 * STAGE_STRIDE;
            constexpr int CHUNKS = TILE_N / 8;
            for (int i = tid - 32; i < 64 * CHUNKS; i += 96) {
              const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
              const int64_t row = m0 + w * 64 + r;
              if (row < p.m && tile * TILE_N + c < N)
                *reinterpret_cast<uint4*>(p.h + row * p.ldh + tile * TILE_N + c) =
                    *reinterpret_cast<const uint4*>(slab + r * STAGE_STRIDE + c);
            }
            __syncwarp();
          } else {
            pack_twell_tile<Config, STAGE_STRIDE>(p, staging + w * 64 * STAGE_STRIDE, m0 + w * 64, tile, 64,
                                                  tid / 32 - 1, 3);
          }
          mbarrier_arrive(&packed[w]);
        }
      }
    } else if (tid == 0) {
      // ---- producer ----
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t w_item = first_item; w_item < items; w_item += item_step) {
        const int m0 = static_cast<int>(item_m0(w_item));
        const int n0 = static_cast<int>(w_item % TILES_N) * TILE_N;
        for (int kt = 0; kt < KT; ++kt) {
          // Every CTA's consumers released the stage (a fresh barrier's "previous" phase counts as done).
          mbarrier_spin(&empty[stage], phase ^ 1);
          unsigned char* a = ring + stage * STAGE_BYTES;
          // All of the stage lands here: the x box, and the Wg rows from every CTA of the cluster.
          mbarrier_arrive_expect_tx(&full[stage], STAGE_BYTES);
          tma_load_2d(a, &p.x_map, &full[stage], kt * CTA_K, m0);
#pragma unroll
          for (int op = 0; op < OPERANDS; ++op) {
            const TmaDescriptor* map = op == 0 ? &p.w_map : &p.u_map;
            unsigned char* b = a + A_BYTES + op * B_BYTES;
            if constexpr (CLUSTER_M > 1)
              tma_load_2d_multicast(b + rank * (B_BYTES / CLUSTER_M), map, &full[stage], kt * CTA_K,
                                    n0 + static_cast<int>(rank) * (TILE_N / CLUSTER_M), (1u << CLUSTER_M) - 1);
            else
              tma_load_2d(b, map, &full[stage], kt * CTA_K, n0);
          }
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    // ---- consumers ----
    setmaxnreg_inc<224>();  // 128 x 56 + 256 x 224 <= 64K registers
    // A stage is free once this warp's wgmma finished reading it, in every CTA of the cluster (each
    // multicasts into it): one arrival per warp on each CTA's barrier.
    auto release = [&](int s) {
      if (tid % 32 != 0) return;
      if constexpr (CLUSTER_M > 1) {
#pragma unroll
        for (uint32_t r = 0; r < CLUSTER_M; ++r) mbarrier_arrive_cluster(&empty[s], r);
      } else {
        mbarrier_arrive(&empty[s]);
      }
    };
    const int wg = tid / 128 - 1;  // 64-row slab of the CTA tile
    const int warp = (tid % 128) / 32;
    const int lane = tid % 32;
    const int quad_t = lane % 4;
    int stage = 0;
    uint32_t phase = 0;
    uint32_t n = 0;  // tiles done by this CTA
    float acc[MMA_N / 2];

    for (int64_t w_item = first_item; w_item < items; w_item += item_step) {
      // One K step: wait for the stage, issue its 4 wgmma k16 steps, release the previous stage once
      // its wgmma finished reading it (this step's stay in flight). The first step of a tile is peeled
      // so that the compiler sees the accumulators overwritten there (mma_first): they are dead during
      // the previous tile's epilogue instead of doubling its register demand.
      auto k_step = [&](auto first, int kt) {
        mbarrier_wait(&full[stage], phase);
        const unsigned char* a = ring + stage * STAGE_BYTES;
        const uint64_t desc_a = wgmma_descriptor_swizzled<ROW_BYTES>(a + wg * 64 * CTA_K * 2);
        const uint64_t desc_b = wgmma_descriptor_swizzled<ROW_BYTES>(a + A_BYTES);
        wgmma_fence();
        if constexpr (decltype(first)::value)
          Wgmma<Value, MMA_N>::mma_first(acc, desc_a, desc_b);
        else
          Wgmma<Value, MMA_N>::mma(acc, desc_a, desc_b);
#pragma unroll
        for (int kk = 1; kk < CTA_K / 16; ++kk) Wgmma<Value, MMA_N>::mma(acc, desc_a + 2 * kk, desc_b + 2 * kk);
        wgmma_commit();
        wgmma_fence_operands(acc);
        wgmma_wait<1>();
        if (kt > 0) release(stage == 0 ? STAGES - 1 : stage - 1);
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
      };
      k_step(integral_constant<bool, true>{}, 0);
      for (int kt = 1; kt < KT; ++kt) k_step(integral_constant<bool, false>{}, kt);
      wgmma_wait<0>();
      wgmma_fence_operands(acc);
      release(stage == 0 ? STAGES - 1 : stage - 1);

      // ---- TwELL epilogue, first half ----
      // The warpgroup rounds and activates its 64 x tile_n slab into its staging area (rows padded by 16
      // bytes: the 8 rows a warp writes at once fall in distinct banks) once the packers are done with
      // the previous slab, and goes on to its next tile; the packer warps pack the slab meanwhile.
      mbarrier_wait(&packed[wg], (n & 1) ^ 1);  // n = 0: a fresh barrier's "previous" phase counts as done
      uint16_t* slab = staging + wg * 64 * STAGE_STRIDE;
      // The value an accumulator pair element stages: act(g), or for GatedUp h = act(g) * u exactly as
      // the dense path's gated_mul computes it from the rounded g and u.
      auto staged_bits = [&](int i) -> uint32_t {
        const uint16_t a_bits = activate<Value, Config::activation>(Value::from_float(acc[i]));
        if constexpr (GatedUp) {
          const float a = is_active<Value, Config::activation>(a_bits, Config::threshold) ? Value::to_float(a_bits) : 0.0f;
          return Value::from_float(a * Value::to_float(Value::from_float(acc[ACC + i])));
        } else {
          return a_bits;
        }
      };
#pragma unroll
      for (int j = 0; j < TILE_N / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = warp * 16 + lane / 4 + half * 8;
          const uint32_t pair = staged_bits(4 * j + 2 * half) | (staged_bits(4 * j + 2 * half + 1) << 16);
          *reinterpret_cast<uint32_t*>(slab + r * STAGE_STRIDE + 8 * j + 2 * quad_t) = pair;
        }
      mbarrier_arrive(&staged[wg]);
      ++n;
    }
  }
  // No CTA leaves while a peer may still multicast into its ring or arrive on its barriers.
  if constexpr (CLUSTER_M > 1) cluster_sync();
}

}  // namespace twell::device
