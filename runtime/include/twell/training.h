// Training kernels of the sparse FFN on the GPU (issue 15; ../shared/design/TRAINING.md). Their CPU oracle is
// twell/training_reference.h.
//
// The backward by token row (train_row_backward): from the forward's TwELL matrix of a = act(g) (the
// gate kernel's words and overflow backup: FfnPlan::run_gate's, or any matrix with the same
// structure), the upstream gradient dy and the L1 coefficient lambda, per active entry (t, j)
//   dh = dy_t . Wd(:, j) + (lambda / M) sign(h)   (the second term only where lambda != 0)
//   u  = x_t . Wu_j (recomputed as the row consumer does, or the forward's: entry_u),  h = a u
//   du = dh a,  dg = (dh u) act'(g)               (non-gated: h = a, dg = dh act'(g), no du)
//   dx_t = sum_j du_tj Wu_j + dg_tj Wg_j          (rounded to the dtype once)
// act'(g) as training_reference.h's activation_derivative: 1 for ReLU; for SiLU at the gate's g, which
// the kernel recomputes from x and Wg with the gate kernel's arithmetic (the TwELL matrix holds a only).
//
// Numerics against reference_training_backward (on the same support): each dot product (dh, u) is an
// fp32 sum in another order than the reference's (per lane 8-value chunks, then a butterfly over the
// warp), so dh and u, and hence du and dg, differ by rounding (about d_model * 2^-24 of the sum of the
// terms' magnitudes); dx sums each column in the reference's order (entries j ascending, du's term then
// dg's, one fma each), so it differs only through du and dg; SiLU's derivative uses the GPU's expf
// (within 2 ulp of the host's). Tests hold the norm-wise relative error under 1e-2; with ReLU on data
// whose sums are exact in fp32, every value is the reference's bit for bit (tests/gpu/train_gpu_test.cpp).
//
// Bitwise deterministic: the same inputs give the same dx and the same {dg, du, h} for every entry, run
// after run (which grad row an overflowing tile-row without a forward backup row takes may differ).
//
// The weight gradients (train_weight_grad), from the same TwELL words and the row backward's per-entry
// values, in fp32 per neuron j:
//   dWg_j = sum_t dg_tj x_t,  dWu_j = sum_t du_tj x_t,  dWd^T_j = sum_t h_tj dy_t
// over the tokens t that activate j, ascending, one fma per term from +0: reference_training_backward's
// order, so on the same dg, du, h they are the reference's bit for bit (tests/gpu/train_gpu_test.cpp,
// exact-sum data); against the reference on random data they differ only through the row backward's
// per-entry rounding (dg, du, h within a few fp32 ulps: tests hold the norm-wise relative error under
// 1e-2). Bitwise deterministic (the entries are sorted by neuron with integer counts; no float atomics).
// dWd is written in the in_out layout, [d_ff, d_model] (the rows of dWd^T, the layout
// train_row_backward reads Wd in); transpose it for an nn.Linear Wd ([d_model, d_ff]).
#pragma once
#include <cstdint>

#include "twell/plan.h"
#include "twell/spec.h"

namespace twell {

class Context;

// Device pointers of one backward call (M = tokens rows, K = d_model, N = d_ff; 16-bit tensors in
// spec.dtype, row strides in elements, 0 = dense):
struct TrainRowBackwardTensors {
  const void* x = nullptr;       // [M, K], the forward's input
  const void* w_gate = nullptr;  // [N, K] (nn.Linear)
  const void* w_up = nullptr;    // [N, K]; nullptr (and ld_up 0) for a non-gated spec
  // [N, K]: Wd in the in_out layout, the rows of Wd^T (each neuron's d_model weights contiguous, read
  // once per entry). An nn.Linear Wd ([K, N], out_in) must be transposed first: FfnPlan does so on the
  // stream with its WeightTranspose kernel; host code can transpose once when the weights change.
  const void* w_down = nullptr;
  // The forward's TwELL matrix (twell/format.h): words [M, tiles * (slots + 1)] (dense rows) and the
  // backup [backup_capacity, tile_n] (dtype) its overflowing tile-rows point into. Not modified.
  const uint32_t* twell = nullptr;
  const void* backup = nullptr;  // may be null where backup_capacity is 0
  const void* dy = nullptr;      // [M, K] dL/dy
  void* dx = nullptr;            // [M, K] output, dtype; must not overlap x or dy
  // Outputs for the weight gradients (train_weight_grad reads them; TrainRowBackwardParams in
  // twell/device/params.h says it in full), quads of fp32 {dg, du, h, a} (du = 0 non-gated; h = a u, or
  // a non-gated; a the entry's activated value, nonzero on every active entry):
  // entry_grad: [M, tiles * (slots + 1)] quads, addressed like the TwELL words: word 1 + e of a tile-row
  //   within its slots holds entry e's quad; word 1 of an overflowing tile-row holds {b as uint32 bits,
  //   0, 0, 0}, b its row of backup_grad (kBackupMissing: backup_grad was full); other words are not
  //   written. entry_grad_floats() floats, 16-byte aligned.
  float* entry_grad = nullptr;
  // backup_grad: [grad_capacity, tile_n] quads ({+0, +0, +0, +0} where the column is inactive). A
  //   tile-row stored in forward backup row b takes grad row b; one the forward could not store claims a
  //   row from backup_capacity up. backup_grad_floats() floats, 16-byte aligned; may be null where
  //   grad_capacity is 0.
  float* backup_grad = nullptr;
  // One device uint32, zeroed on the stream before the launch: how many tile-rows without a forward
  // backup row claimed a grad row (it counts past the room, grad_capacity - backup_capacity). Where it
  // ends above the room, some entries' quads were not stored (dx is right regardless): grow
  // backup_grad to backup_capacity + the count and run again (train_weight_grad needs every quad).
  uint32_t* grad_overflow_count = nullptr;
  // Optional: one device fp32 w, 4-byte aligned, that multiplies the L1 coefficient (lambda / l1_tokens
  // becomes fp32(lambda / l1_tokens) * w). Autograd passes the L1 term's upstream gradient here, so that
  // no host synchronization reads it. nullptr: w = 1.
  const float* l1_weight = nullptr;
  // Optional (gated specs): the forward's u = x_t . Wu_j per entry, fp32 [M, tiles * (slots + 1)], 4-byte
  // aligned: element o of row t is the row's o-th entry's (entries in order, overflowing tile-rows' active
  // columns included; o below tiles * (slots + 1)), as the warp-per-row row consumer writes it
  // (GatedDownParams::entry_u; FfnTrainingPlan keeps it in its state). The warp-per-row form's entries pass
  // then reads Wd^T rows only for entries of tile-rows within their slots: the same arithmetic, the same
  // bits. The CTA form, overflowing tile-rows and tile-rows with an entry at or past ordinal tiles * (slots
  // + 1) recompute u. nullptr: u recomputed everywhere.
  const float* entry_u = nullptr;
  int64_t ld_x = 0, ld_gate = 0, ld_up = 0, ld_down = 0, ld_dy = 0, ld_dx = 0;
};

// Sizes of the per-entry outputs, in floats (4 per quad).
inline int64_t entry_grad_floats(const TwellLayout& layout, int64_t d_ff, int64_t tokens) {
  return tokens * layout.words_per_row(d_ff) * 4;
}
inline int64_t backup_grad_floats(const TwellLayout& layout, uint32_t grad_capacity) {
  return int64_t{grad_capacity} * layout.tile_n * 4;
}

// The backward by token row (above) of `tokens` rows (0 <= tokens < 2^31), stream-ordered, no host
// synchronization. The kernel (KernelKind::TrainRowBackward: for ReLU after a tensor-core gate with
// d_model % 8 == 0 and <= 2048, tile_n <= 512 and slots < 512, persistent warps taking a row each,
// launched twice: the entries' quads, then dx a 1024-column slice at a time, two entries' weight rows in
// flight; else one CTA of 256 threads per row; both give the same bits) comes from the context's bundles
// or JIT and cache like a plan's. `spec` is the layer's (canonical_spec'ed): its
// tile_n and slots (the generator's 256 and 31 where unset) must be those of the TwELL matrix, i.e.
// FfnPlan::layout()'s, and the forward's gate kernel the one generateFfn makes for it (a plan's), since
// overflowing tile-rows without a backup row are recomputed with its arithmetic. spec.down_layout must
// be in_out (w_down above). lambda: the L1 coefficient (finite, >= 0); the L1 term uses lambda /
// l1_tokens, l1_tokens 0 meaning `tokens` (the forward's M; pass the whole batch's M when a batch is
// split into several calls). backup_capacity: the forward's (its backup's rows); grad_capacity >= it.
// Alignment: with d_model % 8 == 0 the 16-bit operands' pointers and row strides must be multiples of
// 8 elements (16-byte loads), else of 2 bytes; the TwELL words and the counter 4 bytes; entry_grad and
// backup_grad 16 bytes.
// Throws Error(InvalidArgument) naming the argument (the spec field, a null, misaligned or non-device
// pointer, a short stride, a token count or capacity out of range, dx overlapping x or dy, a lambda
// that is negative or not finite), Error(NoDevice) without a GPU, Error(NotFound) with no bundle
// holding the kernel and no JIT, Error(Compile), Error(Cuda).
void train_row_backward(Context& context, Stream stream, const FfnSpec& spec, const TrainRowBackwardTensors& t,
                        int64_t tokens, uint32_t backup_capacity, uint32_t grad_capacity, float lambda,
                        int64_t l1_tokens = 0);

// Device pointers of one weight-gradient call (M = tokens, K = d_model, N = d_ff; row strides in
// elements of the tensor's type, 0 = dense):
struct TrainWeightGradTensors {
  const void* x = nullptr;   // [M, K] spec.dtype, the forward's input
  const void* dy = nullptr;  // [M, K] spec.dtype, dL/dy
  // The forward's TwELL words [M, tiles * (slots + 1)] and the quads train_row_backward wrote for them
  // (entry_grad, backup_grad: TrainRowBackwardTensors), unchanged since; not modified.
  const uint32_t* twell = nullptr;
  const float* entry_grad = nullptr;
  const float* backup_grad = nullptr;  // may be null where grad_capacity is 0
  // Outputs, [N, K] row-major, fp32 (or spec.dtype where output_dtype), every element written:
  void* dw_gate = nullptr;  // dL/dWg (nn.Linear layout, as Wg)
  void* dw_up = nullptr;    // dL/dWu; nullptr (and ld_dw_up 0) for a non-gated spec
  void* dw_down = nullptr;  // dL/dWd in the in_out layout: row j is dWd^T_j = sum_t h_tj dy_t
  // false: fp32 outputs; true: spec.dtype outputs, each rounded once from the fp32 sum.
  bool output_dtype = false;
  // Scratch, any contents, written by the call; one call at a time per buffer (stream order):
  // workspace: train_weight_grad_workspace_bytes(spec) bytes, 16-byte aligned (the grid barrier and tile
  //   flags, which the call clears on the stream first, each neuron's start in the list, per-SM counts);
  void* workspace = nullptr;
  // entry_list: train_weight_grad_list_bytes(spec, tokens, grad_capacity) bytes, 8-byte aligned: the
  //   entries sorted by neuron, 8 bytes each, room for one per TwELL word and backup_grad quad (so it
  //   never overflows, at any density).
  void* entry_list = nullptr;
  int64_t ld_x = 0, ld_dy = 0, ld_dw_gate = 0, ld_dw_up = 0, ld_dw_down = 0;
};

// The weight gradients (above) of `tokens` rows (0 <= tokens < 2^31, and fewer than 2^32 list entries;
// 0 writes zeros), stream-ordered, no host synchronization. Run it after train_row_backward on the same
// stream with the same spec, tokens and TwELL matrix; grad_capacity is the one train_row_backward had.
// The kernel (KernelKind::TrainWeightGrad, train/weight_grad.cuh) is one persistent CTA of 512 threads
// per SM, launched cooperatively: it sorts the entries by neuron (a stable counting sort into
// entry_list), then one warp per (neuron, 256 columns) sums that neuron's tokens' x and dy rows.
// `spec` as for train_row_backward (tile_n and slots the TwELL matrix's); its activation and threshold
// do not matter, and any down_layout is taken (dWd is in_out regardless). d_ff is bounded by the
// kernel's shared memory (a counter per neuron: 53952 at tile_n 256 on sm_90).
// If train_row_backward's grad_overflow_count ended above its room (grad_capacity - backup_capacity),
// some quads were not stored: the outputs of every neuron whose tile met such a tile-row are NaN (never
// silently wrong); grow backup_grad and run both again.
// Alignment: with d_model % 8 == 0, x and dy 16 bytes and their strides multiples of 8 elements (16-byte
// loads), else 2 bytes and any stride; the TwELL words 4 bytes, entry_grad and backup_grad 16 bytes,
// the outputs 4 bytes (fp32) or 2 (output_dtype), workspace 16, entry_list 8. The outputs, workspace
// and entry_list must not overlap each other or any input.
// Throws Error(InvalidArgument) naming the argument (the spec field, a null, misaligned or non-device
// pointer, a short stride, a token count out of range, overlapping buffers), Error(NoDevice) without a
// GPU, Error(NotFound) with no bundle holding the kernel and no JIT, Error(Compile), Error(Cuda).
void train_weight_grad(Context& context, Stream stream, const FfnSpec& spec, const TrainWeightGradTensors& t,
                       int64_t tokens, uint32_t grad_capacity);

// The scratch sizes of train_weight_grad, in bytes: the workspace (from d_ff and tile_n: 1 KiB per neuron
// plus a little; 5.8 MB at d_ff 5632) and the entry list (8 bytes per TwELL word of `tokens` rows and per
// backup_grad quad: (tokens * words_per_row + grad_capacity * tile_n) * 8).
int64_t train_weight_grad_workspace_bytes(const FfnSpec& spec);
int64_t train_weight_grad_list_bytes(const FfnSpec& spec, int64_t tokens, uint32_t grad_capacity);

}  // namespace twell
