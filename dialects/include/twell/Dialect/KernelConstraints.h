// What the issue-2 device kernels (runtime/device/twell/device/gate_twell.cuh, gated_down.cuh) accept,
// shared by the op verifiers and twell-select-config so that a configuration the templates would reject
// at NVRTC time (static_assert) is a verifier error instead.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mlir::twell {

// Gate GEMM with the TwELL epilogue: a CTA computes cta_m x tile_n = 16384 outputs, 64 fp32 accumulators
// on each of 256 threads laid out 16 x 16, and stages its operands (fp32, cta_k deep) and then the
// activated tile (16-bit) in one static shared-memory buffer of at most 48 KiB.
struct GateKernelConstraints {
  static constexpr int64_t kTileElements = 16384;
  static constexpr int64_t kThreads = 256;
  static constexpr int64_t kMaxStaticSharedBytes = 48 * 1024;

  static constexpr int64_t staticSharedBytes(int64_t ctaM, int64_t ctaK, int64_t tileN) {
    return std::max(ctaK * (ctaM + tileN) * 4, ctaM * tileN * 2);
  }
};

// Gated consumer: one token row per CTA.
struct GatedDownKernelConstraints {
  static constexpr int64_t kCtaM = 1;
};

}  // namespace mlir::twell
