// Where the runtime finds a kernel compiler. twell::jit (libtwell_jit.so) registers one when it is
// loaded, so a program that links it compiles missing kernels on demand; a program that links the
// runtime alone has none, and takes every kernel from ahead-of-time bundles (Context::load_bundle).
#pragma once
#include <memory>

#include "twell/kernels/kernel_compiler.h"

namespace twell {

// Replaces the registered compiler (nullptr: none). Thread-safe. Contexts made afterwards use it
// (ContextOptions::jit).
void register_kernel_compiler(std::shared_ptr<const kernels::KernelCompiler> compiler);

// The registered compiler, or nullptr when twell::jit is not linked. Thread-safe.
std::shared_ptr<const kernels::KernelCompiler> registered_kernel_compiler();

}  // namespace twell
