// decode_fused: the whole FFN of at most 32 token rows in one persistent, cooperative kernel, one CTA per
// SM (issue 17; PERFORMANCE.md, "Small M"; bench/README.md v38, v64, v67, v68, v75, v76). At a few rows
// the FFN is bound by reading Wg, so the kernel is built around streaming it
// (bench/experiments/decode_stream.cu measured the forms this one keeps):
//
// Phase 1, per CTA c of P: the contiguous rows [c d_ff / P, (c + 1) d_ff / P) of Wg, in groups of 8
//   rows (an n8 mma tile), each group's d_model split into k slices, one warp per (group, slice) unit.
//   Every lane requests its 16-byte pieces of Wg with plain loads into registers before anything waits
//   (one window of up to kDecodeFusedWindow k32 blocks: at the paper's shape all ~174 KB of the CTA's
//   share at once), x having gone first by cp.async so that it does not queue behind Wg (sm_90: both after
//   griddepcontrol.wait, the kernel before complete). A lane (row
//   n = lane / 4, quad lane q = lane % 4) holds values 8 q .. 8 q + 7 of its row in each k32 block; its
//   first two words are the B fragment of one mma.m16n8k16 and its last two of another (PTX ISA,
//   "Matrix Fragments for mma.m16n8k16"), the A fragments being x's row n at the same values (one
//   16-byte read; calls of 9 to 16 tokens also rows n + 8 in A's other registers, calls of at most 8
//   leave them zero and x's tiles 8 rows: sm::decode_fused_token_rows; calls of 17 to 32 tokens a second
//   m16 tile of x, rows 16 + n and 24 + n, on the same B fragments): each mma sums 16 of the
//   block's products, a permutation of the block's k order applied to A and B alike. Each unit's blocks run ascending; the slices' sums are added in slice
//   order. g is rounded to the value type and activated as every twell gate does (numerics.cuh).
// In the same pass as g, each token's active rows of the CTA as bits (shared-memory atomics) and (gated)
//   each active row's Wu_j lines into L2 (prefetch), the active rows listed by atomicAdd in no fixed order;
//   then one thread per token counts its bits into the workspace (b.counts[t][c]); per active row j (a
//   warp each): Wd's data for j into L2 (phase 2 reads it), and per token t that activates j,
//   h = a (x_t . Wu_j) with the row consumers' warp dot order (non-gated: h = a), written as the pair
//   (j, h) at t's rank of j among the CTA's rows (b.pairs[t][c][rank]): Wu_j is read once for all the
//   call's tokens that need it.
// The grid barrier: one release add per CTA on a 64-bit arrival count and acquire polls of it.
// Phase 2, per CTA: kDecodeFusedColumns (16) output columns of every token. The pairs of the whole call
//   in one order, token-major and rows ascending (segment t P + c: CTA c's pairs of token t): the
//   m P counts in one round trip and their exclusive scan; then batches of kDecodeFusedBatchPerRow
//   pairs per token row, a thread per pair (its (j, h), then its 16 Wd values of the columns: two
//   16-byte loads in_out, 16 scalar ones out_in; Wd's rows are read once per pair, so the bytes are
//   the sum over tokens of their active rows, of which only Wd's 32 bytes per pair and CTA). A thread
//   per (token, column) then sums its token's pairs: y is one fmaf chain from +0 over the token's
//   active rows ascending, across batches.
//
// Rounding and determinism: the gate's g is the dot of the large-M gates in another order (k slices of
// d_model, each in k16 steps over a permuted k, then the slices), y's sum over the active rows one
// fmaf chain in row order (the large-M down projection adds per tile), so a value may differ from the
// large-M path's in its last bits, and a neuron within that of the threshold may be active on one path
// and not the other; y is then within the documented tolerance (1e-2 relative) of the large-M path's,
// not its bits. Every order y depends on is fixed by the shape and the launch's CTA count (the active
// list's order only decides which warp computes a row's h), so y is the same bits on every run. No TwELL
// matrix is written (FfnPlan::download_twell says so after such a call).
#pragma once
#include "twell/device/consumer/consumer_common.cuh"
#include "twell/device/primitives/dependent_launch.cuh"
#include "twell/device/primitives/grid_sync.cuh"  // load_l2_u32

// A timeline hook: bench/experiments/decode_fused_timeline.cu defines it to stamp each CTA's phases
// (thread 0, %globaltimer and clock64); empty otherwise.
#ifndef TWELL_DECODE_FUSED_STAMP
#define TWELL_DECODE_FUSED_STAMP(stage)
#endif

namespace twell::device {

// 16 bytes of global memory that no kernel of the call writes (a weight), streamed: no L1 allocation
// (PTX ISA, ld "L1::no_allocate"; the read-only path).
__device__ __forceinline__ uint4 load_stream_16(const uint16_t* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// The grid barrier of decode_fused: arrivals only ever grow (P per launch), so a launch's target is the
// next multiple of P above what a CTA read before its own arrival (at most P - 1 arrivals of its launch
// precede that read). The count is 64-bit: it does not wrap. The read is issued early (thread 0, once
// the CTA's Wg loads are in flight) and used at the barrier, so that its round trip is not waited for.
__device__ __forceinline__ unsigned long long fused_barrier_seen(const unsigned long long* arrivals) {
  unsigned long long v = 0;
  if (threadIdx.x == 0) asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(arrivals) : "memory");
  return v;
}
__device__ __forceinline__ void fused_barrier(unsigned long long* arrivals, unsigned long long seen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long target = (seen / gridDim.x + 1) * gridDim.x;
    __threadfence();  // the CTA's writes before its arrival
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(arrivals) : "memory");
    unsigned long long v;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(arrivals) : "memory");
    } while (static_cast<long long>(v - target) < 0);
  }
  __syncthreads();
}

template <class Config>
__device__ __forceinline__ void decode_fused(const GatedDownParams& p, const DecodeFusedBuffers& b) {
  using Value = typename Config::Value;
  namespace sm = shared_memory;
  constexpr int K = Config::d_model;
  constexpr int N = Config::d_ff;
  constexpr int THREADS = Config::threads;
  constexpr int WARPS = THREADS / 32;
  constexpr int KB = (K + 31) / 32;  // k32 blocks of a row (the last zero-padded)
  constexpr int S = static_cast<int>(sm::kDecodeFusedSlices);  // k slices of a group, a warp (unit) each
  constexpr int PER = (KB + S - 1) / S;                          // k32 blocks per slice
  constexpr int NW = (PER + static_cast<int>(sm::kDecodeFusedWindow) - 1) / static_cast<int>(sm::kDecodeFusedWindow);
  constexpr int WIN = (PER + NW - 1) / NW;                       // blocks per window (<= kDecodeFusedWindow)
  constexpr bool EXACT = K % 32 == 0 && KB % S == 0 && PER % WIN == 0;  // every window's loads inside its slice and K
  constexpr int LDX = static_cast<int>(sm::decode_fused_x_stride(K));
  constexpr int COLS = static_cast<int>(sm::kDecodeFusedColumns);
  constexpr int BATCH_PER_ROW = static_cast<int>(sm::kDecodeFusedBatchPerRow);
  constexpr int XR = static_cast<int>(sm::kDecodeFusedTokens);  // the most tokens (register arrays)
  constexpr int TILES = (XR + 15) / 16;                          // m16 tiles of x at the most tokens
  static_assert(Config::threads == sm::kDecodeFusedWarps * 32 && Config::max_tokens == XR && K % 8 == 0, "decode_fused shape");
  static_assert(XR <= 32 && THREADS % 32 == 0 && THREADS >= 16 * XR, "a token mask is 32 bits; a thread per (token, column)");
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  __shared__ int scan_total[WARPS];
  __shared__ int active_count;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m = static_cast<int>(p.m);
  const int P = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
  if (m < 1 || m > XR) __trap();
  // x's tiles and every per-token array of shared memory: 8 rows (the mma's A rows 0-7), 16 or 32 (two m16 tiles).
  const int xr = static_cast<int>(sm::decode_fused_token_rows(m));
  const int rows_cap = (N + P - 1) / P;
  const int bit_words = static_cast<int>(sm::decode_fused_bit_words(rows_cap));  // 32-row words per CTA
  // x's rows are written first: their room is checked before, the whole layout's once Wg is in flight.
  require_dynamic_smem(static_cast<uint32_t>(xr * LDX * 2));
  const int r0 = static_cast<int>(static_cast<int64_t>(c) * N / P);
  const int R = static_cast<int>(static_cast<int64_t>(c + 1) * N / P) - r0;
  const int units = (R + 7) / 8 * S;

  // Phase 1's shared memory (sm::decode_fused_phase1_bytes): x [xr][LDX], the units' sums [units][xr
  // tokens][8 rows], a per (row, token), the rows' token masks, the active rows (in the g pass's order).
  uint16_t* xs = reinterpret_cast<uint16_t*>(dynamic_smem);
  float* sums = reinterpret_cast<float*>(xs + xr * LDX);
  float* act = sums + (rows_cap + 7) / 8 * S * xr * 8;                    // [rows_cap][xr]
  uint32_t* row_mask = reinterpret_cast<uint32_t*>(act + rows_cap * xr);  // [rows_cap]
  int* active = reinterpret_cast<int*>(row_mask + rows_cap);              // [rows_cap]
  uint32_t* tok_bits = reinterpret_cast<uint32_t*>(active + rows_cap);    // [xr][bit_words]

  // The warp's units u = warp, warp + WARPS, ... (group u / S, slice u % S: k32 blocks [slice * PER,
  // min(KB, (slice + 1) * PER))), each in NW windows of WIN blocks: at the paper's shape one window
  // per warp, all its loads in flight at once (a shape with more windows waits for each).
  const int n = lane / 4, q = lane % 4;
  // Unit u's window: its first k32 block, and the end of its slice's blocks.
  auto window_first = [](int u, int window) { return u % S * PER + window * WIN; };
  auto slice_end = [](int u) { return (u % S + 1) * PER < KB ? (u % S + 1) * PER : KB; };
  // The loads of unit u's window into buf.
  auto issue = [&](uint4 (&buf)[WIN], int u, int window) {
    const int row = 8 * (u / S) + n, first = window_first(u, window), end = slice_end(u);
    const bool valid_row = row < R;
    const uint16_t* src = p.w_gate + static_cast<int64_t>(r0 + (valid_row ? row : 0)) * p.ldwg + 8 * q + 32 * first;
#pragma unroll
    for (int i = 0; i < WIN; ++i)
      buf[i] = valid_row && (EXACT || (first + i < end && 32 * (first + i) + 8 * q < K)) ? load_stream_16(src + 32 * i)
                                                                                      : make_uint4(0u, 0u, 0u, 0u);
  };
  // The window's 2 WIN mma steps per m16 tile of x into the tile's accumulators; hi: tokens 8..15 too
  // (A's rows n + 8; else zeros); two: the second tile too (tokens 16..31), on the same B fragments, so
  // that each block's registers are free after it. Called with literal flags, so each call site's loop
  // has its own loads (runtime flags, not a template: a generic lambda here crashes NVRTC 13.0's front end).
  auto consume = [&](bool hi, bool two, const uint4 (&buf)[WIN], float (&acc)[TILES][4], int u, int window) {
    const int first = window_first(u, window), end = slice_end(u);
    const uint16_t* xrow = xs + n * LDX + 8 * q + 32 * first;
#pragma unroll
    for (int i = 0; i < WIN; ++i) {
      // Blocks past the slice or KB are skipped, not multiplied by zeros: x's row is not written past
      // block KB (0 * NaN is NaN). Inside KB the last block's values past K are zeros in x and Wg.
      if (!EXACT && first + i >= end) break;
#pragma unroll
      for (int tile = 0; tile < TILES; ++tile) {
        if (tile > 0 && !two) break;
        // The lane's 8 values of x's rows 16 tile + n (and + 8) at the same k: A's words in the same places as B's.
        const uint16_t* xt = xrow + 16 * tile * LDX + 32 * i;
        const uint4 xv = *reinterpret_cast<const uint4*>(xt);
        const uint4 xh = hi ? *reinterpret_cast<const uint4*>(xt + 8 * LDX) : make_uint4(0u, 0u, 0u, 0u);
        const uint32_t a0[4] = {xv.x, xh.x, xv.y, xh.y};
        const uint32_t a1[4] = {xv.z, xh.z, xv.w, xh.w};
        mma_16816<Value>(acc[tile], a0, buf[i].x, buf[i].y);
        mma_16816<Value>(acc[tile], a1, buf[i].z, buf[i].w);
      }
    }
  };
  auto consume_rows = [&](const uint4 (&buf)[WIN], float (&acc)[TILES][4], int u, int window) {
    if (xr > 16) consume(true, true, buf, acc, u, window);
    else if (xr > 8) consume(true, false, buf, acc, u, window);
    else consume(false, false, buf, acc, u, window);
  };
  // The unit's sums: D rows are tokens (16 tile + lane / 4, and + 8), columns the group's rows 2 q, 2 q + 1.
  auto store = [&](const float (&acc)[TILES][4], int u) {
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile) {
      if (16 * tile >= xr) break;
      const int t = 16 * tile + n;
      sums[(u * xr + t) * 8 + 2 * q] = acc[tile][0];
      sums[(u * xr + t) * 8 + 2 * q + 1] = acc[tile][1];
      if (xr > 8) {
        sums[(u * xr + t + 8) * 8 + 2 * q] = acc[tile][2];
        sums[(u * xr + t + 8) * 8 + 2 * q + 1] = acc[tile][3];
      }
    }
  };
  unsigned long long seen;  // the barrier's arrivals before this CTA's (thread 0's; fused_barrier)
  {
    // Launched as a programmatic dependent (sm_90: dependent_launch.cuh), this CTA may become resident
    // before the kernel before it has finished: every global read comes after the wait, Wg's included
    // (a kernel before may write the weights in place: a cast, an optimizer step, a weight sync), and so
    // do the workspace's writes. The next kernel may launch at once (bench/README.md v72).
    TWELL_DECODE_FUSED_STAMP(0);  // resident
    wait_for_previous_kernel();
    allow_next_kernel();
    // x first, so that it does not queue behind Wg: rows past the call and values past K are zeros (the
    // padded k32 block multiplies zeros).
    for (int i = tid; i < xr * (KB * 4); i += THREADS) {
      const int t = i / (KB * 4), k = i % (KB * 4) * 8;
      const bool valid = t < m && k < K;
      cp_async_16(xs + t * LDX + k, p.x + (valid ? static_cast<int64_t>(t) * p.ldx + k : 0), valid);
    }
    cp_async_commit();
    // The warp's first unit: its first window requested before x is waited for.
    uint4 buf[WIN];
    if (warp < units) issue(buf, warp, 0);
    require_dynamic_smem(static_cast<uint32_t>(sm::decode_fused_bytes(K, rows_cap, P, xr)));
    // The per-token row bits and the active rows' count, which the g pass sets (the barrier below orders
    // these writes before it).
    for (int i = tid; i < xr * bit_words; i += THREADS) tok_bits[i] = 0u;
    if (tid == 0) active_count = 0;
    seen = fused_barrier_seen(b.arrivals);
    cp_async_wait<0>();
    __syncthreads();
    TWELL_DECODE_FUSED_STAMP(1);  // x arrived
    if (warp < units) {
      float acc[TILES][4] = {};
      consume_rows(buf, acc, warp, 0);
#pragma unroll 1
      for (int window = 1; window < NW; ++window) {
        issue(buf, warp, window);
        consume_rows(buf, acc, warp, window);
      }
      store(acc, warp);
    }
  }
  // More units than warps (rows per CTA above 8 WARPS / S): one window at a time.
#pragma unroll 1
  for (int u = warp + WARPS; u < units; u += WARPS) {
    uint4 buf[WIN];
    float acc[TILES][4] = {};
#pragma unroll 1
    for (int window = 0; window < NW; ++window) {
      issue(buf, u, window);
      consume_rows(buf, acc, u, window);
    }
    store(acc, u);
  }
  __syncthreads();
  TWELL_DECODE_FUSED_STAMP(2);  // the Wg stream and its mma steps done (every warp)

  // g per (row, token): the slices in order, rounded, activated; the rows' token masks (xr lanes per
  // row: tokens 0..xr - 1), each active (row, token) as a bit of tok_bits[t] (32 rows a word: the pairs'
  // ranks below), each row with an active token into the active rows (in any order: a warp per row
  // below, whose results do not depend on it).
  for (int base = 0; base < R * xr; base += THREADS) {  // uniform trip count: the ballot below
    const int i = base + tid, r = i / xr, t = i % xr;
    bool on = false;
    if (r < R) {
      float s = 0.0f;
#pragma unroll
      for (int sl = 0; sl < S; ++sl) s += sums[((r / 8 * S + sl) * xr + t) * 8 + r % 8];
      const uint16_t a = activate<Value, Config::activation>(Value::from_float(s));
      on = t < m && is_active<Value, Config::activation>(a, Config::threshold);
      act[r * xr + t] = Value::to_float(a);
      if (on) atomicOr(&tok_bits[t * bit_words + r / 32], 1u << (r % 32));
    }
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, on);
    const uint32_t mask = (ballot >> (lane & ~(xr - 1))) & (xr == 32 ? ~0u : (1u << xr) - 1u);
    if (r < R && t == 0) {
      row_mask[r] = mask;
      if (mask != 0u) active[atomicAdd(&active_count, 1)] = r;
    }
    // An active row's Wu into L2 now, its xr lanes a 128-byte line each in turn: the h pass below reads
    // it after the counts, so its DRAM round trip starts here (bench/README.md v76).
    if constexpr (Config::gated) {
      if (r < R && mask != 0u)
        for (int k = t * 64; k < K; k += xr * 64)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_up + static_cast<int64_t>(r0 + r) * p.ldwu + k) : "memory");
    }
  }
  __syncthreads();
  TWELL_DECODE_FUSED_STAMP(8);  // g, masks, row bits, active list, Wu prefetches issued
  // Per token t < m, a thread: its count of active rows into the workspace (b.counts[t][c]).
  if (tid < m) {
    int n_t = 0;
    for (int w = 0; w < bit_words; ++w) n_t += __popc(tok_bits[tid * bit_words + w]);
    b.counts[tid * P + c] = static_cast<uint32_t>(n_t);
  }
  TWELL_DECODE_FUSED_STAMP(3);  // g, masks, bits, counts
  const int n_active = active_count;
  // h per active (row, token), a warp per row: Wd's data into L2 first (phase 2 reads it), then Wu_j
  // once for all the row's tokens (warp_dot_16B, the row consumers' dot); each (j, h) into its pair
  // slot: token t's rank-th active row of the CTA (ascending rows).
  for (int e = warp; e < n_active; e += WARPS) {
    const int r = active[e], j = r0 + r;
    const uint32_t mask = row_mask[r];
    if constexpr (Config::down_in_out) {
      for (int k = lane * 64; k < K; k += 32 * 64)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_down + static_cast<int64_t>(j) * p.ldwd + k) : "memory");
    } else {
      for (int k = lane; k < K; k += 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_down + static_cast<int64_t>(k) * p.ldwd + j) : "memory");
    }
    for (uint32_t left = mask; left != 0; left &= left - 1) {
      const int t = __ffs(left) - 1;
      float h = act[r * xr + t];
      if constexpr (Config::gated) h *= warp_dot_16B<Value, K>(xs + t * LDX, p.w_up + static_cast<int64_t>(j) * p.ldwu, lane);  // h = a u
      if (lane == 0) {
        int rank = __popc(tok_bits[t * bit_words + r / 32] & ((1u << (r % 32)) - 1u));
        for (int w = 0; w < r / 32; ++w) rank += __popc(tok_bits[t * bit_words + w]);
        b.pairs[(static_cast<int64_t>(t) * P + c) * rows_cap + rank] =
            static_cast<unsigned long long>(__float_as_uint(h)) << 32 | static_cast<uint32_t>(j);
      }
    }
  }

  TWELL_DECODE_FUSED_STAMP(4);  // h written (before the grid barrier)
  fused_barrier(b.arrivals, seen);
  TWELL_DECODE_FUSED_STAMP(5);  // past the grid barrier

  // ---- phase 2 (its shared memory from the start again: sm::decode_fused_phase2_bytes) ----
  // The call's pairs in one order, token-major: segment s = t P + c holds CTA c's pairs of token t
  // (rows ascending), so token t's pairs are [seg_start[t P], seg_start[(t + 1) P]), rows ascending.
  const int segs = m * P;
  const int batch_cap = BATCH_PER_ROW * xr;
  uint16_t* ew = reinterpret_cast<uint16_t*>(dynamic_smem);      // [batch_cap][COLS] the batch's Wd values
  float* ph = reinterpret_cast<float*>(ew + batch_cap * COLS);   // [batch_cap] their h
  int* seg_start = reinterpret_cast<int*>(ph + batch_cap);       // [segs + 1]
  // Round trip 1: the counts (thread-contiguous runs of them) and their exclusive scan.
  const int per = (segs + THREADS - 1) / THREADS;
  int mine = 0;
  for (int s = tid * per; s < (tid + 1) * per && s < segs; ++s) {
    const int n_s = static_cast<int>(load_l2_u32(b.counts + s));
    seg_start[s] = n_s;
    mine += n_s;
  }
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) scan_total[warp] = incl;
  __syncthreads();
  int before = incl - mine;
  for (int w = 0; w < warp; ++w) before += scan_total[w];
  for (int s = tid * per; s < (tid + 1) * per && s < segs; ++s) {
    const int n_s = seg_start[s];
    seg_start[s] = before;
    before += n_s;
  }
  if (tid == THREADS - 1) seg_start[segs] = before;
  __syncthreads();
  TWELL_DECODE_FUSED_STAMP(6);  // phase 2: the counts read and scanned
  const int pairs = seg_start[segs];
  const int col = tid % COLS, tok = tid / COLS;  // y's (token, column) of threads below m COLS
  const int tok_first = tok < m ? seg_start[tok * P] : 0, tok_end = tok < m ? seg_start[(tok + 1) * P] : 0;
  for (int chunk = c; chunk * COLS < K; chunk += P) {
    const int k0 = chunk * COLS;
    float y = 0.0f;
    for (int e0 = 0; e0 < pairs; e0 += batch_cap) {
      const int batch = pairs - e0 < batch_cap ? pairs - e0 : batch_cap;
      // Round trips 2 and 3, a thread per pair: its segment (a binary search of seg_start), its (j, h),
      // then its COLS Wd values.
#pragma unroll
      for (int it = 0; it < (BATCH_PER_ROW * XR + THREADS - 1) / THREADS; ++it) {
        const int i = tid + it * THREADS;
        if (i < batch) {
          const int g = e0 + i;
          int lo = 0, hi = segs;  // the last segment starting at or before g: seg_start[lo] <= g < seg_start[lo + 1]
          while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (seg_start[mid] <= g) lo = mid;
            else hi = mid;
          }
          const uint2 pair = load_l2_pair(reinterpret_cast<const uint32_t*>(b.pairs + static_cast<int64_t>(lo) * rows_cap + (g - seg_start[lo])));
          const int j = static_cast<int>(pair.x);
          ph[i] = __uint_as_float(pair.y);
          if constexpr (Config::down_in_out) {
#pragma unroll
            for (int h8 = 0; h8 < COLS / 8; ++h8) {
              uint4 v = make_uint4(0u, 0u, 0u, 0u);
              if (k0 + 8 * h8 < K) v = *reinterpret_cast<const uint4*>(p.w_down + static_cast<int64_t>(j) * p.ldwd + k0 + 8 * h8);
              *reinterpret_cast<uint4*>(ew + i * COLS + 8 * h8) = v;
            }
          } else {
            uint16_t w[COLS];
#pragma unroll
            for (int k = 0; k < COLS; ++k) w[k] = k0 + k < K ? p.w_down[static_cast<int64_t>(k0 + k) * p.ldwd + j] : uint16_t{0};
#pragma unroll
            for (int k = 0; k < COLS; ++k) ew[i * COLS + k] = w[k];
          }
        }
      }
      __syncthreads();
      // y of (token, column): one fmaf chain over the token's pairs, rows ascending, across batches.
      const int from = tok_first > e0 ? tok_first : e0, to = tok_end < e0 + batch ? tok_end : e0 + batch;
      for (int e = from; e < to; ++e) y = fmaf(ph[e - e0], Value::to_float(ew[(e - e0) * COLS + col]), y);
      __syncthreads();
    }
    if (tok < m && k0 + col < K) p.y[static_cast<int64_t>(tok) * p.ldy + k0 + col] = Value::from_float(y);
  }
  TWELL_DECODE_FUSED_STAMP(7);  // y written
}

}  // namespace twell::device
