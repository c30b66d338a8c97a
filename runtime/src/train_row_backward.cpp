// train_row_backward (twell/training.h): its argument checks, the kernel from the context (bundles, else
// the JIT through the cache), and the launch.
#include <fmt/format.h>

#include <cmath>
#include <initializer_list>
#include <tuple>

#include "context_impl.h"
#include "launcher.h"
#include "run_arguments.h"  // pointer_problem, is_device_memory, matrix_range, overlap_problem
#include "twell/device/params.h"
#include "twell/error.h"
#include "twell/kernels/validate.h"  // canonical_spec, validate_spec
#include "twell/training.h"
#include "training_impl.h"

namespace twell {

namespace detail {
void train_row_backward(const std::shared_ptr<Context::Impl>& ctx, Stream stream, const FfnSpec& user_spec,
                        const TrainRowBackwardTensors& t, int64_t tokens, uint32_t backup_capacity,
                        uint32_t grad_capacity, float lambda, int64_t l1_tokens) {
  constexpr const char* who = "train_row_backward";
  auto bad = [&](const std::string& m) { throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, m)); };
  const FfnSpec spec = kernels::canonical_spec(user_spec);
  if (std::string e = kernels::validate_spec(spec, "spec."); !e.empty()) bad(e);
  using T = kernels::TrainRowBackwardConstraints;
  if (spec.d_model < 1 || spec.d_model > T::kMaxDModel)
    bad(fmt::format("spec.d_model: expected 1..{} (the kernel keeps a row of dx in registers), got {}", T::kMaxDModel,
                    spec.d_model));
  if (spec.d_ff < 1 || spec.d_ff > (int64_t{1} << 24))
    bad(fmt::format("spec.d_ff: expected 1..16777216, got {}", spec.d_ff));
  if (spec.down_layout != WeightLayout::InOut)
    bad("spec.down_layout: expected in_out (w_down as the rows of Wd^T, [d_ff, d_model]; transpose an nn.Linear Wd "
        "first), got out_in");
  if (tokens < 0 || tokens > INT32_MAX)
    bad(fmt::format("tokens: expected 0..2^31 - 1 (a 32-bit row index), got {}", tokens));
  if (l1_tokens < 0) bad(fmt::format("l1_tokens: expected >= 0 (0: tokens), got {}", l1_tokens));
  if (!std::isfinite(lambda) || lambda < 0.0f) bad(fmt::format("lambda: expected a finite value >= 0, got {}", lambda));
  if (grad_capacity < backup_capacity)
    bad(fmt::format(
        "grad_capacity: expected at least backup_capacity ({}): a forward backup row b keeps grad row b, got {}",
        backup_capacity, grad_capacity));
  const int64_t K = spec.d_model;
  for (const auto& [name, ld, row] :
       {std::tuple{"t.ld_x", t.ld_x, K}, std::tuple{"t.ld_gate", t.ld_gate, K}, std::tuple{"t.ld_up", t.ld_up, K},
        std::tuple{"t.ld_down", t.ld_down, K}, std::tuple{"t.ld_dy", t.ld_dy, K}, std::tuple{"t.ld_dx", t.ld_dx, K}})
    if (ld != 0 && (ld < row || ld > (int64_t{1} << 36)))
      bad(fmt::format("{}: expected a row stride in {}..2^36 elements (0 = dense), got {}", name, row, ld));
  auto need = [&](const char* name, const void* p, int bytes) {
    if (std::string problem = pointer_problem(name, p, bytes); !problem.empty()) bad(problem);
  };
  need("t.x", t.x, 2);
  need("t.w_gate", t.w_gate, 2);
  if (spec.gated)
    need("t.w_up", t.w_up, 2);
  else if (t.w_up != nullptr || t.ld_up != 0)
    bad(fmt::format("t.w_up: a non-gated spec has no up weight; expected nullptr and ld_up 0, got {} and {}", t.w_up,
                    t.ld_up));
  need("t.w_down", t.w_down, 2);
  need("t.twell", t.twell, 4);
  if (backup_capacity > 0) need("t.backup", t.backup, 2);
  need("t.dy", t.dy, 2);
  need("t.dx", t.dx, 2);
  need("t.entry_grad", t.entry_grad, 16);
  if (grad_capacity > 0) need("t.backup_grad", t.backup_grad, 16);
  need("t.grad_overflow_count", t.grad_overflow_count, 4);
  if (!spec.gated && t.entry_u != nullptr)
    bad(fmt::format("t.entry_u: a non-gated spec has no u; expected nullptr, got {}", static_cast<const void*>(t.entry_u)));
  if (t.entry_u != nullptr) need("t.entry_u", t.entry_u, 4);
  if (t.l1_weight != nullptr && reinterpret_cast<uintptr_t>(t.l1_weight) % 4 != 0)
    bad(fmt::format("t.l1_weight: expected a 4-byte aligned device fp32 (or nullptr), got {}",
                    static_cast<const void*>(t.l1_weight)));
  const int64_t ldx = t.ld_x ? t.ld_x : K, lddy = t.ld_dy ? t.ld_dy : K, lddx = t.ld_dx ? t.ld_dx : K;
  // dx is written while x and dy are read (saturating byte ranges: strides up to 2^36 over 2^31 rows).
  const ByteRange dx_range = matrix_range("t.dx", t.dx, tokens, lddx, K, 2);
  for (const ByteRange& input : {matrix_range("t.x", t.x, tokens, ldx, K, 2), matrix_range("t.dy", t.dy, tokens, lddy, K, 2)})
    if (std::string problem = overlap_problem(dx_range, input); !problem.empty()) bad(problem);

  if (!ctx->gpu) throw Error(ErrorCode::NoDevice, fmt::format("{}: needs a GPU ({})", who, ctx->no_gpu_reason));
  ctx->make_current();
  auto device = [&](const char* name, const void* p) {
    if (p != nullptr && !is_device_memory(p))
      bad(fmt::format("{}: expected device memory (cuMemAlloc/cudaMalloc), got {}", name, p));
  };
  for (const auto& [name, p] :
       {std::pair{"t.x", t.x}, std::pair{"t.w_gate", t.w_gate}, std::pair{"t.w_up", t.w_up},
        std::pair{"t.w_down", t.w_down}, std::pair{"t.twell", static_cast<const void*>(t.twell)},
        std::pair{"t.backup", t.backup}, std::pair{"t.dy", t.dy}, std::pair{"t.dx", static_cast<const void*>(t.dx)},
        std::pair{"t.entry_grad", static_cast<const void*>(t.entry_grad)},
        std::pair{"t.backup_grad", static_cast<const void*>(t.backup_grad)},
        std::pair{"t.grad_overflow_count", static_cast<const void*>(t.grad_overflow_count)},
        std::pair{"t.l1_weight", static_cast<const void*>(t.l1_weight)},
        std::pair{"t.entry_u", static_cast<const void*>(t.entry_u)}})
    device(name, p);

  const std::shared_ptr<LoadedKernel> kernel = ctx->auxiliary(kernels::KernelKind::TrainRowBackward, spec, who);
  const int align = kernel->source.operand_alignment;
  const std::string why = fmt::format("the kernel loads {}-element chunks at d_model {}", align, K);
  for (const auto& [name, p, ld_name, ld] :
       {std::tuple{"t.x", t.x, "t.ld_x", ldx}, std::tuple{"t.w_gate", t.w_gate, "t.ld_gate", t.ld_gate ? t.ld_gate : K},
        std::tuple{"t.w_up", t.w_up, "t.ld_up", t.ld_up ? t.ld_up : K},
        std::tuple{"t.w_down", t.w_down, "t.ld_down", t.ld_down ? t.ld_down : K},
        std::tuple{"t.dy", t.dy, "t.ld_dy", lddy},
        std::tuple{"t.dx", static_cast<const void*>(t.dx), "t.ld_dx", lddx}}) {
    if (std::string problem = operand_alignment_problem(name, p, ld_name, ld, align, why); !problem.empty()) bad(problem);
  }

  auto cu = reinterpret_cast<CUstream>(stream);
  const detail::Driver& d = detail::Driver::get();
  detail::check(d.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(t.grad_overflow_count), 0, 1, cu),
                "train_row_backward: cuMemsetD32Async(grad_overflow_count)");
  if (tokens == 0) return;
  const int64_t m_l1 = l1_tokens > 0 ? l1_tokens : tokens;
  device::TrainRowBackwardParams p{};
  p.x = static_cast<const uint16_t*>(t.x);
  p.w_gate = static_cast<const uint16_t*>(t.w_gate);
  p.w_up = static_cast<const uint16_t*>(t.w_up);
  p.w_down = static_cast<const uint16_t*>(t.w_down);
  p.twell = t.twell;
  p.backup = static_cast<const uint16_t*>(t.backup);
  p.dy = static_cast<const uint16_t*>(t.dy);
  p.dx = static_cast<uint16_t*>(t.dx);
  p.entry_grad = t.entry_grad;
  p.backup_grad = t.backup_grad;
  p.grad_overflow_count = t.grad_overflow_count;
  p.m = tokens;
  p.ldx = ldx;
  p.ldwg = t.ld_gate ? t.ld_gate : K;
  p.ldwu = t.ld_up ? t.ld_up : K;
  p.ldwd = t.ld_down ? t.ld_down : K;
  p.lddy = lddy;
  p.lddx = lddx;
  p.backup_capacity = backup_capacity;
  p.grad_capacity = grad_capacity;
  // The reference's c = fp32(lambda / M), the division in double.
  p.l1_scale = static_cast<float>(static_cast<double>(lambda) / static_cast<double>(m_l1));
  p.apply_l1 = lambda != 0.0f ? 1u : 0u;
  p.l1_weight = t.l1_weight;
  p.entry_u = t.entry_u;
  void* args[1] = {&p};
  // The warp-per-row form runs as two stream-ordered passes (TrainRowPass), the CTA form as one.
  const bool two_passes = kernel->source.consumer == kernels::ConsumerKind::WarpRow;
  for (const uint32_t pass : {device::kTrainRowEntries, device::kTrainRowDx}) {
    p.pass = two_passes ? pass : device::kTrainRowAll;
    detail::launch(*kernel, kernels::LaunchShape{tokens, 0, 0}, args, cu, who);
    if (!two_passes) break;
  }
}

}  // namespace detail

void train_row_backward(Context& context, Stream stream, const FfnSpec& spec, const TrainRowBackwardTensors& t,
                        int64_t tokens, uint32_t backup_capacity, uint32_t grad_capacity, float lambda,
                        int64_t l1_tokens) {
  detail::train_row_backward(context_impl(context), stream, spec, t, tokens, backup_capacity, grad_capacity, lambda,
                             l1_tokens);
}

}  // namespace twell
