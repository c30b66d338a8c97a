// The gate screen of a Wg (FfnPlan::screen_gate; read by decode_fused: decode/gate_screen.cuh): built
// on the host, once per weight, so that a decode call streams half of Wg's bytes and still finds every
// active neuron (bench/README.md v74).
//
// Per row of Wg and k group of kDecodeScreenGroup (64) values: int8 values q in -127..127 (stored
// sign-magnitude: bit 7 the sign, bits 0-6 |q|; the kernel makes them 16-bit values exactly with a prmt,
// two lop3 and a packed fma: decode/gate_screen.cuh), a scale s
// (the group's largest |w| / 127) and a bound coefficient c. For any x, the exact gate of that row, as
// any twell kernel sums it in fp32, is at most
//     sum_groups s (x_g . q_g)  (as decode_fused sums it)  +  sum_groups ||x_g||_2 c_g,
// with c_g = ||w_g - s q_g||_2 + slack (||w_g||_2 + ||s q_g||_2) rounded up: Cauchy-Schwarz per group
// on the residual, and, for both float sums, at most `slack` relative to the sum of the products'
// magnitudes (each <= ||x_g|| times the norm; gate_screen_slack). A group holding a non-finite weight
// gets s = 0, q = 0 and c = +inf: every row it touches is a candidate (recomputed exactly).
#pragma once
#include <cstdint>
#include <vector>

#include "twell/spec.h"

namespace twell::detail {

struct GateScreen {
  int64_t rows = 0, d_model = 0;
  std::vector<uint8_t> q;      // [rows][d_model] q sign-magnitude
  std::vector<float> scale;    // [rows][d_model / 64]
  std::vector<float> coef;     // [rows][d_model / 64]
  // The device layout (params.h DecodeFusedBuffers): q, then scale, then coef, each 256-byte aligned.
  size_t scale_offset() const;
  size_t coef_offset() const;
  size_t device_bytes() const;
};

// The relative error bound of an fp32 sum of d_model exact products (plus a block's scaling and the k
// slices' sums) in any order, with round-to-nearest or truncation: 2 (d_model + 64) 2^-23.
double gate_screen_slack(int64_t d_model);

// The screen of `rows` rows of `dtype` weights (16-bit bits, row stride ld >= d_model elements);
// d_model a positive multiple of 64 (Error(InvalidArgument) otherwise).
GateScreen build_gate_screen(DType dtype, const uint16_t* w, int64_t rows, int64_t d_model, int64_t ld);

}  // namespace twell::detail
