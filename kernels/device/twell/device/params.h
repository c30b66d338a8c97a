// Kernel parameter blocks shared by the host runtime and the generated CUDA kernels.
//
// Each generated kernel takes one of these structs by value (the decode kernels a second, DecodeBuffers), so
// host and device agree on the ABI by construction: this header is compiled by g++ on the host and by
// NVRTC on the device and holds only fixed-width plain data.
//
// Pointers are device addresses. Element types: activations and weights are 16-bit floats (bf16 or fp16,
// fixed per kernel by the generator) passed as raw uint16_t bits; the TwELL matrix is uint32 words
// (docs/TWELL_FORMAT in README.md). Leading dimensions are in elements.
#pragma once
#ifdef __CUDACC_RTC__
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#endif

namespace twell::device {

// The version of this header's host/device ABI (the structs below and the kernels' argument lists).
// Ahead-of-time bundles record it per kernel (manifest.json "params_version"); the runtime refuses a
// kernel built against another version. Bump it with any change to a struct or an argument list.
constexpr uint32_t kParamsVersion = 11;  // 11: DecodeFusedBuffers' arrivals two counts (arrivals, publications), no grid barrier; 10: DecodeFusedBuffers' (row, h) pairs per token and CTA; 9: DecodeFusedBuffers' h, token masks, row bits, 64-bit arrivals; 8: TrainDenseForwardParams' accumulate_l1; 7: GatedDownParams' entry_u_after_words, TrainRowBackwardParams' entry_u; 6: TrainRowBackwardParams' pass; 5: GatedDownParams' row_l1, TrainRowBackwardParams' l1_weight; 4: TrainWeightGradParams' workspace and entry list; 3: DecodeFusedBuffers; 2: TrainRowBackwardParams' per-entry quads, TrainWeightGradParams

// Word 1 of an overflowing tile-row whose dense copy did not fit in the backup area: consumers
// recompute the tile-row from x and Wg (runtime/include/twell/format.h, the overflow protocol).
constexpr uint32_t kBackupMissing = 0xFFFFFFFFu;

// The driver's CUtensorMap (cuTensorMapEncodeTiled): 128 opaque bytes, 128-byte aligned (CUDA 13's CUtensorMap). Kernels take
// it inside a __grid_constant__ parameter, so its address is a parameter-space address, as TMA needs.
struct alignas(128) TmaDescriptor {
  uint64_t opaque[16];
};

// D2T: H = act(X Wg^T) packed into TwELL in the GEMM epilogue.
struct GateParams {
  const uint16_t* x;          // [M, K] row-major, row stride ldx
  const uint16_t* w_gate;     // [N, K] row-major (nn.Linear [d_ff, d_model]), row stride ldw
  uint32_t* twell;            // [M, tiles * (slots + 1)] words, row-major, dense rows
  uint16_t* backup;           // [backup_capacity, tile_n] dense tile-rows of overflowing (row, tile)s
  uint32_t* overflow_count;   // one counter: overflowing tile-rows seen (may exceed backup_capacity)
  int64_t m;                  // tokens
  int64_t ldx;
  int64_t ldw;
  uint32_t backup_capacity;   // tile-rows the backup can hold
  uint32_t pad_;
  // mainloop wgmma only (zeros otherwise): TMA maps of x ({d_model, M}, box {cta_k, cta_m}) and w_gate
  // ({d_model, d_ff}, box {cta_k, tile_n / cluster_m}), 16-bit elements, swizzled by the box row
  // (128 bytes at cta_k 64, 64 at cta_k 32), out-of-bounds zero fill.
  TmaDescriptor x_map;
  TmaDescriptor w_map;
  // The fused dense gated-up kernel only (gate_twell_wgmma<Config, true>, the dense path's gate and up
  // GEMMs in one): the TMA map of w_up (as w_map's), and its output h = act(x Wg^T) * (x Wu^T),
  // [M, N] row-major with row stride ldh. twell, backup and overflow_count are unused there.
  TmaDescriptor u_map;
  uint16_t* h;
  int64_t ldh;
};

// Gated consumer: y = ((g ⊙ (x Wu^T)) restricted to the active set of g) Wd^T.
struct GatedDownParams {
  const uint16_t* x;          // [M, K], row stride ldx (K = d_model)
  const uint16_t* w_gate;     // [N, K] row stride ldwg: recomputes overflowing tile-rows the backup lacks
  const uint16_t* w_up;       // [N, K] row-major, row stride ldwu
  const uint16_t* w_down;     // out_in: [K, N] row stride ldwd; in_out: [N, K] row stride ldwd
  const uint32_t* twell;      // as written by the gate kernel
  const uint16_t* backup;
  uint16_t* y;                // [M, K] row-major, row stride ldy
  uint32_t* row_counter;      // the warp-per-row consumer's next unclaimed row: zeroed before each launch
  int64_t m;
  int64_t ldx;
  int64_t ldwg;
  int64_t ldwu;
  int64_t ldwd;
  int64_t ldy;
  uint32_t backup_capacity;
  // 1: the warp-per-row consumer of a gated FFN writes u = x . Wu_j of the row's o-th entry (in its order:
  // tiles ascending, then columns; overflowing tile-rows' active columns included) as fp32 element o of
  // row t of entry_u = (float*)(twell + m * tiles * (slots + 1)), [M, tiles * (slots + 1)], for o below
  // tiles * (slots + 1) (later entries: not stored). The training forward keeps it after the TwELL words
  // of its state for the row backward's entries pass (TrainRowBackwardParams::entry_u), which then reads
  // Wd^T rows only. A flag, not a pointer: this struct's size is left as it was, since ptxas spills the
  // token-block consumer (at its register limit) when the parameter block grows.
  uint32_t entry_u_after_words;
  // Null, or [M] fp32: the row consumers (cta_row, warp_row) write sum_j |h_j| of each row, over its
  // active entries in their order (the training forward's L1 term, TRAINING.md: sum / tokens). The
  // token-block and decode kernels do not write it (the training plan runs the row consumers only).
  float* row_l1;
};

// The decode kernels' workspace (decode.cuh), beside the TwELL matrix and backup of GateParams /
// GatedDownParams. Rows: at most the kernels' max_tokens.
struct DecodeBuffers {
  uint16_t* act;            // [max_tokens, act_ld] activated gate values, staged by decode_gate
  uint32_t* tile_arrivals;  // [tiles] decode_gate CTAs done per TwELL tile; 0 between launches
  uint32_t* entries;        // [max_tokens, d_ff] pairs of words per row: column j, fp32 bits of h_j
  int64_t act_ld;           // d_ff rounded up to 8 (16-byte rows)
  // The call's Wu and Wd (GatedDownParams' pointers and strides), for the decode gates' L2 prefetch of
  // their active neurons' rows (a hint: decode_up and decode_down read them, a kernel boundary later).
  const uint16_t* w_up;
  const uint16_t* w_down;
  int64_t ldwu;
  int64_t ldwd;
};

// decode_fused's workspace (decode/decode_fused.cuh). P = the launch's CTAs (one per SM, the same for
// every launch on it), R = ceil(d_ff / P) rows per CTA at most, T = kDecodeFusedTokens. Not cleared
// between calls: each call writes the counts of its m tokens and the pairs they count before it
// publishes them, except the two counts of `arrivals`, which are zeroed once when allocated and only grow.
struct DecodeFusedBuffers {
  unsigned long long* pairs;     // [T][P][R] CTA c's active rows of token t, ascending: j | bits(h) << 32
                                 // (bits(h) = kDecodeFusedNoH until h is written)
  uint32_t* counts;              // [T][P] how many rows of CTA c token t activates
  unsigned long long* arrivals;  // [2]: the CTAs' arrivals, their publications (P per launch each)
};
// A pair's h bits until its owner has written h: a NaN no h is written as (decode_fused writes that NaN
// as 0x7FFFFFFF).
constexpr uint32_t kDecodeFusedNoH = 0xFFFFFFFFu;

// Dense path helper: h = act(g) * u elementwise over [M, N] (g, u, h row-major with stride ld).
struct GatedMulParams {
  const uint16_t* gate;
  const uint16_t* up;
  uint16_t* h;
  int64_t m;
  int64_t n;
  int64_t ld;
};

// The dense training path's elementwise steps (train/dense_elementwise.cuh; FfnTrainingPlan with
// TrainingPath::Dense), over [m, n] = [tokens, d_ff] row-major 16-bit matrices of row stride ld.
// a = act(g) where active (numerics.cuh's predicate, the TwELL path's), else 0; h = a u (non-gated: h = a).
//   forward:  h written; row_l1[t] = sum_j |h_tj| (fp32, from the unrounded products, in one fixed order),
//             added to the row_l1[t] found there where accumulate_l1 (a split plan's dense neurons after its
//             TwELL neurons: TrainingPlanOptions::dense_neurons).
struct TrainDenseForwardParams {
  const uint16_t* gate;  // g = x Wg^T
  const uint16_t* up;    // u = x Wu^T; null: non-gated
  uint16_t* h;           // may not alias gate or up
  float* row_l1;         // [m]; null: not written
  int64_t m;
  int64_t n;
  int64_t ld;
  float threshold;
  uint32_t accumulate_l1;
};
//   backward: dh (= dy Wd) in `dh_h` -> dh += l1 sign(h), du = dh a, dg = dh u act'(g) (0 where inactive),
//   written in place: dg over g, du over u, h over dh (the weight gradients' GEMMs read them then).
//   l1 = l1_scale * (*l1_weight where given) where apply_l1 (TrainRowBackwardParams' L1 fields).
struct TrainDenseBackwardParams {
  uint16_t* gate;          // g in, dg out
  uint16_t* up;            // u in, du out; null: non-gated
  uint16_t* dh_h;          // dh in, h out
  const float* l1_weight;  // a device fp32 or null
  float l1_scale;
  uint32_t apply_l1;
  int64_t m;
  int64_t n;
  int64_t ld;
  float threshold;
};

// The training backward by token row (train/row_backward.cuh; twell/training.h): for the forward's
// TwELL matrix of a = act(g) (GateParams' twell and backup, as the gate kernel wrote them) and the
// upstream gradient dy, per active entry (t, j) dh = dy_t . Wd(:, j) + l1_scale sign(h), u = x_t . Wu_j,
// h = a u, du = dh a, dg = dh u act'(g) (non-gated: h = a, dg = dh act'(g)); and
// dx_t = sum_j du Wu_j + dg Wg_j. The per-entry values are addressed like the TwELL matrix, as quads
// of fp32 {dg, du, h, a} (du = 0 non-gated; h = a u, or a non-gated; a the activated value, nonzero on
// every active entry since the predicate a > t >= 0 or |a| > t > 0 excludes 0), one per word:
//   entry_grad [M, tiles * (slots + 1)] quads:
//     a tile-row within its slots: the quad of word 1 + e is entry e's; word 0's quad is not written;
//     an overflowing tile-row: word 1's quad is {grad row b as uint32 bits, 0, 0, 0}, its entries being
//     row b of backup_grad (kBackupMissing: backup_grad was full, see grad_overflow_count);
//   backup_grad [grad_capacity, tile_n] quads: column c of row b is column n0 + c of the tile-row
//     ({+0, +0, +0, +0} where inactive: a = 0 marks it). A tile-row the gate stored in backup row b < backup_capacity
//     takes grad row b; one the gate could not store (kBackupMissing) claims row backup_capacity + i,
//     i from the atomic grad_overflow_count (zeroed before the launch; it counts every claim, also past
//     grad_capacity, so the host can grow backup_grad and run again).
// TrainRowBackwardParams::pass: what one launch of the row backward does. The CTA-per-row form does it
// all in one launch (kTrainRowAll); the warp-per-row form runs as two launches on the stream, each with
// fewer live registers than one pass (train/row_backward.cuh): kTrainRowEntries (each entry's dh and u
// from the rows of Wd^T and Wu: the quads) then kTrainRowDx (dx from the quads and the rows of Wu and Wg,
// a 1024-column slice of d_model at a time, two entries' rows in flight).
enum TrainRowPass : uint32_t { kTrainRowAll = 0, kTrainRowEntries = 1, kTrainRowDx = 2 };

struct TrainRowBackwardParams {
  const uint16_t* x;          // [M, K] row stride ldx (K = d_model)
  const uint16_t* w_gate;     // [N, K] row stride ldwg
  const uint16_t* w_up;       // [N, K] row stride ldwu; null for a non-gated kernel
  const uint16_t* w_down;     // in_out: [N, K] (rows of Wd^T), row stride ldwd
  const uint32_t* twell;      // [M, tiles * (slots + 1)] words, dense rows, as the gate kernel wrote them
  const uint16_t* backup;     // [backup_capacity, tile_n]
  const uint16_t* dy;         // [M, K] row stride lddy
  uint16_t* dx;               // [M, K] row stride lddx
  float* entry_grad;          // [M, tiles * (slots + 1), 4], 16-byte aligned
  float* backup_grad;         // [grad_capacity, tile_n, 4], 16-byte aligned
  uint32_t* grad_overflow_count;
  int64_t m;
  int64_t ldx;
  int64_t ldwg;
  int64_t ldwu;
  int64_t ldwd;
  int64_t lddy;
  int64_t lddx;
  uint32_t backup_capacity;   // the forward's: tile-rows of `backup`
  uint32_t grad_capacity;     // rows of backup_grad (>= backup_capacity)
  float l1_scale;             // fp32(lambda / M), the L1 term's coefficient (TRAINING.md)
  uint32_t apply_l1;          // 1 where lambda != 0: dh += l1_scale * sign(h)
  // Null, or one device fp32 w: the coefficient is then l1_scale * w (the L1 term's upstream gradient,
  // PyTorch autograd's, read on the device: no host synchronization).
  const float* l1_weight;
  uint32_t pass;              // TrainRowPass: kTrainRowAll for the CTA form, else one of the warp form's two
  uint32_t pad_;
  // Null, or the forward's GatedDownParams::entry_u (gated, warp-per-row consumer): the warp form's
  // entries pass takes u of the entries of tile-rows within their slots from it (where stored) instead of
  // x . Wu_j (the same arithmetic, so the same bits; half the weight bytes). The CTA form, overflowing
  // tile-rows and tile-rows with an entry at or past ordinal tiles * (slots + 1) recompute u.
  const float* entry_u;
};

// The weight gradients of the training backward (train/weight_grad.cuh; twell/training.h): from the
// TwELL words and TrainRowBackwardParams' per-entry quads {dg, du, h, a} (entry_grad, backup_grad as the
// row backward wrote them), x and dy, in fp32 per neuron j and column k:
//   dw_gate[j, k] = sum_t dg_tj x_tk,  dw_up[j, k] = sum_t du_tj x_tk,  dw_down[j, k] = sum_t h_tj dy_tk
// (t ascending over the tokens that activate j, one fma per term from +0: reference_training_backward's
// order), each [N, K] row-major (dw_down is Wd's gradient in the in_out layout, the rows of dWd^T).
// Outputs are fp32, or the 16-bit dtype where output_dtype is 1 (rounded once from the fp32 sum). A
// tile that meets an overflowing tile-row without a grad row (kBackupMissing in entry_grad, or a row
// >= grad_capacity) has no gradients to sum: its neurons' outputs are written as NaN.
struct TrainWeightGradParams {
  const uint16_t* x;          // [M, K] row stride ldx
  const uint16_t* dy;         // [M, K] row stride lddy
  const uint32_t* twell;      // [M, tiles * (slots + 1)] words, dense rows
  const float* entry_grad;    // [M, tiles * (slots + 1), 4], 16-byte aligned
  const float* backup_grad;   // [grad_capacity, tile_n, 4], 16-byte aligned
  void* dw_gate;              // [N, K] row stride ld_dw_gate (elements of the output type)
  void* dw_up;                // [N, K] row stride ld_dw_up; null for a non-gated kernel
  void* dw_down;              // [N, K] (in_out: dWd^T) row stride ld_dw_down
  // shared_memory::TrainWeightGradWorkspace::words(tiles, N) words; its first cleared(tiles) zero
  uint32_t* workspace;
  // The entries sorted by neuron, word pairs {token, quad}: quad < M * words_per_row is entry_grad's quad at that
  // word, else backup_grad's quad (quad - M * words_per_row). Room for every word of the TwELL matrix
  // and of backup_grad (M * words_per_row + grad_capacity * tile_n < 2^32 entries).
  uint32_t* entry_list;
  int64_t m;
  int64_t ldx;
  int64_t lddy;
  int64_t ld_dw_gate;
  int64_t ld_dw_up;
  int64_t ld_dw_down;
  uint32_t grad_capacity;     // rows of backup_grad
  uint32_t output_dtype;      // 0: fp32 outputs; 1: the kernel's 16-bit dtype
};

// out [cols, rows] = in [rows, cols]^T (row-major, strides in elements): the runtime's layout
// normalization of nn.Linear down weights.
// Neuron reordering on the device (permute_neurons in twell/neuron_order.h), a 16-bit [rows, cols]
// matrix: by_rows: out row i = in row order[i]; else out[r][i] = in[r][order[i]] (the columns).
struct PermuteParams {
  const uint16_t* in;
  uint16_t* out;
  const uint32_t* order;  // rows (by_rows) or cols entries, each a row or column index of `in`
  int64_t rows;
  int64_t cols;
  int64_t ld_in;
  int64_t ld_out;
  uint32_t by_rows;
  uint32_t pad_;
};

struct TransposeParams {
  const uint16_t* in;
  uint16_t* out;
  int64_t rows;
  int64_t cols;
  int64_t ld_in;
  int64_t ld_out;
};

}  // namespace twell::device
