// The gate screen of a Wg (FfnPlan::screen_gate; read by decode_fused: decode/gate_screen.cuh): built
// on the host, once per weight, so that a decode call streams half of Wg's bytes and still finds every
// active neuron (bench/README.md v74).
//
// Per row of Wg and k group of kDecodeScreenGroup (64) values: int8 values q in -127..127 (two's
// complement), a scale s (the group's largest |w| / 127), a bound coefficient c and a norm n. The kernel
// quantizes x the same way per token and group (x ~ sx px, px int8; decode_fused.cuh), multiplies px and
// q exactly with int8 tensor-core steps (mma.m16n8k32.s8) and scales each group's integer dot by sx s.
// For any x, the exact gate of that row, as any twell kernel sums it in fp32, is at most
//     sum_groups sx s (px_g . q_g)  (as decode_fused sums it)
//       + sum_groups ( ||x_g - sx px_g||_2 n_g + ||sx px_g||_2 c_g ),
// with c_g = ||w_g - s q_g||_2 + slack (||w_g||_2 + ||s q_g||_2) and n_g = (1 + slack) ||w_g||_2, both
// rounded up: x w - x~ w~ = (x - x~) w + x~ (w - w~), Cauchy-Schwarz per group on each term, and, for
// the float sums (the exact g's, and the screen's scaling and sum over groups), at most `slack` relative
// to the sum of the products' magnitudes, which is at most (||x~_g|| + ||x_g - x~_g||) ||w_g|| for the
// exact g and ||x~_g|| ||s q_g|| for the screen's (gate_screen_slack). A group holding a non-finite
// weight gets s = 0, q = 0 and c = n = +inf: every row it touches is a candidate (recomputed exactly).
#pragma once
#include <cstdint>
#include <vector>

#include "twell/spec.h"

namespace twell::detail {

struct GateScreen {
  int64_t rows = 0, d_model = 0;
  std::vector<int8_t> q;       // [rows][d_model]
  std::vector<float> scale;    // [rows][d_model / 64]
  std::vector<float> coef;     // [rows][d_model / 64]
  std::vector<float> norm;     // [rows][d_model / 64]
  // The device layout (params.h DecodeFusedBuffers): q, then scale, coef and norm, each 256-byte aligned.
  size_t scale_offset() const;
  size_t coef_offset() const;
  size_t norm_offset() const;
  size_t device_bytes() const;
};

// The relative error bound of an fp32 sum of d_model exact products (plus a block's scaling and the k
// slices' sums) in any order, with round-to-nearest or truncation: 2 (d_model + 64) 2^-23.
double gate_screen_slack(int64_t d_model);

// The screen of `rows` rows of `dtype` weights (16-bit bits, row stride ld >= d_model elements);
// d_model a positive multiple of 64 (Error(InvalidArgument) otherwise).
GateScreen build_gate_screen(DType dtype, const uint16_t* w, int64_t rows, int64_t d_model, int64_t ld);

}  // namespace twell::detail
