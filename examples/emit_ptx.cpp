// Ahead-of-time: generate the TwELL kernels of a model shape and write their CUDA C++ and PTX
// (no GPU needed). `twellc emit` does the same from the command line.
//   ./build/bin/emit_ptx OUT_DIR [d_model d_ff]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "twell/compiler/Generate.h"
#include "twell/context.h"
#include "twell/error.h"

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-' || argc == 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s OUT_DIR [d_model d_ff]\n", argv[0]);
    return 2;
  }
  try {
    twell::FfnSpec spec;
    spec.d_model = argc > 3 ? std::atoll(argv[2]) : 2048;  // 0 for non-numbers: generateFfn names the field
    spec.d_ff = argc > 3 ? std::atoll(argv[3]) : 5632;
    const twell::Target target{90, true};  // sm_90a: H100 / H200
    const auto generated = twell::compiler::generateFfn(spec, target);

    twell::ContextOptions options;
    options.target = target;
    twell::Context ctx(options);
    std::filesystem::create_directories(argv[1]);
    std::ofstream(std::filesystem::path(argv[1]) / "ffn.mlir") << generated.ir;
    for (const auto& k : ctx.compile(generated)) {
      std::ofstream(std::filesystem::path(argv[1]) / (k.report.name + ".cu")) << k.cuda_source;
      std::ofstream(std::filesystem::path(argv[1]) / (k.report.name + ".ptx")) << k.ptx;
      std::printf("%s: %zu bytes of PTX for %s\n", k.report.name.c_str(), k.ptx.size(), k.report.arch.c_str());
    }
    return 0;
  } catch (const std::exception& e) {  // twell::Error, and filesystem errors of the host code
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
