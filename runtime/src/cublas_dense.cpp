// The dense path (twell/dense.h): g = x Wg^T, u = x Wu^T, h = act(g) * u, y = h Wd^T. The GEMMs through
// cuBLASLt (bf16/fp16 operands, fp32 compute) and the elementwise step through a twell kernel
// (DenseGatedMul), or (FusedGatedUp) the first three in one twell wgmma kernel (DenseGatedUp, from
// gate_twell_wgmma.cuh), then cuBLASLt's down GEMM, or (CuBlas) every GEMM through cublasGemmEx as
// PyTorch calls it. Both twell kernels come from the context (bundle or JIT).
#include <cublas_v2.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "context_impl.h"
#include "driver.h"
#include "dense_kernels.h"
#include "launcher.h"
#include "lt_gemm.h"
#include "run_arguments.h"
#include "tma_map.h"
#include "twell/kernels/constraints.h"
#include "twell/kernels/validate.h"
#include "twell/dense.h"
#include "twell/device/params.h"
#include "twell/device_memory.h"
#include "twell/error.h"

namespace twell {
namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::Cuda, fmt::format("DenseFfn: {}: cuBLAS status {} ({})", what, static_cast<int>(s), cublasGetStatusString(s)));
}

// One GEMM of the FFN: row-major C[m, n] = A[m, k] * op(B), B stored [n, k] (b_is_n_by_k) or [k, n].
using Gemm = detail::LtGemm;

}  // namespace

struct DenseFfn::Impl {
  std::shared_ptr<Context::Impl> context;
  FfnSpec spec;
  int64_t max_tokens = 0;
  std::shared_ptr<LoadedKernel> gated_mul;
  std::shared_ptr<LoadedKernel> fused;  // DenseKernels::FusedGatedUp, where it applies
  // cuBLASLt's GEMMs (DenseKernels::CuBlasLtTuned: each shape's fastest of its top algorithms); its
  // workspace also serves cuBLAS.
  std::unique_ptr<detail::LtGemms> lt;
  cublasHandle_t blas = nullptr;  // DenseKernels::CuBlas: every GEMM through cublasGemmEx
  std::unique_ptr<detail::DeviceBuffer> g, u;

  ~Impl() {
    if (blas != nullptr) cublasDestroy(blas);
  }

  void gemm(CUstream stream, const Gemm& g, float beta = 0.0f) {
    const float alpha = 1.0f;
    if (blas != nullptr) {
      // The column-major product C^T [n, m] = op(B) A^T, as LtGemms computes it; PyTorch's F.linear
      // makes the same call (transa T on the [n, k] weight, transb N).
      const cudaDataType_t type = spec.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
      for (const int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc})
        if (v > INT32_MAX)
          throw Error(ErrorCode::Unsupported, fmt::format("DenseFfn (cuBLAS): a GEMM size or stride of {} exceeds cublasGemmEx's "
                                                          "int range (use DenseKernels::CuBlasLt)", v));
      check_blas(cublasSetStream(blas, reinterpret_cast<cudaStream_t>(stream)), "cublasSetStream");
      check_blas(cublasGemmEx(blas, g.b_is_n_by_k ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(g.n),
                              static_cast<int>(g.m), static_cast<int>(g.k), &alpha, g.b, type, static_cast<int>(g.ldb), g.a, type,
                              static_cast<int>(g.lda), &beta, g.c, type, static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT_TENSOR_OP),
                 "cublasGemmEx");
      return;
    }
    lt->run(stream, g, beta);
  }
};

detail::DenseKernelSet detail::dense_kernels(Context::Impl& context, const FfnSpec& spec, DenseKernels kernels) {
  DenseKernelSet set;
  set.gated_mul = context.auxiliary(kernels::KernelKind::DenseGatedMul, spec, "DenseFfn");
  const Target& target = context.target;
  if (kernels == DenseKernels::FusedGatedUp &&
      kernels::DenseGatedUpConstraints::allowed(spec.gated, target.sm, target.arch_specific, spec.d_model, spec.d_ff)) {
    try {
      set.fused = context.auxiliary(kernels::KernelKind::DenseGatedUp, spec, "DenseFfn");
    } catch (const Error&) {
      // An optional kernel: if it cannot be had (no bundle holds it and no JIT) or this GPU cannot
      // build or hold it, the cuBLASLt kernels compute the same function (fused() says which).
      set.fused = nullptr;
    }
  }
  return set;
}

bool DenseFfn::fused() const { return impl_ && impl_->fused != nullptr; }

DenseFfn::DenseFfn(Context& context, const FfnSpec& spec, int64_t max_tokens, DenseKernels kernels) : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  p.context = context_impl(context);
  if (!p.context->gpu) throw Error(ErrorCode::NoDevice, "DenseFfn: needs a GPU (" + p.context->no_gpu_reason + ")");
  if (spec.d_model <= 0 || spec.d_ff <= 0 || max_tokens < 1)
    throw Error(ErrorCode::InvalidArgument, fmt::format("DenseFfn: expected d_model, d_ff, max_tokens >= 1, got {}, {}, {}",
                                                        spec.d_model, spec.d_ff, max_tokens));
  p.spec = twell::kernels::canonical_spec(spec);  // the request key Context::plan makes
  p.max_tokens = max_tokens;
  detail::DenseKernelSet set = detail::dense_kernels(*p.context, p.spec, kernels);
  p.gated_mul = std::move(set.gated_mul);
  p.fused = std::move(set.fused);
  p.context->make_current();
  p.lt = std::make_unique<detail::LtGemms>(spec.dtype, kernels == DenseKernels::CuBlasLtTuned, "DenseFfn");
  if (kernels == DenseKernels::CuBlas) {
    check_blas(cublasCreate(&p.blas), "cublasCreate");
    check_blas(cublasSetWorkspace(p.blas, p.lt->workspace(), detail::LtGemms::kWorkspaceBytes), "cublasSetWorkspace");
  }
  p.g = std::make_unique<detail::DeviceBuffer>(size_t(max_tokens) * spec.d_ff * 2);
  if (spec.gated) p.u = std::make_unique<detail::DeviceBuffer>(size_t(max_tokens) * spec.d_ff * 2);
}

DenseFfn::~DenseFfn() = default;
DenseFfn::DenseFfn(DenseFfn&&) noexcept = default;

namespace {
// The FFN's GEMMs for these tensors: gate, up (gated), down; g and u are the object's workspaces.
std::vector<Gemm> ffn_gemms(const DenseFfn::Impl& p, const FfnTensors& t, int64_t tokens) {
  const FfnSpec& s = p.spec;
  const int64_t ldx = t.ld_x ? t.ld_x : s.d_model, ldy = t.ld_y ? t.ld_y : s.d_model;
  const bool in_out = s.down_layout == WeightLayout::InOut;
  void* g = reinterpret_cast<void*>(p.g->get());
  std::vector<Gemm> gemms{{.a = t.x, .lda = ldx, .b = t.w_gate, .ldb = t.ld_gate ? t.ld_gate : s.d_model, .b_is_n_by_k = true,
                           .c = g, .ldc = s.d_ff, .m = tokens, .n = s.d_ff, .k = s.d_model}};
  if (s.gated)
    gemms.push_back({.a = t.x, .lda = ldx, .b = t.w_up, .ldb = t.ld_up ? t.ld_up : s.d_model, .b_is_n_by_k = true,
                     .c = reinterpret_cast<void*>(p.u->get()), .ldc = s.d_ff, .m = tokens, .n = s.d_ff, .k = s.d_model});
  gemms.push_back({.a = g, .lda = s.d_ff, .b = t.w_down, .ldb = t.ld_down ? t.ld_down : (in_out ? s.d_model : s.d_ff),
                   .b_is_n_by_k = !in_out, .c = t.y, .ldc = ldy, .m = tokens, .n = s.d_model, .k = s.d_ff});
  return gemms;
}
}  // namespace

void DenseFfn::run_gate(Stream stream, const FfnTensors& t, int64_t tokens) {
  Impl& p = *impl_;
  p.context->make_current();
  check_run_arguments("DenseFfn::run_gate", p.spec, t, tokens, p.max_tokens, RunOperands::Gate);
  if (tokens == 0) return;
  p.gemm(reinterpret_cast<CUstream>(stream), ffn_gemms(p, t, tokens).front());  // g = x Wg^T
}

namespace {
// Calls of at most this many tokens take the cuBLASLt kernels even where the fused gated-up kernel is
// built: its 128-row CTA tiles are mostly padding there, and on the H200 at the paper's shape it took
// 38-42 us per call at 1-64 rows against cuBLASLt's 29-34 (under a CUDA graph; the two were even at
// 256 rows: bench/README.md v69).
constexpr int64_t kFusedGatedUpMinTokens = 65;

// Whether run() takes the fused gated-up kernel for these GEMMs (ffn_gemms): it is built, the call has
// kFusedGatedUpMinTokens rows or more, and TMA can read x, Wg and Wu (16-byte aligned, strides
// multiples of 8 elements).
bool takes_fused(const DenseFfn::Impl& p, const std::vector<Gemm>& gemms) {
  return p.fused && gemms[0].m >= kFusedGatedUpMinTokens && operand_aligned(gemms[0].a, gemms[0].lda, 8) &&
         operand_aligned(gemms[0].b, gemms[0].ldb, 8) && operand_aligned(gemms[1].b, gemms[1].ldb, 8);
}
}  // namespace

void DenseFfn::prepare(const FfnTensors& t, int64_t tokens) {
  Impl& p = *impl_;
  p.context->make_current();
  check_run_arguments("DenseFfn::run", p.spec, t, tokens, p.max_tokens);
  if (tokens == 0) return;
  const std::vector<Gemm> gemms = ffn_gemms(p, t, tokens);
  // The fused kernel replaces the gate and up GEMMs: then only the down GEMM's algorithm is needed.
  if (p.blas != nullptr) return;  // cublasGemmEx chooses per call
  for (size_t i = takes_fused(p, gemms) ? gemms.size() - 1 : 0; i < gemms.size(); ++i) p.lt->prepare(gemms[i]);
}

void DenseFfn::run(Stream stream, const FfnTensors& t, int64_t tokens, bool accumulate) {
  Impl& p = *impl_;
  const FfnSpec& s = p.spec;
  prepare(t, tokens);  // every check and algorithm choice before the first launch
  if (tokens == 0) return;
  auto cu = reinterpret_cast<CUstream>(stream);
  const std::vector<Gemm> gemms = ffn_gemms(p, t, tokens);
  void* g = reinterpret_cast<void*>(p.g->get());
  if (takes_fused(p, gemms)) {
    // h = act(x Wg^T) * (x Wu^T) in one kernel, into g's workspace; then the down GEMM.
    const kernels::KernelSource& src = p.fused->source;
    const Gemm& gate = gemms[0];
    const Gemm& up = gemms[1];
    device::GateParams gp{};
    gp.x = static_cast<const uint16_t*>(gate.a);
    gp.w_gate = static_cast<const uint16_t*>(gate.b);
    gp.m = tokens;
    gp.ldx = gate.lda;
    gp.ldw = gate.ldb;
    gp.h = static_cast<uint16_t*>(g);
    gp.ldh = s.d_ff;
    detail::encode_tma_map(gp.x_map, s.dtype, gate.a, tokens, s.d_model, gate.lda, src.cta_m, src.cta_k,
                           "DenseFfn::run: cuTensorMapEncodeTiled(x)");
    detail::encode_tma_map(gp.w_map, s.dtype, gate.b, s.d_ff, s.d_model, gate.ldb, src.tile_n / src.cluster_m, src.cta_k,
                           "DenseFfn::run: cuTensorMapEncodeTiled(w_gate)");
    detail::encode_tma_map(gp.u_map, s.dtype, up.b, s.d_ff, s.d_model, up.ldb, src.tile_n / src.cluster_m, src.cta_k,
                           "DenseFfn::run: cuTensorMapEncodeTiled(w_up)");
    void* args[1] = {&gp};
    detail::launch(*p.fused, kernels::LaunchShape{tokens, 0, 0}, args, cu, "DenseFfn::run");
    p.gemm(cu, gemms.back(), accumulate ? 1.0f : 0.0f);
    return;
  }
  for (size_t i = 0; i + 1 < gemms.size(); ++i) p.gemm(cu, gemms[i]);  // g = x Wg^T (and u = x Wu^T)
  void* u = s.gated ? reinterpret_cast<void*>(p.u->get()) : nullptr;  // non-gated: h = act(g)
  device::GatedMulParams mul{static_cast<const uint16_t*>(g), static_cast<const uint16_t*>(u), static_cast<uint16_t*>(g),
                             tokens, s.d_ff, s.d_ff};
  float threshold = s.threshold;
  void* args[2] = {&mul, &threshold};
  detail::launch(*p.gated_mul, kernels::LaunchShape{0, tokens, s.d_ff}, args, cu, "DenseFfn::run (gated multiply)");
  // accumulate: cuBLASLt's D = H Wd^T + beta C with C = D = y (same layout, in place).
  p.gemm(cu, gemms.back(), accumulate ? 1.0f : 0.0f);
}

}  // namespace twell
