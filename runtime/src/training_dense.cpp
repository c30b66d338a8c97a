// DenseTraining (training_dense.h): the dense training path's GEMMs and elementwise launches.
#include "training_dense.h"

#include <fmt/format.h>

#include <iterator>
#include <vector>

#include "launcher.h"
#include "run_arguments.h"
#include "twell/device/params.h"
#include "twell/error.h"

namespace twell::detail {

DenseTraining::DenseTraining(std::shared_ptr<Context::Impl> context, const FfnSpec& spec, std::vector<KernelReport>& reports,
                             const char* who)
    : context_(std::move(context)), spec_(spec) {
  for (const auto kind : {kernels::KernelKind::TrainDenseForward, kernels::KernelKind::TrainDenseBackward}) {
    KernelReport report;
    (kind == kernels::KernelKind::TrainDenseForward ? forward_kernel_ : backward_kernel_) =
        context_->auxiliary(kind, spec_, who, &report);
    reports.push_back(std::move(report));
  }
}

size_t DenseTraining::state_bytes(const FfnSpec& spec, int64_t tokens) {
  return size_t(std::max<int64_t>(tokens, 0)) * size_t(spec.d_ff) * 2 * (spec.gated ? 2 : 1);
}

LtGemms& DenseTraining::gemms() {
  if (!gemms_) gemms_ = std::make_unique<LtGemms>(spec_.dtype, /*tuned=*/false, "FfnTrainingPlan (dense path)");
  return *gemms_;
}

namespace {
int64_t or_default(int64_t ld, int64_t dense) { return ld != 0 ? ld : dense; }
void* at(const DeviceBuffer& b) { return reinterpret_cast<void*>(b.get()); }
}  // namespace

std::vector<LtGemm> DenseTraining::forward_gemms(const FfnTensors& t, int64_t tokens, DeviceBuffer& g, DeviceBuffer& u) const {
  const int64_t K = spec_.d_model, N = spec_.d_ff;
  const int64_t ld_x = or_default(t.ld_x, K);
  std::vector<LtGemm> out{{.a = t.x, .lda = ld_x, .b = t.w_gate, .ldb = or_default(t.ld_gate, K), .b_is_n_by_k = true, .c = at(g),
                           .ldc = N, .m = tokens, .n = N, .k = K}};
  if (spec_.gated)
    out.push_back({.a = t.x, .lda = ld_x, .b = t.w_up, .ldb = or_default(t.ld_up, K), .b_is_n_by_k = true, .c = at(u), .ldc = N,
                   .m = tokens, .n = N, .k = K});
  if (t.y != nullptr) {
    // y = h Wd^T: an out_in Wd [K, N] is B stored [n, k]; an in_out one [N, K] is [k, n].
    const bool out_in = spec_.down_layout == WeightLayout::OutIn;
    out.push_back({.a = at(scratch_), .lda = N, .b = t.w_down, .ldb = or_default(t.ld_down, out_in ? N : K), .b_is_n_by_k = out_in,
                   .c = t.y, .ldc = or_default(t.ld_y, K), .m = tokens, .n = K, .k = N});
  }
  return out;
}

void DenseTraining::prepare_forward(CUstream cu, const FfnTensors& t, int64_t tokens, DeviceBuffer& g, DeviceBuffer& u,
                                    bool with_outputs) {
  constexpr const char* who = "FfnTrainingPlan::forward (dense path)";
  const size_t rows_bytes = size_t(std::max<int64_t>(tokens, 0)) * size_t(spec_.d_ff) * 2;
  ensure_bytes(g, rows_bytes, cu, who);
  if (spec_.gated) ensure_bytes(u, rows_bytes, cu, who);
  if (with_outputs) ensure_bytes(scratch_, rows_bytes, cu, who);
  if (tokens == 0) return;
  for (const LtGemm& gemm : forward_gemms(t, tokens, g, u)) gemms().prepare(gemm);
}

void DenseTraining::forward(CUstream cu, const FfnTensors& t, int64_t tokens, DeviceBuffer& g, DeviceBuffer& u, float* row_l1,
                            bool accumulate) {
  constexpr const char* who = "FfnTrainingPlan::forward (dense path)";
  const bool outputs = t.y != nullptr || row_l1 != nullptr;  // else what a recomputing backward needs: g and u
  prepare_forward(cu, t, tokens, g, u, outputs);
  if (tokens == 0) return;
  const int64_t N = spec_.d_ff;
  const std::vector<LtGemm> gemm = forward_gemms(t, tokens, g, u);
  LtGemms& lt = gemms();
  const size_t gate_and_up = spec_.gated ? 2 : 1;
  for (size_t i = 0; i < gate_and_up; ++i) lt.run(cu, gemm[i]);
  if (!outputs) return;
  device::TrainDenseForwardParams fp{static_cast<const uint16_t*>(at(g)), spec_.gated ? static_cast<const uint16_t*>(at(u)) : nullptr,
                                     static_cast<uint16_t*>(at(scratch_)), row_l1, tokens, N, N, spec_.threshold,
                                     accumulate ? 1u : 0u};
  void* args[1] = {&fp};
  launch(*forward_kernel_, kernels::LaunchShape{0, tokens, N}, args, cu, who);
  if (t.y != nullptr) lt.run(cu, gemm.back(), accumulate ? 1.0f : 0.0f);
}

std::vector<LtGemm> DenseTraining::backward_gemms(const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens,
                                                  DeviceBuffer& g, DeviceBuffer& u, const FfnGradients& grads,
                                                  bool gradients_in_dtype, bool dw_down_as_weight) const {
  const int64_t K = spec_.d_model, N = spec_.d_ff;
  const bool out_in = spec_.down_layout == WeightLayout::OutIn;
  const bool dw_down_is_weight = dw_down_as_weight && out_in;  // dWd [K, N]; else the rows of dWd^T [N, K]
  ld_dy = or_default(ld_dy, K);
  const int64_t ld_x = or_default(t.ld_x, K), ld_dx = or_default(grads.ld_dx, K);
  const bool c_fp32 = !gradients_in_dtype;
  void* h = at(scratch_);
  // dh = dy Wd: an out_in Wd [K, N] is B stored [k, n]; an in_out one [N, K] is [n, k]. The weight gradients,
  // sums over the tokens: dWg = dg^T x, dWu = du^T x ([N, M] times [M, K]: A stored [k, m]), dWd^T = h^T dy,
  // or dWd = dy^T h; then dx = dg Wg + du Wu (Wg, Wu [N, K]: B stored [k, n]).
  std::vector<LtGemm> out{
      {.a = dy, .lda = ld_dy, .b = t.w_down, .ldb = or_default(t.ld_down, out_in ? N : K), .b_is_n_by_k = !out_in, .c = h,
       .ldc = N, .m = tokens, .n = N, .k = K},
      {.a = at(g), .lda = N, .a_is_k_by_m = true, .b = t.x, .ldb = ld_x, .c = grads.dw_gate, .ldc = or_default(grads.ld_dw_gate, K),
       .m = N, .n = K, .k = tokens, .c_fp32 = c_fp32}};
  if (spec_.gated)
    out.push_back({.a = at(u), .lda = N, .a_is_k_by_m = true, .b = t.x, .ldb = ld_x, .c = grads.dw_up,
                   .ldc = or_default(grads.ld_dw_up, K), .m = N, .n = K, .k = tokens, .c_fp32 = c_fp32});
  out.push_back(dw_down_is_weight
                    ? LtGemm{.a = dy, .lda = ld_dy, .a_is_k_by_m = true, .b = h, .ldb = N, .c = grads.dw_down,
                             .ldc = or_default(grads.ld_dw_down, N), .m = K, .n = N, .k = tokens, .c_fp32 = c_fp32}
                    : LtGemm{.a = h, .lda = N, .a_is_k_by_m = true, .b = dy, .ldb = ld_dy, .c = grads.dw_down,
                             .ldc = or_default(grads.ld_dw_down, K), .m = N, .n = K, .k = tokens, .c_fp32 = c_fp32});
  out.push_back({.a = at(g), .lda = N, .b = t.w_gate, .ldb = or_default(t.ld_gate, K), .c = grads.dx, .ldc = ld_dx, .m = tokens,
                 .n = K, .k = N});
  if (spec_.gated)
    out.push_back({.a = at(u), .lda = N, .b = t.w_up, .ldb = or_default(t.ld_up, K), .c = grads.dx, .ldc = ld_dx, .m = tokens,
                   .n = K, .k = N});
  return out;
}

void DenseTraining::prepare_backward(CUstream cu, const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens,
                                     DeviceBuffer& g, DeviceBuffer& u, const FfnGradients& grads, bool gradients_in_dtype,
                                     bool dw_down_as_weight, const char* who) {
  if (tokens == 0) return;
  ensure_bytes(scratch_, size_t(tokens) * size_t(spec_.d_ff) * 2, cu, who);
  for (const LtGemm& gemm : backward_gemms(t, dy, ld_dy, tokens, g, u, grads, gradients_in_dtype, dw_down_as_weight))
    gemms().prepare(gemm);
}

void DenseTraining::backward(CUstream cu, const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens, DeviceBuffer& g,
                             DeviceBuffer& u, const FfnGradients& grads, bool gradients_in_dtype, bool dw_down_as_weight,
                             float lambda, int64_t l1_tokens, const float* l1_weight, const char* who, bool& consumed,
                             bool accumulate_dx) {
  const int64_t K = spec_.d_model, N = spec_.d_ff;
  const bool dw_down_is_weight = dw_down_as_weight && spec_.down_layout == WeightLayout::OutIn;
  const int out_bytes = gradients_in_dtype ? 2 : 4;
  const Driver& d = Driver::get();
  if (tokens == 0) {  // no token: every weight gradient is zero (dx has no rows)
    consumed = true;
    auto zero = [&](void* p, int64_t ld, int64_t rows, int64_t cols) {
      if (p == nullptr || rows == 0) return;
      check(d.cuMemsetD2D8Async(reinterpret_cast<CUdeviceptr>(p), size_t(ld) * out_bytes, 0, size_t(cols) * out_bytes, size_t(rows), cu),
            "FfnTrainingPlan::backward (dense path): cuMemsetD2D8Async");
    };
    zero(grads.dw_gate, or_default(grads.ld_dw_gate, K), N, K);
    if (spec_.gated) zero(grads.dw_up, or_default(grads.ld_dw_up, K), N, K);
    zero(grads.dw_down, or_default(grads.ld_dw_down, dw_down_is_weight ? N : K), dw_down_is_weight ? K : N, dw_down_is_weight ? N : K);
    return;
  }
  // Every algorithm before the first launch: a shape cuBLASLt cannot take fails here, with g and u intact.
  prepare_backward(cu, t, dy, ld_dy, tokens, g, u, grads, gradients_in_dtype, dw_down_as_weight, who);
  const std::vector<LtGemm> gemm = backward_gemms(t, dy, ld_dy, tokens, g, u, grads, gradients_in_dtype, dw_down_as_weight);
  LtGemms& lt = gemms();
  consumed = true;  // g and u are overwritten from here on
  lt.run(cu, gemm[0]);  // dh
  const int64_t m_l1 = l1_tokens > 0 ? l1_tokens : tokens;
  device::TrainDenseBackwardParams bp{static_cast<uint16_t*>(at(g)), spec_.gated ? static_cast<uint16_t*>(at(u)) : nullptr,
                                      static_cast<uint16_t*>(at(scratch_)), l1_weight,
                                      static_cast<float>(static_cast<double>(lambda) / static_cast<double>(m_l1)),
                                      lambda != 0.0f ? 1u : 0u, tokens, N, N, spec_.threshold};
  void* args[1] = {&bp};
  launch(*backward_kernel_, kernels::LaunchShape{0, tokens, N}, args, cu, who);
  // The dx GEMMs come last: dg Wg, then du Wu where gated, that one adding onto the first (beta 1), the first
  // onto the dx found there where accumulate_dx.
  const size_t first_dx = gemm.size() - (spec_.gated ? 2 : 1);
  for (size_t i = 1; i < gemm.size(); ++i) lt.run(cu, gemm[i], i > first_dx || (i == first_dx && accumulate_dx) ? 1.0f : 0.0f);
}

}  // namespace twell::detail
