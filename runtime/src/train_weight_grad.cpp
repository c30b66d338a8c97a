// train_weight_grad (twell/training.h): its argument checks, the kernel from the context (bundles, else
// the JIT through the cache), and the launch.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "context_impl.h"
#include "driver.h"
#include "launcher.h"
#include "run_arguments.h"  // pointer_problem, is_device_memory
#include "twell/device/params.h"
#include "twell/error.h"
#include "twell/kernels/validate.h"  // canonical_spec, validate_spec
#include "twell/reference.h"         // layout_for
#include "twell/training.h"
#include "training_impl.h"

namespace twell {

namespace detail {
void train_weight_grad(const std::shared_ptr<Context::Impl>& ctx, Stream stream, const FfnSpec& user_spec,
                       const TrainWeightGradTensors& t, int64_t tokens, uint32_t grad_capacity) {
  constexpr const char* who = "train_weight_grad";
  auto bad = [&](const std::string& m) { throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", who, m)); };
  const FfnSpec spec = kernels::canonical_spec(user_spec);
  if (std::string e = kernels::validate_spec(spec, "spec."); !e.empty()) bad(e);
  using T = kernels::TrainWeightGradConstraints;
  if (spec.d_model < 1 || spec.d_model > T::kMaxDModel)
    bad(fmt::format("spec.d_model: expected 1..{}, got {}", T::kMaxDModel, spec.d_model));
  if (spec.d_ff < 1 || spec.d_ff > (int64_t{1} << 24))
    bad(fmt::format("spec.d_ff: expected 1..16777216, got {}", spec.d_ff));
  if (tokens < 0 || tokens > INT32_MAX) bad(fmt::format("tokens: expected 0..2^31 - 1, got {}", tokens));
  const int64_t K = spec.d_model, N = spec.d_ff;
  const TwellLayout layout = layout_for(spec);
  const int64_t list_entries = T::listEntries(tokens, layout.words_per_row(N), grad_capacity, layout.tile_n);
  if (list_entries >= (int64_t{1} << 32)) {
    // Name what must change: grad_capacity where its rows alone reach 2^32 entries, else tokens.
    const bool rows_alone = int64_t{grad_capacity} * layout.tile_n >= (int64_t{1} << 32);
    bad(fmt::format(
        "{}: the entry list would hold {} entries (tokens {} * words per row {} + grad_capacity {} * "
        "tile_n {}); expected fewer than 2^32: {}",
        rows_alone ? "grad_capacity" : "tokens", list_entries, tokens, layout.words_per_row(N), grad_capacity,
        layout.tile_n, rows_alone ? "at most 2^32 / tile_n - 1 grad rows" : "split the call's rows"));
  }
  for (const auto& [name, ld] :
       {std::pair{"t.ld_x", t.ld_x}, std::pair{"t.ld_dy", t.ld_dy}, std::pair{"t.ld_dw_gate", t.ld_dw_gate},
        std::pair{"t.ld_dw_up", t.ld_dw_up}, std::pair{"t.ld_dw_down", t.ld_dw_down}})
    if (ld != 0 && (ld < K || ld > (int64_t{1} << 36)))
      bad(fmt::format("{}: expected a row stride in {}..2^36 elements (0 = dense), got {}", name, K, ld));
  const int out_bytes = t.output_dtype ? 2 : 4;
  auto need = [&](const char* name, const void* p, int bytes) {
    if (std::string problem = pointer_problem(name, p, bytes); !problem.empty()) bad(problem);
  };
  need("t.x", t.x, 2);
  need("t.dy", t.dy, 2);
  need("t.twell", t.twell, 4);
  need("t.entry_grad", t.entry_grad, 16);
  if (grad_capacity > 0) need("t.backup_grad", t.backup_grad, 16);
  need("t.dw_gate", t.dw_gate, out_bytes);
  if (spec.gated)
    need("t.dw_up", t.dw_up, out_bytes);
  else if (t.dw_up != nullptr || t.ld_dw_up != 0)
    bad(fmt::format("t.dw_up: a non-gated spec has no up weight; expected nullptr and ld_dw_up 0, got {} and {}",
                    t.dw_up, t.ld_dw_up));
  need("t.dw_down", t.dw_down, out_bytes);
  need("t.workspace", t.workspace, 16);
  if (list_entries > 0) need("t.entry_list", t.entry_list, 8);  // 0 bytes: cudaMalloc may give null
  const int64_t ldx = t.ld_x ? t.ld_x : K, lddy = t.ld_dy ? t.ld_dy : K;
  const int64_t ldg = t.ld_dw_gate ? t.ld_dw_gate : K, ldu = t.ld_dw_up ? t.ld_dw_up : K,
                ldd = t.ld_dw_down ? t.ld_dw_down : K;
  const int align = static_cast<int>(T::operandAlignment(K));  // the kernel's contract (validate.h)
  const std::string why = fmt::format("the kernel loads {}-element chunks at d_model {}", align, K);
  for (const auto& [name, p, ld_name, ld] :
       {std::tuple{"t.x", t.x, "t.ld_x", ldx}, std::tuple{"t.dy", t.dy, "t.ld_dy", lddy}}) {
    if (std::string problem = operand_alignment_problem(name, p, ld_name, ld, align, why); !problem.empty()) bad(problem);
  }

  // The byte range of every buffer the kernel touches (run_arguments.h: empty where it touches none, x
  // and dy without tokens, a null dw_up; saturating).
  const auto matrix = [&](const char* name, const void* p, int64_t rows, int64_t ld, int element_bytes) {
    return matrix_range(name, p, rows, ld, K, element_bytes);
  };
  const int64_t workspace_bytes = train_weight_grad_workspace_bytes(spec), list_bytes = list_entries * 8;
  const ByteRange inputs[] = {matrix("t.x", t.x, tokens, ldx, 2), matrix("t.dy", t.dy, tokens, lddy, 2),
                          bytes_range("t.twell", t.twell, tokens * layout.words_per_row(N) * 4),
                          bytes_range("t.entry_grad", t.entry_grad, entry_grad_floats(layout, N, tokens) * 4),
                          bytes_range("t.backup_grad", t.backup_grad, backup_grad_floats(layout, grad_capacity) * 4)};
  // Written by the kernel: none may overlap an input or another of them.
  const ByteRange written[] = {
      matrix("t.dw_gate", t.dw_gate, N, ldg, out_bytes), matrix("t.dw_up", t.dw_up, N, ldu, out_bytes),
      matrix("t.dw_down", t.dw_down, N, ldd, out_bytes), bytes_range("t.workspace", t.workspace, workspace_bytes),
      bytes_range("t.entry_list", t.entry_list, list_bytes)};
  const auto check_apart = [&](const ByteRange& w, const ByteRange& other) {
    if (std::string problem = overlap_problem(w, other); !problem.empty()) bad(problem);
  };
  for (size_t i = 0; i < std::size(written); ++i) {
    for (size_t o = 0; o < i; ++o) check_apart(written[i], written[o]);
    for (const ByteRange& input : inputs) check_apart(written[i], input);
  }

  if (!ctx->gpu) throw Error(ErrorCode::NoDevice, fmt::format("{}: needs a GPU ({})", who, ctx->no_gpu_reason));
  ctx->make_current();
  for (const auto& [name, p] :
       {std::pair{"t.x", t.x}, std::pair{"t.dy", t.dy}, std::pair{"t.twell", static_cast<const void*>(t.twell)},
        std::pair{"t.entry_grad", static_cast<const void*>(t.entry_grad)},
        std::pair{"t.backup_grad", static_cast<const void*>(t.backup_grad)},
        std::pair{"t.dw_gate", static_cast<const void*>(t.dw_gate)},
        std::pair{"t.dw_up", static_cast<const void*>(t.dw_up)},
        std::pair{"t.dw_down", static_cast<const void*>(t.dw_down)},
        std::pair{"t.workspace", static_cast<const void*>(t.workspace)},
        std::pair{"t.entry_list", static_cast<const void*>(t.entry_list)}}) {
    if (p != nullptr && !is_device_memory(p))
      bad(fmt::format("{}: expected device memory (cuMemAlloc/cudaMalloc), got {}", name, p));
  }

  const std::shared_ptr<LoadedKernel> kernel = ctx->auxiliary(kernels::KernelKind::TrainWeightGrad, spec, who);
  device::TrainWeightGradParams p{};
  p.x = static_cast<const uint16_t*>(t.x);
  p.dy = static_cast<const uint16_t*>(t.dy);
  p.twell = t.twell;
  p.entry_grad = t.entry_grad;
  p.backup_grad = t.backup_grad;
  p.dw_gate = t.dw_gate;
  p.dw_up = t.dw_up;
  p.dw_down = t.dw_down;
  p.m = tokens;
  p.ldx = ldx;
  p.lddy = lddy;
  p.ld_dw_gate = ldg;
  p.ld_dw_up = ldu;
  p.ld_dw_down = ldd;
  p.workspace = static_cast<uint32_t*>(t.workspace);
  p.entry_list = static_cast<uint32_t*>(t.entry_list);
  p.grad_capacity = grad_capacity;
  p.output_dtype = t.output_dtype ? 1u : 0u;
  auto cu = reinterpret_cast<CUstream>(stream);
  // The grid barrier's words and the tile flags start at zero (the rest is written before it is read).
  detail::check(detail::Driver::get().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(t.workspace), 0,
                                                       static_cast<size_t>(T::clearedWords(N, layout.tile_n)), cu),
                "train_weight_grad: cuMemsetD32Async(workspace)");
  void* args[1] = {&p};
  detail::launch(*kernel, kernels::LaunchShape{tokens, 0, 0}, args, cu, who);
}

}  // namespace detail

void train_weight_grad(Context& context, Stream stream, const FfnSpec& spec, const TrainWeightGradTensors& t,
                       int64_t tokens, uint32_t grad_capacity) {
  detail::train_weight_grad(context_impl(context), stream, spec, t, tokens, grad_capacity);
}

int64_t train_weight_grad_workspace_bytes(const FfnSpec& user_spec) {
  const FfnSpec spec = kernels::canonical_spec(user_spec);
  return kernels::TrainWeightGradConstraints::workspaceWords(spec.d_ff, layout_for(spec).tile_n) * 4;
}

int64_t train_weight_grad_list_bytes(const FfnSpec& user_spec, int64_t tokens, uint32_t grad_capacity) {
  const FfnSpec spec = kernels::canonical_spec(user_spec);
  const TwellLayout layout = layout_for(spec);
  return kernels::TrainWeightGradConstraints::listEntries(std::max<int64_t>(tokens, 0), layout.words_per_row(spec.d_ff),
                                                          grad_capacity, layout.tile_n) *
         8;
}

}  // namespace twell
