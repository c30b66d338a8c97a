// twell::jit's KernelCompiler: generateFfn / generateAuxiliary for sources, NVRTC for binaries. Its
// registration with the runtime runs when libtwell_jit.so is loaded.
#include "twell/compiler/Jit.h"

#include <string>

#include "NvrtcCompiler.h"
#include "twell/compiler/Generate.h"
#include "twell/jit_registry.h"

namespace twell::jit {
namespace {

// Every embedded device header, name and text, in one string (computed once): a change to
// kernels/device changes every cache key, so no stale binary is ever loaded.
const std::string& embeddedHeadersText() {
  static const std::string text = [] {
    std::string t;
    for (const auto& [name, contents] : detail::embeddedHeaders()) {
      t.append(name);
      t.push_back('\0');
      t.append(contents);
      t.push_back('\0');
    }
    return t;
  }();
  return text;
}

class NvrtcKernelCompiler final : public kernels::KernelCompiler {
 public:
  kernels::GeneratedFfn generate_ffn(const FfnSpec& spec, const Target& target,
                                     std::optional<WeightLayout> decode_down_layout) const override {
    return compiler::generateFfn(spec, target, decode_down_layout);
  }
  kernels::KernelSource generate_auxiliary(kernels::KernelKind kind, const FfnSpec& spec,
                                           const Target& target) const override {
    return compiler::generateAuxiliary(kind, spec, target);
  }
  kernels::CompiledBinary compile(const kernels::KernelSource& kernel, const Target& target) const override {
    detail::NvrtcOutput out = detail::compileCuda(kernel.source, kernel.name + ".cu", target.arch(), /*want_cubin=*/true);
    return {std::move(out.ptx), std::move(out.cubin), out.compile_ms};
  }
  std::string binary_identity(const Target& target) const override {
    std::string id = "nvrtc " + detail::nvrtcVersion();
    for (const std::string& option : detail::nvrtcCompileOptions(target.arch(), /*want_cubin=*/true)) id += " " + option;
    id.push_back('\0');
    return id + embeddedHeadersText();
  }
};

}  // namespace

std::shared_ptr<const kernels::KernelCompiler> compiler() {
  static const std::shared_ptr<const kernels::KernelCompiler> instance = std::make_shared<NvrtcKernelCompiler>();
  return instance;
}

namespace {
// Loading libtwell_jit.so makes it the runtime's compiler.
const bool kRegistered = (register_kernel_compiler(compiler()), true);
}  // namespace

}  // namespace twell::jit
