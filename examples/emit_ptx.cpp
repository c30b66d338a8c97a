// Ahead-of-time: generate the TwELL kernels of a model shape and write their CUDA C++ and PTX
// (no GPU needed). `twellc emit` does the same from the command line; `twellc compile` writes a
// bundle that a program linking twell::runtime alone can load.
//   ./build/bin/emit_ptx OUT_DIR [d_model d_ff]
// Every write is checked: a directory that cannot be created or written, or a full disk, is an error
// (exit 1) naming the file, never a silent success with missing or empty files.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "twell/compiler/Generate.h"
#include "twell/context.h"
#include "twell/error.h"

namespace {
// Writes `text` to `path` through a temporary file renamed into place; throws naming the file.
void write_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw std::runtime_error("writing " + path.string() + " failed: " + std::strerror(errno));
  }
  std::error_code ec;
  if (std::filesystem::file_size(tmp, ec) != text.size() || ec)
    throw std::runtime_error("writing " + path.string() + " failed: " + (ec ? ec.message() : "short write"));
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("writing " + path.string() + " failed: " + ec.message());
}
}  // namespace

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
    options.device = twell::ContextOptions::kNoDevice;  // compile only
    twell::Context ctx(options);
    const std::filesystem::path out = argv[1];
    std::filesystem::create_directories(out);  // throws filesystem_error naming the directory
    write_file(out / "ffn.mlir", generated.ir);
    for (const auto& k : ctx.compile(generated)) {
      write_file(out / (k.report.name + ".cu"), k.cuda_source);
      write_file(out / (k.report.name + ".ptx"), k.ptx);
      std::printf("%s: %zu bytes of PTX for %s\n", k.report.name.c_str(), k.ptx.size(), k.report.arch.c_str());
    }
    return 0;
  } catch (const std::exception& e) {  // twell::Error, and filesystem errors of the host code
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
