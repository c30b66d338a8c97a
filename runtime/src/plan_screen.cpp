// FfnPlan's gate screens (screen_gate, forget_gate_screens): the host builder is gate_screen.cpp, the
// launch that reads them plan_launch.cpp.
#include <fmt/format.h>

#include "driver.h"
#include "gate_screen.h"
#include "plan_impl.h"
#include "twell/error.h"
#include "twell/kernels/constraints.h"

namespace twell {

namespace {
using D = kernels::DecodeKernelConstraints;

// Why this plan cannot screen its gate ("" where it can).
std::string screen_problem(const FfnPlan::Impl& p) {
  if (p.spec.activation != Activation::ReLU)
    return "the spec's activation: expected ReLU (the screen bounds relu's zeros), got SiLU";
  if (p.spec.d_model % device::shared_memory::kDecodeScreenGroup != 0)
    return fmt::format("d_model: expected a multiple of {}, got {}", device::shared_memory::kDecodeScreenGroup, p.spec.d_model);
  if (!p.decode_fused || !p.decode_gate)
    return "the plan has no fused decode kernel: expected PlanOptions::decode_fused_max_tokens and decode_max_tokens above 0 "
           "and a shape whose fused kernel fits";
  if (p.context->gpu) {
    const int64_t ctas = D::fusedCtas(p.context->sm_count);
    const int64_t need = D::fusedLaunchBytes(p.spec.d_model, p.sparse_spec.d_ff, ctas, D::kScreenMaxTokens, true);
    if (need > D::fusedSharedBytes(p.context->target.sm))
      return fmt::format("the screened fused kernel's shared memory: expected at most {} bytes on this GPU, needs {}",
                         D::fusedSharedBytes(p.context->target.sm), need);
  }
  return "";
}
}  // namespace

size_t FfnPlan::gate_screen_bytes() const {
  const Impl& p = checked_plan(impl_, "gate_screen_bytes");
  if (!screen_problem(p).empty()) return 0;
  detail::GateScreen shape;
  shape.rows = p.sparse_spec.d_ff;
  shape.d_model = p.spec.d_model;
  return shape.device_bytes();
}

size_t FfnPlan::gate_screens() const { return checked_plan(impl_, "gate_screens").gate_screens.size(); }

void FfnPlan::forget_gate_screens() {
  Impl& p = checked_plan(impl_, "forget_gate_screens");
  p.gate_screens.clear();
  p.bucket_path.clear();
}

void FfnPlan::screen_gate(Stream stream, const void* w_gate, int64_t ld_gate) {
  constexpr const char* who = "FfnPlan::screen_gate";
  Impl& p = checked_plan(impl_, "screen_gate");
  if (!p.context->gpu)
    throw Error(ErrorCode::NoDevice, fmt::format("{}: this plan was made without a GPU ({})", who, p.context->no_gpu_reason));
  if (const std::string why = screen_problem(p); !why.empty())
    throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, why));
  const int64_t K = p.spec.d_model;
  const int64_t ld = ld_gate == 0 ? K : ld_gate;
  if (ld < K)
    throw Error(ErrorCode::InvalidArgument, fmt::format("{}: ld_gate: expected 0 or at least d_model ({}), got {}", who, K, ld_gate));
  if (const std::string why = pointer_problem("w_gate", w_gate, 2); !why.empty())
    throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, why));
  p.context->make_current();
  if (!is_device_memory(w_gate))
    throw Error(ErrorCode::InvalidArgument, fmt::format("{}: w_gate: expected device memory, got {}", who, w_gate));
  // The TwELL part's rows (PlanOptions::dense_neurons): the pointer run() launches with is the key.
  const auto* first = static_cast<const uint16_t*>(w_gate) + p.dense_neurons * ld;
  const int64_t rows = p.sparse_spec.d_ff;
  auto& d = detail::Driver::get();
  detail::check(d.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "FfnPlan::screen_gate: cuStreamSynchronize");
  std::vector<uint16_t> host(static_cast<size_t>((rows - 1) * ld + K));
  detail::check(d.cuMemcpyDtoH(host.data(), reinterpret_cast<CUdeviceptr>(first), host.size() * 2),
                "FfnPlan::screen_gate: cuMemcpyDtoH(w_gate)");
  const detail::GateScreen screen = detail::build_gate_screen(p.spec.dtype, host.data(), rows, K, ld);
  // The same pointer screened again is written in place (a CUDA graph captured with it stays valid and
  // reads the new screen; calls on a plan are ordered and `stream` is synchronized, so no kernel reads it
  // now). A failed copy drops the entry: no run reads a half-written screen.
  Impl::GateScreenBuffer& entry = p.gate_screens[first];
  try {
    if (!entry.buffer || entry.buffer->bytes() != screen.device_bytes())
      entry.buffer = std::make_unique<detail::DeviceBuffer>(screen.device_bytes());
    const CUdeviceptr base = entry.buffer->get();
    detail::check(d.cuMemcpyHtoD(base, screen.q.data(), screen.q.size()), "FfnPlan::screen_gate: cuMemcpyHtoD(q)");
    detail::check(d.cuMemcpyHtoD(base + screen.scale_offset(), screen.scale.data(), screen.scale.size() * 4),
                  "FfnPlan::screen_gate: cuMemcpyHtoD(scales)");
    detail::check(d.cuMemcpyHtoD(base + screen.coef_offset(), screen.coef.data(), screen.coef.size() * 4),
                  "FfnPlan::screen_gate: cuMemcpyHtoD(coefficients)");
    detail::check(d.cuMemcpyHtoD(base + screen.norm_offset(), screen.norm.data(), screen.norm.size() * 4),
                  "FfnPlan::screen_gate: cuMemcpyHtoD(norms)");
    entry.ld = ld;
    entry.scale_offset = screen.scale_offset();
    entry.coef_offset = screen.coef_offset();
    entry.norm_offset = screen.norm_offset();
  } catch (...) {
    p.gate_screens.erase(first);
    throw;
  }
  p.bucket_path.clear();  // Dispatch::Auto times the screened kernel anew
}

}  // namespace twell
