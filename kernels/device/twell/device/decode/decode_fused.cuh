// decode_fused: the whole FFN of at most 32 token rows in one persistent, cooperative kernel, one CTA per
// SM (issue 17; PERFORMANCE.md, "Small M"; bench/README.md v38, v64, v67, v68, v75-v77). At a few rows
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
//   block's products, a permutation of the block's k order applied to A and B alike. Each unit's blocks
//   run ascending; the slices' sums are added in slice order. g is rounded to the value type and
//   activated as every twell gate does (numerics.cuh).
// In the same pass as g, each token's active rows of the CTA as bits (shared-memory atomics) and each
//   active row's Wu_j (gated) and in_out Wd_j lines into L2 (prefetch), the active rows listed by
//   atomicAdd in no fixed order. Then one thread per token writes its active rows' pairs (j, no h yet:
//   params.h kDecodeFusedNoH) at their ranks (rows ascending; b.pairs[t][c][rank]) and its count
//   (b.counts[t][c]), and thread 0 publishes the CTA: a release add on the publication count, which
//   grows by P per launch (the launch's number comes from the arrival count, one atomic per CTA).
// Then the CTA's warps split (no grid barrier, bench/README.md v77): the last HWARPS (8) compute h, all
//   24 where the CTA has more active rows than that: per active row j (a warp each; out_in Wd's data
//   into L2) and per token t that activates j, h = a (x_t . Wu_j) with the row consumers' warp dot order
//   (non-gated: h = a), written into its pair as (j, h) by one 64-bit store: Wu_j is read once for all
//   the call's tokens that need it.
// The reduction, the first RWARPS (16) warps of each CTA with a column chunk: kDecodeFusedColumns (16)
//   output columns of every token. The pairs of the whole call in one order, token-major and rows
//   ascending (segment t P + c: CTA c's pairs of token t): thread 0 polls the publication count (acquire)
//   until every CTA of this launch has published, then the m P counts in one round trip and their
//   exclusive scan; then batches of kDecodeFusedBatchPerRow pairs per token row, a thread per pair (up to
//   ITERS of them per thread and batch, their loads in flight together): its
//   (j, h) word, its 16 Wd values of the columns (two 16-byte loads in_out, 16 scalar ones out_in),
//   and, if h was not yet written, its word again until it is (relaxed loads: the Wd round trip
//   overlaps the wait). Wd's rows are read once per pair, so the bytes are the sum over tokens of their
//   active rows, of which only Wd's 32 bytes per pair and CTA. A thread per (token, column) then sums
//   its token's pairs: y is one fmaf chain from +0 over the token's active rows ascending, across batches.
//   Nothing that a reducer waits for waits itself: every CTA publishes before any of its warps waits,
//   and the warps that write h never wait (reducer warps that help with h write theirs before they
//   reduce); the cooperative launch keeps all CTAs resident, so every awaited write is made.
//
// Rounding and determinism: the gate's g is the dot of the large-M gates in another order (k slices of
// d_model, each in k16 steps over a permuted k, then the slices), y's sum over the active rows one
// fmaf chain in row order (the large-M down projection adds per tile), so a value may differ from the
// large-M path's in its last bits, and a neuron within that of the threshold may be active on one path
// and not the other; y is then within the documented tolerance (1e-2 relative) of the large-M path's,
// not its bits. Every order y depends on is fixed by the shape and the launch's CTA count (the active
// list's order only decides which warp computes a row's h; the order in which pairs' h arrive only how
// long a reducer waits), so y is the same bits on every run. No TwELL
// matrix is written (FfnPlan::download_twell says so after such a call).
#pragma once
#include "twell/device/consumer/consumer_common.cuh"
#include "twell/device/primitives/dependent_launch.cuh"
#include "twell/device/primitives/grid_sync.cuh"  // the relaxed and release accesses

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

// A window of WIN 16-byte pieces of a Wg row at src, 64 bytes apart (loaded as load_stream_16 does), all
// addressed from one base register with immediate offsets (PTX ISA, "Addresses as Operands": [reg+imm]).
// With a pointer operand per piece (v77), ptxas kept an address register pair per load beside the 64 data
// registers and issued the window's last load after a spill store that waits for an earlier piece's data
// (bench/README.md v81: this form measured equal at M <= 4 and 0.1-0.4 us faster at 16-32 tokens).
// `valid`: else zeros (predicated, no branch).
template <int I, int WIN>
__device__ __forceinline__ void load_stream_window(uint4 (&buf)[WIN], const uint16_t* src, bool valid) {
  if constexpr (I < WIN) {
    buf[I] = make_uint4(0u, 0u, 0u, 0u);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4+%6];\n}"
        : "+r"(buf[I].x), "+r"(buf[I].y), "+r"(buf[I].z), "+r"(buf[I].w)
        : "l"(src), "r"(static_cast<int>(valid)), "n"(I * 64));
    load_stream_window<I + 1, WIN>(buf, src, valid);
  }
}

// The launch number of decode_fused: each CTA adds 1 to the arrival count once the kernel before it is
// complete (all P CTAs of the previous launch have added theirs), so a launch's P additions return
// [n P, (n + 1) P) and its number is n + 1: its CTAs' publications bring the publication count (which
// grows by P per launch too, from 0) to (n + 1) P. Thread 0's, issued before phase 1's loads and first
// used by its reducer's poll, so that its round trip is not waited for. This holds while every launch on
// the workspace has the same P and runs to its end: FfnPlan launches fusedCtas(SM count) CTAs on its own
// workspace every time, and a launch that faults leaves the context unusable.
__device__ __forceinline__ unsigned long long fused_launch_ticket(unsigned long long* arrivals) {
  unsigned long long v = 0;
  if (threadIdx.x == 0) asm volatile("atom.relaxed.gpu.global.add.u64 %0, [%1], 1;" : "=l"(v) : "l"(arrivals) : "memory");
  return v;
}
// A pair's 64-bit word (params.h DecodeFusedBuffers::pairs): its row j and the bits of its h
// (kDecodeFusedNoH until h is written), stored and read whole.
__device__ __forceinline__ unsigned long long fused_pair_word(uint32_t h_bits, int j) {
  return static_cast<unsigned long long>(h_bits) << 32 | static_cast<uint32_t>(j);
}
// The reducer warps' barrier (warps [0, threads)), named barrier 1: the h warps do not take part.
__device__ __forceinline__ void fused_reducer_sync(int threads) { asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory"); }

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
  constexpr int RWARPS = static_cast<int>(sm::kDecodeFusedReducerWarps);  // the reducer warps [0, RWARPS)
  constexpr int RTHREADS = RWARPS * 32, HWARPS = WARPS - RWARPS;           // then the h warps
  constexpr int COUNTS_PER_THREAD =  // the counts a reducer thread reads: all T P at the most CTAs
      static_cast<int>((sm::kDecodeFusedTokens * sm::kDecodeFusedMaxCtas + RTHREADS - 1) / RTHREADS);
  constexpr int XR = static_cast<int>(sm::kDecodeFusedTokens);  // the most tokens (register arrays)
  constexpr int TILES = (XR + 15) / 16;                          // m16 tiles of x at the most tokens
  constexpr int ITERS = static_cast<int>(sm::kDecodeFusedBatchPerRow) * XR / RTHREADS;  // pairs per reducer thread and batch
  static_assert(ITERS * RTHREADS == static_cast<int>(sm::kDecodeFusedBatchPerRow) * XR, "a batch's pairs over the reducer threads");
  static_assert(Config::threads == sm::kDecodeFusedWarps * 32 && Config::max_tokens == XR && K % 8 == 0, "decode_fused shape");
  static_assert(XR <= 32 && THREADS % 32 == 0 && RTHREADS >= COLS * XR && HWARPS >= 1,
                "a token mask is 32 bits; a reducer thread per (token, column); h warps");
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  __shared__ int scan_total[RWARPS];
  __shared__ int active_count;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m = static_cast<int>(p.m);
  const int P = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
  if (m < 1 || m > XR || m * P > COUNTS_PER_THREAD * RTHREADS) __trap();
  // x's tiles and every per-token array of shared memory: 8 rows (the mma's A rows 0-7), 16 or 32 (two m16 tiles).
  const int xr = static_cast<int>(sm::decode_fused_token_rows(m));
  const int rows_cap = (N + P - 1) / P;
  const int bit_words = static_cast<int>(sm::decode_fused_bit_words(rows_cap));  // 32-row words per CTA
  // x's rows are written first: their room is checked before, the whole layout's once Wg is in flight.
  const int h_bytes = static_cast<int>(sm::decode_fused_h_bytes(rows_cap, xr));
  require_dynamic_smem(static_cast<uint32_t>(h_bytes + xr * LDX * 2));
  const int r0 = static_cast<int>(static_cast<int64_t>(c) * N / P);
  const int R = static_cast<int>(static_cast<int64_t>(c + 1) * N / P) - r0;
  const int units = (R + 7) / 8 * S;

  // Shared memory (shared_memory.h): first what the h pass reads (sm::decode_fused_h_bytes: a per (row,
  // token), the rows' token masks, the active rows in the g pass's order, the tokens' row bits), then
  // phase 1's x [xr][LDX] and the units' sums [units][xr tokens][8 rows] (sm::decode_fused_phase1_bytes),
  // which the reduction reuses.
  float* act = reinterpret_cast<float*>(dynamic_smem);                     // [rows_cap][xr]
  uint32_t* row_mask = reinterpret_cast<uint32_t*>(act + rows_cap * xr);  // [rows_cap]
  int* active = reinterpret_cast<int*>(row_mask + rows_cap);              // [rows_cap]
  uint32_t* tok_bits = reinterpret_cast<uint32_t*>(active + rows_cap);    // [xr][bit_words]
  uint16_t* xs = reinterpret_cast<uint16_t*>(dynamic_smem + h_bytes);     // [xr][LDX] (the reduction's after the g pass)
  float* sums = reinterpret_cast<float*>(xs + xr * LDX);                  // [units][xr][8]

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
    if constexpr (EXACT) {
      load_stream_window<0, WIN>(buf, src, valid_row);
    } else {
#pragma unroll
      for (int i = 0; i < WIN; ++i)
        buf[i] = valid_row && (first + i < end && 32 * (first + i) + 8 * q < K) ? load_stream_16(src + 32 * i)
                                                                                : make_uint4(0u, 0u, 0u, 0u);
    }
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
  unsigned long long ticket;  // thread 0's arrival (fused_launch_ticket), first used by its reducer
  {
    // Launched as a programmatic dependent (sm_90: dependent_launch.cuh), this CTA may become resident
    // before the kernel before it has finished: every global read comes after the wait, Wg's included
    // (a kernel before may write the weights in place: a cast, an optimizer step, a weight sync), and so
    // do the workspace's writes. The next kernel may launch at once (bench/README.md v72).
    TWELL_DECODE_FUSED_STAMP(0);  // resident
    wait_for_previous_kernel();
    allow_next_kernel();
    // The launch number first: an atomic issued behind the CTA's Wg loads held the CTA's phase 1 back
    // (bench/README.md v77).
    ticket = fused_launch_ticket(b.arrivals);
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
    // An active row's Wu (and in_out Wd) into L2 now, its xr lanes a 128-byte line each in turn: the h
    // pass and the reducers read them later, so their DRAM round trips start here (bench/README.md v76).
    if (r < R && mask != 0u) {
      if constexpr (Config::gated)
        for (int k = t * 64; k < K; k += xr * 64)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_up + static_cast<int64_t>(r0 + r) * p.ldwu + k) : "memory");
      if constexpr (Config::down_in_out)
        for (int k = t * 64; k < K; k += xr * 64)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_down + static_cast<int64_t>(r0 + r) * p.ldwd + k) : "memory");
    }
  }
  __syncthreads();
  TWELL_DECODE_FUSED_STAMP(8);  // g, masks, row bits, active list, Wu and in_out Wd prefetches issued
  // Per token t < m, a thread: its active rows' pairs (j, no h yet) at their ranks (rows ascending),
  // and its count (b.counts[t][c]); then the CTA's publication (thread 0, a release add after the barrier
  // below, so that the reducers that see it read these j and can fetch Wd while h is computed).
  unsigned long long* const pairs_of = b.pairs + static_cast<int64_t>(c) * rows_cap;  // + t P rows_cap: segment t P + c
  if (tid < m) {
    unsigned long long* seg = pairs_of + static_cast<int64_t>(tid) * P * rows_cap;
    int n_t = 0;
    for (int w = 0; w < bit_words; ++w)
      for (uint32_t bits = tok_bits[tid * bit_words + w]; bits != 0u; bits &= bits - 1u)
        store_relaxed_u64(seg + n_t++, fused_pair_word(kDecodeFusedNoH, r0 + 32 * w + __ffs(bits) - 1));
    b.counts[tid * P + c] = static_cast<uint32_t>(n_t);
  }
  TWELL_DECODE_FUSED_STAMP(3);  // g, masks, bits, pairs' j and counts written (published after the barrier below)
  const int n_active = active_count;
  // The pairs' j above come before their (j, h) below in the slots' order (the barrier orders the two
  // threads' stores to the same word), and before the publication.
  __syncthreads();
  if (tid == 0) asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(b.arrivals + 1) : "memory");
  // h per active (row, token), a warp per row, the h warps first (the reducer warps help where rows
  // outnumber them): out_in Wd's data into L2 (the reducers read it), then Wu_j once for all the row's
  // tokens (warp_dot_16B, the row consumers' dot); each (j, h) into its pair slot: token t's rank-th
  // active row of the CTA (ascending rows), one 64-bit store.
  {
    const int order = warp >= RWARPS ? warp - RWARPS : warp + HWARPS;
    const int helpers = n_active > HWARPS ? WARPS : HWARPS;
    for (int e = order; order < helpers && e < n_active; e += helpers) {
      const int r = active[e], j = r0 + r;
      const uint32_t mask = row_mask[r];
      if constexpr (!Config::down_in_out) {
        for (int k = lane; k < K; k += 32)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(p.w_down + static_cast<int64_t>(k) * p.ldwd + j) : "memory");
      }
      for (uint32_t left = mask; left != 0; left &= left - 1) {
        const int t = __ffs(left) - 1;
        float h = act[r * xr + t];
        if constexpr (Config::gated)  // h = a u; x's row from global memory (L2): the reducers reuse xs
          h *= warp_dot_16B<Value, K>(p.x + static_cast<int64_t>(t) * p.ldx, p.w_up + static_cast<int64_t>(j) * p.ldwu, lane);
        if (lane == 0) {
          int rank = __popc(tok_bits[t * bit_words + r / 32] & ((1u << (r % 32)) - 1u));
          for (int w = 0; w < r / 32; ++w) rank += __popc(tok_bits[t * bit_words + w]);
          uint32_t h_bits = __float_as_uint(h);
          if (h_bits == kDecodeFusedNoH) h_bits = 0x7FFFFFFFu;  // another NaN
          store_relaxed_u64(pairs_of + static_cast<int64_t>(t) * P * rows_cap + rank, fused_pair_word(h_bits, j));
        }
      }
    }
  }
  // ---- the reduction: the reducer warps of CTAs with a column chunk (the h warps may still run) ----
  if (warp >= RWARPS || c * COLS >= K) return;
  // The call's pairs in one order, token-major: segment s = t P + c holds CTA c's pairs of token t
  // (rows ascending), so token t's pairs are [seg_start[t P], seg_start[(t + 1) P]), rows ascending.
  const int segs = m * P;
  const int batch_cap = static_cast<int>(sm::kDecodeFusedBatchPerRow) * xr;
  // Its shared memory: phase 1's x and sums (the h warps read x from global memory).
  uint16_t* ew = xs;                                            // [batch_cap][COLS]
  float* ph = reinterpret_cast<float*>(ew + batch_cap * COLS);  // [batch_cap] their h
  int* seg_start = reinterpret_cast<int*>(ph + batch_cap);      // [segs + 1]
  // Every CTA's publication of this launch (launch P in all: thread 0 polls, acquire), then the counts in
  // one round trip, and their exclusive scan.
  if (tid == 0) {
    const unsigned long long target = (ticket / static_cast<unsigned long long>(P) + 1) * static_cast<unsigned long long>(P);
    unsigned long long v;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(b.arrivals + 1) : "memory");
    } while (static_cast<long long>(v - target) < 0);
  }
  fused_reducer_sync(RTHREADS);
  TWELL_DECODE_FUSED_STAMP(6);  // every CTA's publication seen
  // The counts into shared memory, each warp's loads one contiguous line (every reducer CTA reads all
  // m P of them: a thread-contiguous run each had a warp touch a line per lane, bench/README.md v77),
  // then each thread's contiguous run summed for the scan.
  {
    uint32_t n[COUNTS_PER_THREAD];  // all of a thread's loads in flight at once
#pragma unroll
    for (int i = 0; i < COUNTS_PER_THREAD; ++i)
      if (tid + i * RTHREADS < segs) n[i] = load_l2_u32(b.counts + tid + i * RTHREADS);
#pragma unroll
    for (int i = 0; i < COUNTS_PER_THREAD; ++i)
      if (tid + i * RTHREADS < segs) seg_start[tid + i * RTHREADS] = static_cast<int>(n[i]);
  }
  fused_reducer_sync(RTHREADS);
  const int per = (segs + RTHREADS - 1) / RTHREADS, s0 = tid * per;
  const int mine_n = segs - s0 < per ? (segs - s0 > 0 ? segs - s0 : 0) : per;
  int mine = 0;
  for (int s = s0; s < s0 + mine_n; ++s) mine += seg_start[s];
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) scan_total[warp] = incl;
  fused_reducer_sync(RTHREADS);
  int before = incl - mine;
  for (int w = 0; w < warp; ++w) before += scan_total[w];
  for (int s = s0; s < s0 + mine_n; ++s) {
    const int n_s = seg_start[s];
    seg_start[s] = before;
    before += n_s;
  }
  if (tid == RTHREADS - 1) seg_start[segs] = before;
  fused_reducer_sync(RTHREADS);
  TWELL_DECODE_FUSED_STAMP(4);  // every CTA's publication seen, the counts read and scanned
  const int pairs = seg_start[segs];
  const int col = tid % COLS, tok = tid / COLS;  // y's (token, column) of threads below m COLS
  const int tok_first = tok < m ? seg_start[tok * P] : 0, tok_end = tok < m ? seg_start[(tok + 1) * P] : 0;
  for (int chunk = c; chunk * COLS < K; chunk += P) {
    const int k0 = chunk * COLS;
    float y = 0.0f;
    for (int e0 = 0; e0 < pairs; e0 += batch_cap) {
      const int batch = pairs - e0 < batch_cap ? pairs - e0 : batch_cap;
      // A thread per pair (up to ITERS each): its segment (a binary search of seg_start) and its (j, h)
      // word, then its COLS Wd values, then its h once the owner has written it; each step's loads of
      // all the thread's pairs in flight together (the Wd round trip overlaps the wait for h).
      const unsigned long long* slot[ITERS];
      unsigned long long pair[ITERS];
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int i = tid + it * RTHREADS, g = e0 + i;
        if (i >= batch) break;
        int lo = 0, hi = segs;  // the last segment starting at or before g: seg_start[lo] <= g < seg_start[lo + 1]
        while (hi - lo > 1) {
          const int mid = (lo + hi) / 2;
          if (seg_start[mid] <= g) lo = mid;
          else hi = mid;
        }
        slot[it] = b.pairs + static_cast<int64_t>(lo) * rows_cap + (g - seg_start[lo]);
        pair[it] = load_relaxed_u64(slot[it]);
      }
      // Pair `it`'s h once its owner has written it (its word read again until then).
      auto await_h = [&](int it) {
        while (static_cast<uint32_t>(pair[it] >> 32) == kDecodeFusedNoH) pair[it] = load_relaxed_u64(slot[it]);
        return __uint_as_float(static_cast<uint32_t>(pair[it] >> 32));
      };
      if constexpr (Config::down_in_out) {
        uint4 v[ITERS][COLS / 8];
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          if (tid + it * RTHREADS >= batch) break;
          const uint16_t* row = p.w_down + static_cast<int64_t>(static_cast<uint32_t>(pair[it])) * p.ldwd + k0;
#pragma unroll
          for (int h8 = 0; h8 < COLS / 8; ++h8)
            v[it][h8] = k0 + 8 * h8 < K ? *reinterpret_cast<const uint4*>(row + 8 * h8) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const int i = tid + it * RTHREADS;
          if (i >= batch) break;
          const float h = await_h(it);
#pragma unroll
          for (int h8 = 0; h8 < COLS / 8; ++h8) *reinterpret_cast<uint4*>(ew + i * COLS + 8 * h8) = v[it][h8];
          ph[i] = h;
        }
      } else {  // COLS scalar loads per pair, stored as they come (registers for all ITERS pairs' would spill)
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const int i = tid + it * RTHREADS;
          if (i >= batch) break;
          const int j = static_cast<int>(static_cast<uint32_t>(pair[it]));
          uint16_t w[COLS];
#pragma unroll
          for (int k = 0; k < COLS; ++k) w[k] = k0 + k < K ? p.w_down[static_cast<int64_t>(k0 + k) * p.ldwd + j] : uint16_t{0};
#pragma unroll
          for (int k = 0; k < COLS; ++k) ew[i * COLS + k] = w[k];
        }
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const int i = tid + it * RTHREADS;
          if (i >= batch) break;
          ph[i] = await_h(it);
        }
      }
      fused_reducer_sync(RTHREADS);
      if (e0 == 0) TWELL_DECODE_FUSED_STAMP(5);  // the first batch's pairs, Wd and h in shared memory (none: no stamp)
      // y of (token, column): one fmaf chain over the token's pairs, rows ascending, across batches.
      const int from = tok_first > e0 ? tok_first : e0, to = tok_end < e0 + batch ? tok_end : e0 + batch;
      int e = from;
      for (; e + 4 <= to; e += 4) {  // 4 pairs' loads at once, the same chain
        float hv[4], wv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) hv[u] = ph[e + u - e0], wv[u] = Value::to_float(ew[(e + u - e0) * COLS + col]);
#pragma unroll
        for (int u = 0; u < 4; ++u) y = fmaf(hv[u], wv[u], y);
      }
      for (; e < to; ++e) y = fmaf(ph[e - e0], Value::to_float(ew[(e - e0) * COLS + col]), y);
      fused_reducer_sync(RTHREADS);
    }
    if (tok < m && k0 + col < K) p.y[static_cast<int64_t>(tok) * p.ldy + k0 + col] = Value::from_float(y);
  }
  TWELL_DECODE_FUSED_STAMP(7);  // y written
}

}  // namespace twell::device
