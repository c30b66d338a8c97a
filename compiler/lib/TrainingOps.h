// The training ops (twell.train_row_backward, twell.train_weight_grad) and the FfnSpec their kernels
// are emitted from (EmitTraining.h): the passes name them with this, generateAuxiliary goes through them.
#pragma once

#include <string>

#include "mlir/IR/Operation.h"
#include "twell/kernels/kernel.h"
#include "twell/spec.h"

namespace twell::compiler {

// The spec a verified training op describes: d_model (x), d_ff and the layout's tile_n, slots,
// activation, threshold and value type (h), gated (w_up given / du given); down_layout in_out (what the
// kernels read). `op` must be one of the two training ops.
FfnSpec trainingOpSpec(mlir::Operation* op);

// The kernel's entry symbol (trainRowBackwardName / trainWeightGradName of trainingOpSpec(op)).
std::string trainingOpKernelName(mlir::Operation* op);

// The kernel of a specialized training op (target and kernel_name set): emitted from trainingOpSpec(op)
// for its target, headed by the op's text; twell-emit-cuda prints it and generateTrainingKernel returns it.
// Throws Error(InvalidArgument) for a spec the emitter refuses, Error(Compile) where the op's kernel_name
// is not the emitted kernel's (a twell bug).
kernels::KernelSource emitTrainingOp(mlir::Operation* op);

// generateAuxiliary's path for KernelKind::TrainRowBackward and TrainWeightGrad (defined in Generate.cpp,
// beside generateFfn, whose context set-up it shares): the spec is checked by name (EmitTraining.h's
// rules), described as a function holding the training op, verified, run through the kernel pipeline
// (twell-select-config sets the target, twell-specialize the kernel_name) and emitted by emitTrainingOp. Throws Error(InvalidArgument) naming the spec field.
kernels::KernelSource generateTrainingKernel(kernels::KernelKind kind, const FfnSpec& spec, const Target& target);

}  // namespace twell::compiler
