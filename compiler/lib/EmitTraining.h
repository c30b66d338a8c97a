// The training kernels' emitter (EmitTraining.cpp), reached through generateAuxiliary (Generate.h).
#pragma once
#include <string>

#include "twell/kernels/kernel.h"
#include "twell/spec.h"

namespace twell::compiler {

// The backward by token row of `spec` for `target` (KernelKind::TrainRowBackward): d_model, d_ff,
// tile_n, slots (the generator's defaults where unset), activation, threshold, dtype and gated become
// constants; the gate's main loop is generateFfn's for the same spec and target. spec.down_layout,
// consumer and gate_cluster_m do not matter (the kernel reads an in_out Wd). Throws
// Error(InvalidArgument) naming the spec field (validate_spec's rules, d_model above
// TrainRowBackwardConstraints::kMaxDModel).
kernels::KernelSource emitTrainRowBackward(const FfnSpec& spec, const Target& target);
// Its checks of `spec` alone (what emitTrainRowBackward throws before it emits anything).
void checkTrainRowBackward(const FfnSpec& spec);

// Its entry symbol:
// twell_train_row_backward_k<d_model>_n<d_ff>_t<tile_n>_s<slots>_<activation>_<dtype>_gated<0|1>_th<threshold's 8 hex
// digits> (the runtime's bundle check rebuilds it from the request key).
std::string trainRowBackwardName(const FfnSpec& spec);

// The weight gradients of `spec` (KernelKind::TrainWeightGrad): d_model, d_ff, tile_n, slots (the
// generator's defaults where unset), dtype and gated become constants; the activation, threshold, down
// layout, consumer and cluster do not matter (the kernel sums the row backward's per-entry values and
// writes an in_out dWd). The same kernel for every target (no tensor cores). Throws
// Error(InvalidArgument) naming the spec field (validate_spec's rules, d_model above
// TrainWeightGradConstraints::kMaxDModel).
kernels::KernelSource emitTrainWeightGrad(const FfnSpec& spec, const Target& target);
// Its checks of `spec` alone (what emitTrainWeightGrad throws before it emits anything).
void checkTrainWeightGrad(const FfnSpec& spec, const Target& target);

// Its entry symbol: twell_train_weight_grad_k<d_model>_n<d_ff>_t<tile_n>_s<slots>_<dtype>_gated<0|1>.
std::string trainWeightGradName(const FfnSpec& spec);

}  // namespace twell::compiler
