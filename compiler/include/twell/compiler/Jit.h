// twell::jit: the generator (dialect, passes, emitter) and NVRTC behind the runtime's KernelCompiler
// interface (twell/kernels/kernel_compiler.h). Loading libtwell_jit.so registers it with the runtime
// (twell/jit_registry.h), so a Context made in a program that links twell::jit compiles the kernels its
// bundles lack, and caches them (ContextOptions::cache_dir).
#pragma once
#include <memory>

#include "twell/kernels/kernel_compiler.h"

namespace twell::jit {

// The JIT compiler (one per process; the one libtwell_jit.so registers at load).
std::shared_ptr<const kernels::KernelCompiler> compiler();

}  // namespace twell::jit
