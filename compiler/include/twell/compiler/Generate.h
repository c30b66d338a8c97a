// The generator's entry points: from a shape description or a `.mlir` file to CUDA C++ translation
// units, one per kernel, through the twell dialect and its passes (ARCHITECTURE.md, "Flow of one kernel").
//
// This header includes no MLIR headers, so the runtime and tools can call the generator cheaply.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "twell/kernels/kernel.h"
#include "twell/spec.h"

namespace twell::compiler {

// The kernel descriptions the generator returns are the contract layer's (twell/kernels/kernel.h).
using kernels::GeneratedFfn;
using kernels::KernelKind;
using kernels::KernelSource;

// Whether kernels can be generated and built by NVRTC for `target`: target.sm is one of the
// architectures NVRTC 13.0 builds for at or above sm_80, and arch_specific only where that architecture
// has an "a" variant. The one list of them is twell::kernels::SupportedArchs (twell/kernels/constraints.h), which
// the #twell.target verifier uses too.
bool isSupportedTarget(const Target& target);

// The accepted targets, for messages: "sm_80, sm_86, ..., sm_121, sm_90a, ..., sm_121a".
std::string supportedTargets();

// Builds the twell dialect function for `spec` (twell.gated_ffn, or twell.ffn when !spec.gated) with
// the C++ API, runs the pipeline and emits CUDA. `decode_down_layout`: the Wd layout the decode kernels
// read, where it differs from spec.down_layout (a plan that gives the large-M consumer an in_out copy of
// an out_in Wd keeps its decode calls on the user's out_in Wd, which costs less than a copy at a few rows).
// The spec is canonicalized first (kernels::canonical_spec: threshold -0.0 as +0.0, the same kernels).
// Throws twell::Error(InvalidArgument) naming the field when the spec (including an enum field out of
// range) or the target (!isSupportedTarget) is illegal, Error(Compile) if the pipeline
// rejects the IR it built (a bug). Thread-safe: every call has its own MLIRContext.
GeneratedFfn generateFfn(const FfnSpec& spec, const Target& target,
                         std::optional<WeightLayout> decode_down_layout = std::nullopt);

// Same from MLIR text (one module with one func.func holding a twell.gated_ffn or a twell.gate_matmul
// feeding a twell.gated_down). `filename` is used in diagnostics. Throws twell::Error(Parse) with the
// MLIR diagnostics (file:line:col, source line) on parse or verification failure or when brackets nest
// deeper than kMaxMlirNesting (twell/compiler/SourceNesting.h: checked before parsing), and
// Error(InvalidArgument) with the diagnostics when the pipeline rejects the IR (not one FFN, a
// kernel's explicit #twell.target differs from `target`, an explicit `decode` attribute the decode
// kernels cannot honour) or `target` is illegal. Thread-safe.
GeneratedFfn generateFromMlir(std::string_view mlir_text, std::string_view filename, const Target& target);

// The auxiliary kernels the runtime launches beside an FFN's (kernel.h): WeightTranspose and
// NeuronPermute (any spec), DenseGatedMul (spec.dtype, spec.activation; the threshold is an argument),
// DenseGatedUp (a gated spec on sm_90a with d_model % 64 == 0 and d_ff % 8 == 0:
// DenseGatedUpConstraints::allowed) and the training kernels: the backward by token row, TrainRowBackward
// (any legal spec up to TrainRowBackwardConstraints::kMaxDModel), and the weight gradients,
// TrainWeightGrad (up to TrainWeightGradConstraints::kMaxDModel; EmitTraining.cpp), and the dense
// training path's elementwise steps, TrainDenseForward and TrainDenseBackward (as DenseGatedMul). Their configuration is the contract's (twell/kernels/constraints.h);
// emitted by compiler/lib/EmitAuxiliary.cpp. Throws Error(InvalidArgument) naming the kind and the
// rule for a kind that is not auxiliary or a spec/target the kernel does not allow.
KernelSource generateAuxiliary(KernelKind kind, const FfnSpec& spec, const Target& target);

}  // namespace twell::compiler
