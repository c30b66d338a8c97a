// CPU reference of the FFN layer's training forward and backward: the oracle every training kernel is
// tested against (../shared/design/TRAINING.md, "The gradients"; issue 15).
//
// Shapes (M = tokens, K = spec.d_model, N = spec.d_ff), all row-major and dense (row stride = row
// length); 16-bit tensors are raw bits of spec.dtype (bf16 or f16, twell/half.h):
//   x, dy        [M, K]
//   Wg, Wu       [N, K] (nn.Linear); Wu absent (empty) for a non-gated spec
//   Wd           [K, N] for WeightLayout::OutIn, [N, K] for InOut (spec.down_layout)
//   dWg, dWu     [N, K] fp32;  dWd fp32 in Wd's layout;  dx [M, K] fp32
//
// Forward (the inference reference's numerics, twell/reference.h, bit for bit):
//   g = round_dtype(x . Wg_j)  (fp32 fma accumulation, k ascending);  a = act(g) rounded to dtype;
//   active iff the spec's predicate holds on a (twell/format.h is_active; NaN is active);
//   u = x . Wu_j in fp32 (not rounded);  h = a * u in fp32 for a gated spec, h = a otherwise;
//   y = sum_j h_j Wd(:, j) in fp32 (fma per term, j ascending, not rounded) = reference_gated_ffn's y;
//   l1 = sum_ij |h_ij| / M (the paper's L1 term without lambda), in double (see TrainingForward).
// Every quantity the backward needs lives on the support of a, so the forward keeps it there only (CSR
// by token); inactive entries have h = 0 and contribute nothing to y, to l1 or to any gradient.
//
// Backward, the loss being L(y) + lambda * l1 with dy = dL/dy (TRAINING.md), in fp32 per active (t, j):
//   dh = dot(dy_t, Wd(:, j))  (fma, i ascending from +0), then, when lambda != 0,
//   dh = dh + c * sign(h)     with c = fp32(lambda / M) (the division in double, rounded once) and
//                             sign(h) in {-1, 0, +1} (NaN for a NaN h, as torch.sign)
//   gated:     du = dh * a;  dg = (dh * u) * act'(g)
//   non-gated: dg = dh * act'(g)  (no up projection, no du)
//   act'(g): activation_derivative below, at the rounded g. The roundings of g and a to the dtype are
//   differentiated as the identity (as a framework's autograd treats the casts of a bf16 matmul).
// and the products, each output element one fp32 accumulator from +0 with one fma per term:
//   dx_t    = sum_j (du_tj Wu_j + dg_tj Wg_j): j ascending over the row's support, du's term before
//             dg's for each j (the K-concatenated product [du dg] [Wu; Wg])
//   dWu_j   = sum_t du_tj x_t;  dWg_j = sum_t dg_tj x_t;  dWd(:, j) = sum_t h_tj dy_t
//             (t ascending over the tokens that activate neuron j)
// A token with no active neuron gets dx = +0 and adds nothing (not even a rounding) to the weight
// gradients; a neuron active on no token gets +0 rows of dWg, dWu and a +0 column of dWd.
//
// Work is spread over std::thread::hardware_concurrency() threads (rows, then neurons), each output
// element computed by one thread in the order above, so results are bit-identical from call to call
// and independent of the thread count. The functions keep no state: concurrent calls are safe.
//
// Errors: Error(InvalidArgument) naming the argument with the expected and given sizes (or values):
// d_model or d_ff < 1, d_ff > 2^31 - 1, tokens outside [0, 2^40], an illegal threshold (validate_layout),
// x, w_gate, w_up, w_down or dy of the wrong size, a non-finite or negative lambda, a `forward` whose
// arrays disagree with each other, with x or with d_ff.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "twell/reference.h"
#include "twell/spec.h"

namespace twell {

// What the training forward computes and the backward reads. The support of a in CSR by token: the
// active entries of token t are [row_start[t], row_start[t + 1]), neurons strictly ascending. Entry
// arrays have nnz = row_start[tokens] elements.
struct TrainingForward {
  int64_t tokens = 0;
  std::vector<float> y;            // [tokens, d_model], fp32 unrounded
  double l1 = 0.0;                 // sum |h| / tokens (0 for no tokens): |h| summed in double over each
                                   // token's neurons ascending, those sums over tokens ascending
  std::vector<int64_t> row_start;  // [tokens + 1]
  std::vector<int32_t> neuron;     // [nnz] column j of the entry
  std::vector<uint16_t> gate;      // [nnz] g bits (rounded to spec.dtype)
  std::vector<uint16_t> act;       // [nnz] a bits = act(g) rounded (active by the spec's predicate)
  std::vector<float> up;           // [nnz] u = x . Wu_j in fp32; empty for a non-gated spec
  std::vector<float> hidden;       // [nnz] h in fp32
};

struct TrainingGradients {
  std::vector<float> dx;       // [tokens, d_model]
  std::vector<float> dw_gate;  // [d_ff, d_model]
  std::vector<float> dw_up;    // [d_ff, d_model]; empty for a non-gated spec
  std::vector<float> dw_down;  // [d_model, d_ff] (OutIn) or [d_ff, d_model] (InOut), as spec.down_layout
  // dL/dg and dL/du of every active entry, in the forward's entry order (TrainingForward, CSR by token):
  // what the GPU's backward by token row (twell/training.h) stores per TwELL entry.
  std::vector<float> dg;  // [nnz]
  std::vector<float> du;  // [nnz]; empty for a non-gated spec
};

// The derivative of the thresholded activation with respect to g where the entry is active, in fp32
// (spec.h's Activation; the threshold only decides where it applies):
//   ReLU: a = g on the active set g > threshold, so act'(g) = 1 there (the paper's relu'(g) = 1 where
//         a > 0). At g = threshold the thresholded function jumps from 0 to threshold (a kink when the
//         threshold is 0): no derivative; its Dirac part is dropped, as autograd does for g * (g > t)
//         (the mask is piecewise constant, so it carries no gradient).
//   SiLU: a = silu(g) = g s(g) with s the logistic function, on the active set |silu(g)| > threshold,
//         so act'(g) = silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)), evaluated as
//         s = 1 / (1 + exp(-g)), s * (1 + g * (1 - s)). The jumps at |silu(g)| = threshold are dropped
//         as for ReLU.
// NaN g gives 1 for ReLU (NaN is active and the identity passes it on) and NaN for SiLU.
float activation_derivative(Activation activation, float g);

// The training forward of one layer on `tokens` rows of x.
TrainingForward reference_training_forward(const FfnSpec& spec, std::span<const uint16_t> x, int64_t tokens,
                                           const HostFfnWeights& w);

// The backward of the layer for the upstream gradient dy and the L1 coefficient lambda (>= 0, finite;
// the loss's term is lambda * forward.l1). `forward` must be reference_training_forward's result for
// the same spec, x and w (only its internal consistency and its agreement with x's size are checked).
TrainingGradients reference_training_backward(const FfnSpec& spec, std::span<const uint16_t> x, const HostFfnWeights& w,
                                              const TrainingForward& forward, std::span<const uint16_t> dy,
                                              float lambda);

}  // namespace twell
