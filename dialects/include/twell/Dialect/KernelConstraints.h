// What the issue-2 device kernels (runtime/device/twell/device/gate_twell.cuh, gated_down.cuh) accept,
// shared by the op verifiers and twell-select-config so that a configuration the templates would reject
// at NVRTC time (static_assert) is a verifier error instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>

namespace mlir::twell {

// Gate GEMM with the TwELL epilogue: a CTA computes cta_m x tile_n = 16384 outputs, 64 fp32 accumulators
// on each of 256 threads laid out 16 x 16, and stages its operands (fp32, cta_k deep) and then the
// activated tile (16-bit) in one static shared-memory buffer of at most 48 KiB.
struct GateKernelConstraints {
  static constexpr int64_t kTileElements = 16384;
  static constexpr int64_t kThreads = 256;
  static constexpr int64_t kMaxStaticSharedBytes = 48 * 1024;

  // max(cta_k * (cta_m + tile_n) * 4, cta_m * tile_n * 2), saturating at INT64_MAX instead of
  // overflowing (so that an absurd configuration reads as too large, never as small). Negative
  // arguments count as 0.
  static constexpr int64_t staticSharedBytes(int64_t ctaM, int64_t ctaK, int64_t tileN) {
    ctaM = std::max<int64_t>(ctaM, 0);
    ctaK = std::max<int64_t>(ctaK, 0);
    tileN = std::max<int64_t>(tileN, 0);
    return std::max(saturatingMul(saturatingMul(ctaK, saturatingAdd(ctaM, tileN)), 4),
                    saturatingMul(saturatingMul(ctaM, tileN), 2));
  }

  // cta_m * tile_n == kTileElements, without forming the product.
  static constexpr bool fillsTile(int64_t ctaM, int64_t tileN) {
    return tileN > 0 && kTileElements % tileN == 0 && ctaM == kTileElements / tileN;
  }

 private:
  // For a, b >= 0.
  static constexpr int64_t saturatingMul(int64_t a, int64_t b) {
    int64_t product = 0;
    return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<int64_t>::max() : product;
  }
  static constexpr int64_t saturatingAdd(int64_t a, int64_t b) {
    int64_t sum = 0;
    return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<int64_t>::max() : sum;
  }
};

// The ranges #twell.config accepts (ConfigAttr::verify), checked before any arithmetic on the fields.
// They are wide enough for any kernel configuration (a CTA has at most 1024 threads) and small enough
// that products of a few of them cannot overflow int64.
struct ConfigLimits {
  static constexpr int64_t kMaxCtaM = 4096;
  static constexpr int64_t kMaxCtaK = 1024;  // 0 = no K loop
  static constexpr int64_t kMinThreads = 32;
  static constexpr int64_t kMaxThreads = 1024;  // and a multiple of 32 (whole warps)
};

// The GPU architectures a #twell.target (and the generator's twell::Target) may name: those NVRTC 13.0
// builds for (nvrtcGetSupportedArchs, nvcc --list-gpu-arch: 75 80 86 87 88 89 90 100 103 110 120 121)
// at or above sm_80 (bf16 tensor cores), and, with the "a" suffix (arch-specific features), those that
// have an arch-specific variant (sm_90a and the Blackwell family). The one list of them: Generate.h's
// isSupportedTarget/supportedTargets read it too.
struct SupportedArchs {
  static constexpr int kComputeCapabilities[] = {80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
  static constexpr int kArchSpecific[] = {90, 100, 103, 110, 120, 121};

  static constexpr bool isSupported(int64_t computeCapability, bool archSpecific) {
    const int64_t cc = computeCapability;
    if (archSpecific) return std::find(std::begin(kArchSpecific), std::end(kArchSpecific), cc) != std::end(kArchSpecific);
    return std::find(std::begin(kComputeCapabilities), std::end(kComputeCapabilities), cc) !=
           std::end(kComputeCapabilities);
  }

  // "sm_80, sm_86, ..., sm_121, sm_90a, ..., sm_121a"
  static std::string list() {
    std::string text;
    for (int cc : kComputeCapabilities) text += (text.empty() ? "sm_" : ", sm_") + std::to_string(cc);
    for (int cc : kArchSpecific) text += ", sm_" + std::to_string(cc) + "a";
    return text;
  }
};

// Gated consumer: one token row per CTA.
struct GatedDownKernelConstraints {
  static constexpr int64_t kCtaM = 1;
};

}  // namespace mlir::twell
