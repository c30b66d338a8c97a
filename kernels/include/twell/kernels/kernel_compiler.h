// What the runtime asks of a kernel compiler: the seam between twell::runtime (which never links MLIR
// or NVRTC) and twell::jit (compiler/lib/Jit.cpp), which implements it and registers itself with the
// runtime when its library is loaded (twell/jit_registry.h). A deployment that runs ahead-of-time
// bundles has no compiler: the runtime then takes every kernel from its bundles.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "twell/kernels/kernel.h"
#include "twell/spec.h"

namespace twell::kernels {

// A compiled kernel: PTX (always) and the cubin for the target's real architecture.
struct CompiledBinary {
  std::string ptx;
  std::vector<char> cubin;
  double compile_ms = 0;  // wall time of the compile, milliseconds
};

class KernelCompiler {
 public:
  virtual ~KernelCompiler() = default;

  // The kernels of one FFN (the generator: dialect, passes, emitter), as compiler::generateFfn.
  // Throws twell::Error(InvalidArgument) naming the spec field for an illegal spec.
  virtual GeneratedFfn generate_ffn(const FfnSpec& spec, const Target& target,
                                    std::optional<WeightLayout> decode_down_layout) const = 0;

  // An auxiliary kernel (WeightTranspose, NeuronPermute, DenseGatedMul, DenseGatedUp) or a training
  // kernel (TrainRowBackward, TrainWeightGrad, TrainDenseForward, TrainDenseBackward), as
  // compiler::generateAuxiliary.
  virtual KernelSource generate_auxiliary(KernelKind kind, const FfnSpec& spec, const Target& target) const = 0;

  // Compiles one kernel for `target` (PTX and cubin). Thread-safe. Throws Error(Compile) with the log.
  virtual CompiledBinary compile(const KernelSource& kernel, const Target& target) const = 0;

  // Everything besides the kernel's source that can change its binary for `target` (the compiler's
  // version and options, the device headers' text): part of every kernel cache key.
  virtual std::string binary_identity(const Target& target) const = 0;
};

}  // namespace twell::kernels
