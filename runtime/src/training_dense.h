// The dense training path of FfnTrainingPlan (TrainingPath::Dense; twell/training_plan.h): the step as a
// dense framework computes it, on cuBLASLt GEMMs (bf16/fp16 operands, fp32 accumulation) and the two
// elementwise kernels of train/dense_elementwise.cuh:
//
//   forward:  g = x Wg^T, u = x Wu^T (kept for the backward), h = act(g) u and row L1 (TrainDenseForward,
//             into the plan's scratch), y = h Wd^T
//   backward: dh = dy Wd (scratch), then in place dg over g, du over u, h over dh (TrainDenseBackward),
//             dWd = dy^T h (or its transpose), dWg = dg^T x, dWu = du^T x, dx = dg Wg + du Wu
//
// Its cost does not depend on the density (9 GEMMs of the layer's size and two passes over [tokens, d_ff]):
// what the sparse path's cost is compared with (TrainingDispatch::Auto).
#pragma once
#include <memory>
#include <vector>

#include "context_impl.h"
#include "driver.h"
#include "lt_gemm.h"
#include "twell/plan.h"
#include "twell/training_plan.h"

namespace twell::detail {

class DenseTraining {
 public:
  // spec: the plan's (canonical; its own down_layout). Obtains both elementwise kernels (their reports
  // appended to `reports`); the cuBLASLt handle is made at the first call. Throws what
  // Context::Impl::auxiliary throws.
  DenseTraining(std::shared_ptr<Context::Impl> context, const FfnSpec& spec, std::vector<KernelReport>& reports, const char* who);

  // g and u ([tokens, d_ff] spec.dtype, grown as needed) for the backward; with t.y or row_l1 also h (the
  // plan's scratch), row_l1 and y. Arguments checked by the caller (FfnTrainingPlan::forward).
  // accumulate: y += (the down GEMM with beta 1: y rounded twice) and row_l1 += (a split plan's dense
  // neurons, after its TwELL part wrote both; TrainingPlanOptions::dense_neurons).
  void forward(CUstream cu, const FfnTensors& t, int64_t tokens, DeviceBuffer& g, DeviceBuffer& u, float* row_l1,
               bool accumulate = false);
  // What forward() and backward() can fail on before they launch (the buffers' growth and every cuBLASLt
  // algorithm choice for these operands), without launching: a split plan calls them before its TwELL part
  // writes y, row_l1 or dx, so a refusal leaves every output and the state untouched.
  void prepare_forward(CUstream cu, const FfnTensors& t, int64_t tokens, DeviceBuffer& g, DeviceBuffer& u, bool with_outputs);
  void prepare_backward(CUstream cu, const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens, DeviceBuffer& g,
                        DeviceBuffer& u, const FfnGradients& grads, bool gradients_in_dtype, bool dw_down_as_weight,
                        const char* who);
  // The gradients (FfnTrainingPlan::backward's contract); g and u become dg and du (a state's dense forward
  // serves one backward: `consumed` is set once they may have changed, before the first launch and after
  // every cuBLASLt algorithm choice). The caller (FfnTrainingPlan::backward) checked every argument and
  // overlap. dw_down_as_weight: dWd [K, N] for an out_in Wd (else dWd^T's rows). accumulate_dx: dx += (a
  // split plan's dense neurons after its TwELL part wrote dx); the weight gradients are written either way.
  // The tensors and gradients of a split's slice carry explicit strides (this spec's d_ff is the slice's).
  void backward(CUstream cu, const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens, DeviceBuffer& g,
                DeviceBuffer& u, const FfnGradients& grads, bool gradients_in_dtype, bool dw_down_as_weight, float lambda,
                int64_t l1_tokens, const float* l1_weight, const char* who, bool& consumed, bool accumulate_dx = false);

  size_t scratch_bytes() const { return scratch_.bytes(); }
  static size_t state_bytes(const FfnSpec& spec, int64_t tokens);  // g and u of `tokens` rows

 private:
  std::shared_ptr<Context::Impl> context_;
  FfnSpec spec_;
  std::shared_ptr<LoadedKernel> forward_kernel_, backward_kernel_;
  std::unique_ptr<LtGemms> gemms_;  // made at the first call (a plan that never takes this path holds none)
  DeviceBuffer scratch_;            // [tokens, d_ff] spec.dtype: h in the forward, dh then h in the backward
  LtGemms& gemms();
  // The GEMMs of forward() (g, u, then y = h Wd^T where t.y is set) and of backward() (dh first, then the
  // weight gradients, then dx = dg Wg (+ du Wu)), over these buffers: what prepare_* choose and the calls run.
  std::vector<LtGemm> forward_gemms(const FfnTensors& t, int64_t tokens, DeviceBuffer& g, DeviceBuffer& u) const;
  std::vector<LtGemm> backward_gemms(const FfnTensors& t, const void* dy, int64_t ld_dy, int64_t tokens, DeviceBuffer& g,
                                     DeviceBuffer& u, const FfnGradients& grads, bool gradients_in_dtype,
                                     bool dw_down_as_weight) const;
};

}  // namespace twell::detail
