// `twellc emit`: ahead-of-time output of the pipeline: the twell IR after the passes, the CUDA C++
// of each kernel, or its PTX (NVRTC; no GPU needed).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "commands.h"
#include "mlir_input.h"
#include "twell/compiler/Generate.h"
#include "twell/context.h"
#include "twell/error.h"

namespace twellc {
namespace {

const char* kEmitHelp =
    "usage: twellc emit FILE.mlir [options]              from a twell dialect file\n"
    "       twellc emit --d-model D --d-ff F [options]   from a shape\n"
    "  --emit mlir|cuda|ptx   what to write (default ptx)\n"
    "  --target ARCH          sm_90a (default), sm_90, sm_80, ...\n"
    "  --out DIR              write one file per kernel into DIR (default: stdout)\n"
    "  shape options: --tile-n T --slots S --threshold t --activation relu|silu --dtype bf16|f16\n"
    "                 --down-layout out_in|in_out\n"
    "                 --non-gated   y = act(x Wg^T) Wd^T (twell.ffn: no up projection)\n"
    "                 --consumer rows|block   the consumer variant (block: the token block, gated, in_out)\n"
    "                 --cluster-m 1|2   CTAs per cluster of the sm_90a gate (TMA multicast of w_gate; default 2)\n"
    "  silu needs --threshold > 0. Besides the gate and the consumer, the decode kernels for calls of at\n"
    "  most 64 tokens (twell_decode_*) where the shape and target allow them; a note on stderr says when not.\n";

}  // namespace

int emit_command(const std::vector<std::string>& argv) {
  try {
    std::vector<std::string> valued{"emit", "target", "out"};
    valued.insert(valued.end(), kShapeValueOptions.begin(), kShapeValueOptions.end());
    const Args args = parse_args(argv, {"help", "non-gated"}, valued);
    if (args.has("help")) {
      std::fputs(kEmitHelp, stdout);
      return 0;
    }
    const std::string what = args.get("emit", "ptx");
    if (what != "mlir" && what != "cuda" && what != "ptx")
      throw std::invalid_argument(fmt::format("--emit: expected mlir, cuda or ptx, got '{}'", what));
    const twell::Target target = parse_target(args.get("target", "sm_90a"));
    twell::compiler::GeneratedFfn gen;
    if (args.positional.size() == 1) {
      for (const auto& o : kShapeOptions)
        if (args.has(o))
          throw std::invalid_argument(fmt::format("--{}: shape options describe an FFN without a .mlir file; the file '{}' already "
                                                  "describes one", o, args.positional[0]));
      gen = twell::compiler::generateFromMlir(read_mlir_file(args.positional[0]), args.positional[0], target);
    } else if (args.positional.empty()) {
      const twell::FfnSpec spec = spec_from_args(args);
      gen = twell::compiler::generateFfn(spec, target);
      if (spec.consumer == twell::ConsumerVariant::TokenBlock)
        for (const auto& k : gen.kernels)
          if (k.kind == twell::compiler::KernelKind::GatedDown && k.consumer != twell::kernels::ConsumerKind::TokenBlock)
            std::fprintf(stderr, "twellc emit: note: --consumer block needs --down-layout in_out, d_model 128, 256, 512, 1024 "
                                 "or 2048 and tile_n <= 256; emitted the row consumer %s instead\n", k.name.c_str());
    } else {
      throw std::invalid_argument(fmt::format("expected at most one FILE.mlir, got {}", args.positional.size()));
    }

    if (gen.decode.empty())
      std::fprintf(stderr, "twellc emit: note: no decode kernels for this layer: they need a tensor-core gate (d_model %% 8 "
                           "== 0), d_ff <= 65536, tile_n >= 32, the row consumer and a target with more than 99 KiB of shared "
                           "memory per CTA\n");
    const std::string out_dir = args.get("out");
    auto write = [&](const std::string& name, const std::string& text) {
      if (out_dir.empty()) {
        std::printf("%s\n", text.c_str());
        return;
      }
      std::error_code ec;
      std::filesystem::create_directories(out_dir, ec);
      if (ec || !std::filesystem::is_directory(out_dir))
        throw twell::Error(twell::ErrorCode::InvalidArgument,
                           fmt::format("--out: expected a directory that can be created, got '{}' ({})", out_dir,
                                       ec ? ec.message() : "not a directory"));
      // Written beside the target and renamed into place: a failed write leaves no partial file.
      const auto path = std::filesystem::path(out_dir) / name;
      const auto tmp = std::filesystem::path(out_dir) / ("." + name + ".tmp");
      {
        std::ofstream f(tmp, std::ios::binary);
        f << text;
        f.close();
        if (!f) {
          const std::string why = std::strerror(errno);
          std::filesystem::remove(tmp, ec);
          throw twell::Error(twell::ErrorCode::InvalidArgument, fmt::format("--out: writing '{}' failed: {}", path.string(), why));
        }
      }
      std::filesystem::rename(tmp, path, ec);
      if (ec) throw twell::Error(twell::ErrorCode::InvalidArgument, fmt::format("--out: cannot create '{}': {}", path.string(), ec.message()));
      std::fprintf(stderr, "wrote %s (%zu bytes)\n", path.c_str(), text.size());
    };
    if (what == "mlir") {
      write("ffn.mlir", gen.ir);
    } else if (what == "cuda") {
      for (const auto& k : gen.kernels) write(k.name + ".cu", k.source);
      for (const auto& k : gen.decode) write(k.name + ".cu", k.source);
    } else {
      twell::ContextOptions options;
      options.target = target;
      options.device = twell::ContextOptions::kNoDevice;  // compile only, for any target
      twell::Context ctx(options);
      for (const auto& k : ctx.compile(gen)) {
        std::fprintf(stderr, "%s: %s, cache %s, NVRTC %.1f ms, PTX %zu bytes\n", k.report.name.c_str(), k.report.arch.c_str(),
                     k.report.cache.c_str(), k.report.compile_ms, k.ptx.size());
        write(k.report.name + ".ptx", k.ptx);
      }
    }
    return 0;
  } catch (const twell::Error& e) {
    std::fprintf(stderr, "twellc emit: error: %s\n", e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "twellc emit: %s\n%s", e.what(), kEmitHelp);
    return 2;
  }
}

}  // namespace twellc
