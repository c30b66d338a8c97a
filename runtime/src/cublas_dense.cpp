// The dense baseline (twell/dense.h): g = x Wg^T, u = x Wu^T, h = act(g) * u, y = h Wd^T, the GEMMs
// through cuBLASLt (bf16/fp16 operands, fp32 compute), the elementwise step through NVRTC.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <tuple>

#include <fmt/format.h>

#include "context_impl.h"
#include "twell/dense.h"
#include "twell/device/params.h"
#include "twell/error.h"

namespace twell {
namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::Cuda, fmt::format("DenseFfn: {}: cuBLASLt status {} ({})", what, static_cast<int>(s), cublasLtGetStatusString(s)));
}

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

// One cuBLASLt GEMM shape, described and matched to an algorithm once: descriptors, layouts and the
// heuristic's choice are host work that need not repeat on every call of the same shape.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_b = nullptr, layout_a = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_a) cublasLtMatrixLayoutDestroy(layout_a);
    if (layout_b) cublasLtMatrixLayoutDestroy(layout_b);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct DenseFfn::Impl {
  std::shared_ptr<Context::Impl> context;
  FfnSpec spec;
  int64_t max_tokens = 0;
  std::shared_ptr<LoadedKernel> gated_mul;
  cublasLtHandle_t handle = nullptr;
  std::unique_ptr<detail::DeviceBuffer> workspace, g, u;
  // Keyed by (m, n, k, lda, ldb, ldc, b_is_n_by_k).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>, std::unique_ptr<GemmPlan>> gemm_plans;

  ~Impl() {
    gemm_plans.clear();  // descriptors before the handle
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  // Row-major C[m, n] = A[m, k] * op(B) where B is stored row-major as [n, k] (transposed = true,
  // nn.Linear) or [k, n]. cuBLASLt is column-major: compute C^T = op(B)^T-as-stored * A^T.
  const GemmPlan& gemm_plan(int64_t lda, int64_t ldb, bool b_is_n_by_k, int64_t ldc, int64_t m, int64_t n, int64_t k) {
    auto& slot = gemm_plans[{m, n, k, lda, ldb, ldc, b_is_n_by_k}];
    if (slot) return *slot;
    auto plan = std::make_unique<GemmPlan>();
    const cudaDataType_t type = spec.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    check_lt(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    // First operand of the column-major product: B as stored. [n, k] row-major is k x n column-major
    // (ld = ldb): transpose it to n x k. [k, n] row-major is n x k column-major already.
    const cublasOperation_t op_first = b_is_n_by_k ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), "TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)), "TRANSB");
    if (b_is_n_by_k) check_lt(cublasLtMatrixLayoutCreate(&plan->layout_b, type, k, n, ldb), "layout B");
    else check_lt(cublasLtMatrixLayoutCreate(&plan->layout_b, type, n, k, ldb), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&plan->layout_a, type, k, m, lda), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&plan->layout_c, type, n, m, ldc), "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = kWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const cublasStatus_t got = set != CUBLAS_STATUS_SUCCESS ? set
                               : cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->layout_b, plan->layout_a, plan->layout_c,
                                                                plan->layout_c, pref, 1, &heuristic, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(set, "workspace pref");
    check_lt(got, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) throw Error(ErrorCode::Cuda, fmt::format("DenseFfn: cuBLASLt has no algorithm for m={} n={} k={}", m, n, k));
    plan->algo = heuristic.algo;
    slot = std::move(plan);
    return *slot;
  }

  void gemm(CUstream stream, const void* a, int64_t lda, const void* b, int64_t ldb, bool b_is_n_by_k, void* c, int64_t ldc,
            int64_t m, int64_t n, int64_t k, float beta = 0.0f) {
    const GemmPlan& plan = gemm_plan(lda, ldb, b_is_n_by_k, ldc, m, n, k);
    const float alpha = 1.0f;
    check_lt(cublasLtMatmul(handle, plan.desc, &alpha, b, plan.layout_b, a, plan.layout_a, &beta, c, plan.layout_c, c,
                            plan.layout_c, &plan.algo, reinterpret_cast<void*>(workspace->get()), kWorkspaceBytes,
                            reinterpret_cast<cudaStream_t>(stream)),
             "cublasLtMatmul");
  }
};

DenseFfn::DenseFfn(Context& context, const FfnSpec& spec, int64_t max_tokens) : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  p.context = context_impl(context);
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, "DenseFfn: needs a GPU (" + p.context->no_gpu_reason + ")");
  if (spec.d_model <= 0 || spec.d_ff <= 0 || max_tokens < 1)
    throw Error(ErrorCode::InvalidArgument, fmt::format("DenseFfn: expected d_model, d_ff, max_tokens >= 1, got {}, {}, {}",
                                                        spec.d_model, spec.d_ff, max_tokens));
  p.spec = spec;
  p.max_tokens = max_tokens;
  compiler::KernelSource k;
  k.kind = compiler::KernelKind::DenseGatedMul;
  k.name = fmt::format("twell_dense_gated_mul_{}_{}", to_string(spec.dtype), to_string(spec.activation));
  k.threads = 256;
  k.cta_m = 1;
  k.source = fmt::format(
      "// Generated by twell's dense baseline (runtime/src/cublas_dense.cpp).\n"
      "#include \"twell/device/dense_ops.cuh\"\n"
      "extern \"C\" __global__ void __launch_bounds__(256) {}(const twell::device::GatedMulParams p, float threshold) {{\n"
      "  twell::device::gated_mul<twell::device::{}, {}>(p, threshold);\n}}\n",
      k.name, spec.dtype == DType::BF16 ? "BF16" : "FP16", spec.activation == Activation::ReLU ? 0 : 1);
  p.gated_mul = p.context->load(k);
  p.context->make_current();
  check_lt(cublasLtCreate(&p.handle), "cublasLtCreate");
  p.workspace = std::make_unique<detail::DeviceBuffer>(kWorkspaceBytes);
  p.g = std::make_unique<detail::DeviceBuffer>(size_t(max_tokens) * spec.d_ff * 2);
  if (spec.gated) p.u = std::make_unique<detail::DeviceBuffer>(size_t(max_tokens) * spec.d_ff * 2);
}

DenseFfn::~DenseFfn() = default;
DenseFfn::DenseFfn(DenseFfn&&) noexcept = default;

void DenseFfn::run_gate(Stream stream, const FfnTensors& t, int64_t tokens) {
  Impl& p = *impl_;
  const FfnSpec& s = p.spec;
  p.context->make_current();
  check_run_arguments("DenseFfn::run_gate", s, t, tokens, p.max_tokens, /*needs_output=*/false);
  if (tokens == 0) return;
  p.gemm(reinterpret_cast<CUstream>(stream), t.x, t.ld_x ? t.ld_x : s.d_model, t.w_gate, t.ld_gate ? t.ld_gate : s.d_model, true,
         reinterpret_cast<void*>(p.g->get()), s.d_ff, tokens, s.d_ff, s.d_model);
}

void DenseFfn::run(Stream stream, const FfnTensors& t, int64_t tokens, bool accumulate) {
  Impl& p = *impl_;
  const FfnSpec& s = p.spec;
  p.context->make_current();
  check_run_arguments("DenseFfn::run", s, t, tokens, p.max_tokens);
  if (tokens == 0) return;
  auto cu = reinterpret_cast<CUstream>(stream);
  const int64_t ldx = t.ld_x ? t.ld_x : s.d_model, ldy = t.ld_y ? t.ld_y : s.d_model;
  const bool in_out = s.down_layout == WeightLayout::InOut;
  void* g = reinterpret_cast<void*>(p.g->get());
  void* u = s.gated ? reinterpret_cast<void*>(p.u->get()) : nullptr;  // non-gated: h = act(g)
  p.gemm(cu, t.x, ldx, t.w_gate, t.ld_gate ? t.ld_gate : s.d_model, true, g, s.d_ff, tokens, s.d_ff, s.d_model);
  if (s.gated) p.gemm(cu, t.x, ldx, t.w_up, t.ld_up ? t.ld_up : s.d_model, true, u, s.d_ff, tokens, s.d_ff, s.d_model);
  device::GatedMulParams mul{static_cast<const uint16_t*>(g), static_cast<const uint16_t*>(u), static_cast<uint16_t*>(g),
                             tokens, s.d_ff, s.d_ff};
  float threshold = s.threshold;
  void* args[2] = {&mul, &threshold};
  const int64_t blocks = std::min<int64_t>((tokens * s.d_ff + 255) / 256, 65535);
  detail::check(detail::Driver::get().cuLaunchKernel(p.gated_mul->function, static_cast<unsigned>(blocks), 1, 1, 256, 1, 1, 0, cu, args, nullptr),
                "DenseFfn::run: launching the gated multiply");
  // accumulate: cuBLASLt's D = H Wd^T + beta C with C = D = y (same layout, in place).
  p.gemm(cu, g, s.d_ff, t.w_down, t.ld_down ? t.ld_down : (in_out ? s.d_model : s.d_ff), !in_out, t.y, ldy, tokens, s.d_model, s.d_ff,
         accumulate ? 1.0f : 0.0f);
}

}  // namespace twell
