// CPU reference of the gated TwELL FFN: the oracle of every test (TWELL_FORMAT.md, requirement 5).
//
// Numerics (the same as the kernels' and as a dense framework's, spec.h): fp32 accumulation;
//   g = round_dtype(x . Wg_j);  a = act(g) rounded to dtype;  active iff the predicate holds;
//   h_j = a_j * (x . Wu_j) in fp32 (not rounded);  y = round_dtype(sum_j h_j Wd(:, j)).
// Tensors are raw 16-bit bits of spec.dtype, row-major, dense (row stride = row length); weights in
// the layouts of spec (Wg, Wu: [d_ff, d_model]; Wd: [d_model, d_ff] for OutIn, [d_ff, d_model] InOut).
// Work is spread over std::thread::hardware_concurrency() threads; results do not depend on it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "twell/format.h"
#include "twell/spec.h"

namespace twell {

struct HostFfnWeights {
  std::span<const uint16_t> w_gate;  // [d_ff, d_model]
  std::span<const uint16_t> w_up;    // [d_ff, d_model]; empty for a non-gated spec
  std::span<const uint16_t> w_down;  // [d_model, d_ff] (OutIn) or [d_ff, d_model] (InOut)
};

// The layout the runtime uses for `spec` (defaults filled in: tile_n 256, slots 31).
TwellLayout layout_for(const FfnSpec& spec);

// Activated gate a [tokens, d_ff]: a = act(round(x Wg^T)), inactive entries +0.
std::vector<uint16_t> reference_gate(const FfnSpec& spec, std::span<const uint16_t> x, int64_t tokens,
                                     std::span<const uint16_t> w_gate);

// The consumer over a TwELL matrix (the CPU twin of the GatedDown kernel, overflow paths included: a
// kBackupMissing tile-row is recomputed from x and Wg): h_j = a_j (x . Wu_j) for a gated spec, a_j
// otherwise. Returns y in fp32 (unrounded).
std::vector<float> reference_gated_down(const FfnSpec& spec, std::span<const uint16_t> x,
                                        const TwellMatrix& h, const HostFfnWeights& w);

// The whole FFN (gated or not): reference_gate, pack_twell (with `backup_capacity`), reference_gated_down.
std::vector<float> reference_gated_ffn(const FfnSpec& spec, std::span<const uint16_t> x, int64_t tokens,
                                       const HostFfnWeights& w, uint32_t backup_capacity = UINT32_MAX);

// An independent oracle for the reference itself: the dense formula in float64 over all d_ff
// neurons (no TwELL, no sparsity shortcut), with the same roundings of g and a. Slow: O(tokens *
// d_model * d_ff) in double; tests call it on few rows (`rows` = which token rows to compute).
std::vector<double> naive_dense_ffn(const FfnSpec& spec, std::span<const uint16_t> x, const HostFfnWeights& w,
                                    std::span<const int64_t> rows);

// ||out - ref|| / ||ref|| over all elements. A NaN in `out` where `ref` is not NaN (or the reverse)
// makes the error +inf; positions where both are NaN are skipped. An all-zero ref with a nonzero out
// gives +inf. `out` and `ref` must have the same size (else Error(InvalidArgument)).
double relative_error(std::span<const float> out, std::span<const float> ref);
double relative_error(std::span<const float> out, std::span<const double> ref);

// y rounded to fp32 from 16-bit output bits.
std::vector<float> to_float(DType dtype, std::span<const uint16_t> bits);

}  // namespace twell
