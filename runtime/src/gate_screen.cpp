// The gate screen's host builder (gate_screen.h).
#include "gate_screen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "twell/device/shared_memory.h"
#include "twell/error.h"
#include "twell/half.h"

namespace twell::detail {

namespace {
constexpr int64_t kGroup = device::shared_memory::kDecodeScreenGroup;
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
// The smallest float >= v (v >= 0, finite or +inf).
float float_at_least(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) < v) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}
}  // namespace

size_t GateScreen::scale_offset() const { return align256(static_cast<size_t>(rows * d_model)); }
size_t GateScreen::coef_offset() const { return scale_offset() + align256(static_cast<size_t>(rows * (d_model / kGroup)) * 4); }
size_t GateScreen::norm_offset() const { return coef_offset() + align256(static_cast<size_t>(rows * (d_model / kGroup)) * 4); }
size_t GateScreen::device_bytes() const { return norm_offset() + align256(static_cast<size_t>(rows * (d_model / kGroup)) * 4); }

double gate_screen_slack(int64_t d_model) { return 2.0 * static_cast<double>(d_model + kGroup) * std::ldexp(1.0, -23); }

GateScreen build_gate_screen(DType dtype, const uint16_t* w, int64_t rows, int64_t d_model, int64_t ld) {
  if (d_model <= 0 || d_model % kGroup != 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("gate screen: d_model: expected a positive multiple of {}, got {}", kGroup, d_model));
  if (ld < d_model)
    throw Error(ErrorCode::InvalidArgument, fmt::format("gate screen: ld_gate: expected at least d_model ({}), got {}", d_model, ld));
  const int64_t groups = d_model / kGroup;
  const double slack = gate_screen_slack(d_model);
  GateScreen s;
  s.rows = rows;
  s.d_model = d_model;
  s.q.assign(static_cast<size_t>(rows * d_model), 0);
  s.scale.assign(static_cast<size_t>(rows * groups), 0.0f);
  s.coef.assign(static_cast<size_t>(rows * groups), 0.0f);
  s.norm.assign(static_cast<size_t>(rows * groups), 0.0f);
  float v[kGroup];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t* src = w + r * ld + g * kGroup;
      bool finite = true;
      float amax = 0.0f;
      for (int64_t k = 0; k < kGroup; ++k) {
        v[k] = to_float(dtype, src[k]);
        finite = finite && std::isfinite(v[k]);
        amax = std::max(amax, std::fabs(v[k]));
      }
      const size_t gi = static_cast<size_t>(r * groups + g);
      if (!finite) {  // no bound: q 0, s 0, c and n +inf (every row it touches a candidate)
        s.coef[gi] = s.norm[gi] = std::numeric_limits<float>::infinity();
        continue;
      }
      const float scale = amax / 127.0f;  // 0 for an all-zero group (then q 0, the residual w itself)
      double r2 = 0.0, w2 = 0.0, sq2 = 0.0;
      for (int64_t k = 0; k < kGroup; ++k) {
        int q = 0;
        if (scale > 0.0f && std::isfinite(v[k] / scale)) q = static_cast<int>(std::clamp(std::nearbyint(v[k] / scale), -127.0f, 127.0f));
        s.q[static_cast<size_t>(r * d_model + g * kGroup + k)] = static_cast<int8_t>(q);
        const double sq = static_cast<double>(q) * scale;  // exact (24 + 8 bits)
        const double res = static_cast<double>(v[k]) - sq;
        r2 += res * res;
        w2 += static_cast<double>(v[k]) * v[k];
        sq2 += sq * sq;
      }
      s.scale[gi] = scale;
      // The double sums' own rounding (relative 2^-50 or so) is covered by the factor 1 + 2^-20.
      s.coef[gi] = float_at_least((std::sqrt(r2) + slack * (std::sqrt(w2) + std::sqrt(sq2))) * (1.0 + std::ldexp(1.0, -20)));
      s.norm[gi] = float_at_least((1.0 + slack) * std::sqrt(w2) * (1.0 + std::ldexp(1.0, -20)));
    }
  return s;
}

}  // namespace twell::detail
