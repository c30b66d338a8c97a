// What a user asks for: the shape and numerics of one FFN layer and the TwELL layout of its hidden
// activation. Plain value types of the contract layer (kernels/), shared by the runtime API and the
// generator (compiler/).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace twell {

// Element type of activations, weights and TwELL values. Both are 16-bit; kernels accumulate in fp32.
enum class DType : uint8_t { BF16, FP16 };

// The gate activation and its sparsity predicate (TWELL_FORMAT.md, requirement 3):
//   ReLU: a = relu(g),  active iff a > threshold   (threshold >= 0; the paper's recipe uses 0)
//   SiLU: a = silu(g),  active iff |a| > threshold (threshold > 0; CATS/TEAL-style magnitude pruning)
// g is the gate pre-activation rounded to the dtype, as a dense framework computes it. NaN is always
// active, so a NaN in x propagates to y exactly as in the dense computation.
enum class Activation : uint8_t { ReLU, SiLU };

// Weight layouts. OutIn is PyTorch's nn.Linear layout ([out_features, in_features], row-major) and the
// default for every weight; InOut ([in_features, out_features]) must be declared explicitly.
enum class WeightLayout : uint8_t { OutIn, InOut };

// TwELL layout of the hidden activation H [M, d_ff] (README.md, "The TwELL format"):
// d_ff is cut into ceil(d_ff / tile_n) tiles; each (row, tile) owns slots + 1 uint32 words: word 0 the
// nnz of the tile-row, words 1..nnz the entries (value bits << 16 | column inside the tile) in
// ascending column order. A tile-row with nnz > slots overflows: word 1 then holds its index in the
// dense backup area (or 0xFFFFFFFF when the backup was full and consumers recompute the tile-row).
struct TwellLayout {
  int tile_n = 256;   // columns per tile = the N extent of the gate GEMM's CTA tile; power of 2, 32..1024
  int slots = 31;     // entries per tile-row (31 = the paper's compression factor 8 at tile_n 256)
  DType value = DType::BF16;
  int index_bits = 16;  // column-in-tile index width; value bits + index bits = 32 (one word per entry)
  Activation activation = Activation::ReLU;
  float threshold = 0.0f;

  int64_t tiles(int64_t d_ff) const { return (d_ff + tile_n - 1) / tile_n; }
  int64_t words_per_row(int64_t d_ff) const { return tiles(d_ff) * (slots + 1); }
};

// The gated consumer kernel (the up + down projection over TwELL), README.md "Kernels":
//   RowGather:  one token row per warp (or per CTA): reads the Wu and Wd^T rows of each active entry.
//               Best at very high sparsity, where rows share few active neurons.
//   TokenBlock: 16 token rows per CTA on tensor cores: gathers the union of their active neurons'
//               Wu and Wd^T rows once and multiplies with mma.sync. Best where rows share neurons
//               (real layers, 2-10% density). Needs an in_out Wd (a plan's consumer always has one: it
//               transposes an out_in Wd first), d_model 128, 256, 512, 1024 or 2048 and tile_n <= 256;
//               elsewhere the generator falls back to RowGather (twellc emit says so). Gated layers
//               only (a non-gated spec asking for it is an InvalidArgument error).
enum class ConsumerVariant : uint8_t { RowGather, TokenBlock };

// One FFN layer: y = (act(x Wg^T) ⊙ (x Wu^T)) Wd^T for gated layers, y = act(x Wg^T) Wd^T for
// non-gated ones (the first linear layer plays the gate: its activations are what TwELL packs).
// x: [tokens, d_model]; Wg, Wu: [d_ff, d_model] (OutIn); Wd: [d_model, d_ff] (OutIn) or
// [d_ff, d_model] (InOut); y: [tokens, d_model]. All row-major, dtype `dtype`.
struct FfnSpec {
  int64_t d_model = 0;
  int64_t d_ff = 0;
  bool gated = true;  // false: no up projection (FfnTensors::w_up must be null)
  Activation activation = Activation::ReLU;
  float threshold = 0.0f;  // finite, at most max_finite(dtype); -0.0 is taken as 0.0 (the same kernels)
  DType dtype = DType::BF16;
  WeightLayout down_layout = WeightLayout::OutIn;
  std::optional<int> tile_n;  // unset: the generator chooses (256)
  std::optional<int> slots;   // unset: the generator chooses (31)
  // Unset: generateFfn emits RowGather; a plan with Dispatch::Auto times both variants per token
  // bucket and keeps the faster (FfnPlan::run), one with Dispatch::Sparse runs RowGather (so that
  // two such plans give the same bits: the variants round h differently).
  std::optional<ConsumerVariant> consumer;
  // The wgmma gate kernel's (sm_90a) thread-block cluster: 1 or 2 CTAs of neighbouring token blocks
  // sharing each w_gate tile through TMA multicast (#twell.config cluster_m). Unset: the generator
  // chooses (2 on sm_90a). Other main loops run no clusters and ignore it.
  std::optional<int> gate_cluster_m;
};

// The GPU feature set kernels are generated for. sm_90a enables the Hopper-only features (wgmma, TMA,
// clusters); any other arch gets the portable set. The arch string is part of a kernel's identity
// (BUILD_NOTES.md: ptxas for sm_90 rejects sm_90a PTX).
struct Target {
  int sm = 90;                 // compute capability major*10 + minor
  bool arch_specific = true;   // the "a" suffix (sm_90a)
  std::string arch() const { return "sm_" + std::to_string(sm) + (arch_specific ? "a" : ""); }
};

// The largest finite value of a dtype: f16 65504 (2^15 x (2 - 2^-10)), bf16 about 3.3895e38
// (2^127 x (2 - 2^-7)). The gate's output is rounded to the dtype, so a threshold above it keeps nothing.
constexpr float max_finite(DType t) { return t == DType::FP16 ? 65504.0f : 0x1.FEp+127f; }

constexpr const char* to_string(DType t) { return t == DType::BF16 ? "bf16" : "f16"; }
constexpr const char* to_string(Activation a) { return a == Activation::ReLU ? "relu" : "silu"; }
constexpr const char* to_string(WeightLayout l) { return l == WeightLayout::OutIn ? "out_in" : "in_out"; }
constexpr const char* to_string(ConsumerVariant c) { return c == ConsumerVariant::RowGather ? "row_gather" : "token_block"; }

}  // namespace twell
