#include "twell/jit_registry.h"

#include <mutex>

namespace twell {
namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::shared_ptr<const kernels::KernelCompiler>& registry() {
  static std::shared_ptr<const kernels::KernelCompiler> compiler;
  return compiler;
}
}  // namespace

void register_kernel_compiler(std::shared_ptr<const kernels::KernelCompiler> compiler) {
  std::lock_guard lock(registry_mutex());
  registry() = std::move(compiler);
}

std::shared_ptr<const kernels::KernelCompiler> registered_kernel_compiler() {
  std::lock_guard lock(registry_mutex());
  return registry();
}

}  // namespace twell
