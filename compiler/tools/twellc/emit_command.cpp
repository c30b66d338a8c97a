// `twellc emit`: ahead-of-time output of the pipeline: the twell IR after the passes, the CUDA C++
// of each kernel, or its PTX (NVRTC; no GPU needed).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "commands.h"
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

twell::Target parse_target(const std::string& s) {
  // sm_<major><minor>[a]; the generator then checks that NVRTC can build for it.
  const bool a = !s.empty() && s.back() == 'a';
  const std::string digits = s.substr(0, s.size() - (a ? 1 : 0));
  if (digits.rfind("sm_", 0) != 0 || digits.size() < 5 || digits.size() > 6 || digits[3] == '0' ||
      digits.find_first_not_of("0123456789", 3) != std::string::npos)
    throw std::invalid_argument(fmt::format("--target: expected sm_XY or sm_XYa (e.g. sm_90a), got '{}'", s));
  const int sm = std::stoi(digits.substr(3));
  if (sm < 80) throw std::invalid_argument(fmt::format("--target: twell needs sm_80 or newer (bf16 cvt), got '{}'", s));
  return twell::Target{sm, a};
}

const std::vector<std::string> kShapeOptions = {"d-model", "d-ff",  "tile-n",      "slots",    "threshold",
                                                "activation", "dtype", "down-layout", "non-gated", "consumer",
                                                "cluster-m"};

}  // namespace

int emit_command(const std::vector<std::string>& argv) {
  try {
    const Args args = parse_args(argv, {"help", "non-gated"},
                                 {"emit", "target", "out", "d-model", "d-ff", "tile-n", "slots", "threshold", "activation",
                                  "dtype", "down-layout", "consumer", "cluster-m"});
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
      std::ifstream in(args.positional[0]);
      if (!in)
        throw twell::Error(twell::ErrorCode::NotFound, fmt::format("FILE.mlir: cannot open '{}': {}", args.positional[0],
                                                                   std::strerror(errno)));
      std::stringstream text;
      text << in.rdbuf();
      gen = twell::compiler::generateFromMlir(text.str(), args.positional[0], target);
    } else if (args.positional.empty()) {
      if (!args.has("d-model") || !args.has("d-ff"))
        throw std::invalid_argument(
            !args.has("d-model") && !args.has("d-ff")
                ? std::string("expected FILE.mlir or --d-model D --d-ff F, got neither")
                : fmt::format("--{}: expected it beside --{} (a shape needs both d_model and d_ff), got only --{}",
                              args.has("d-model") ? "d-ff" : "d-model", args.has("d-model") ? "d-model" : "d-ff",
                              args.has("d-model") ? "d-model" : "d-ff"));
      twell::FfnSpec spec;
      spec.d_model = args.get_int("d-model", 0, 1, 65536);
      spec.d_ff = args.get_int("d-ff", 0, 1, int64_t{1} << 24);
      const double threshold = args.get_double("threshold", 0.0);
      spec.threshold = static_cast<float>(threshold);
      if (!std::isfinite(spec.threshold))
        throw std::invalid_argument(fmt::format("--threshold: expected a finite f32 (|t| <= 3.4e38), got {}", threshold));
      // The layout's rules (#twell.layout's verifier), checked here so that the errors name the options.
      if (args.has("tile-n")) {
        spec.tile_n = static_cast<int>(args.get_int("tile-n", 256, 32, 1024));
        if ((*spec.tile_n & (*spec.tile_n - 1)) != 0)
          throw std::invalid_argument(fmt::format("--tile-n: expected a power of two in 32..1024, got {}", *spec.tile_n));
      }
      if (args.has("slots")) {
        const int tile_n = spec.tile_n.value_or(256);
        spec.slots = static_cast<int>(args.get_int("slots", 31, 1, 1024));
        if (*spec.slots > tile_n)
          throw std::invalid_argument(fmt::format("--slots: expected 1..tile_n ({}), got {}", tile_n, *spec.slots));
      }
      const std::string act = args.get("activation", "relu"), dtype = args.get("dtype", "bf16"), down = args.get("down-layout", "out_in");
      if (act != "relu" && act != "silu") throw std::invalid_argument(fmt::format("--activation: expected relu or silu, got '{}'", act));
      if (dtype != "bf16" && dtype != "f16") throw std::invalid_argument(fmt::format("--dtype: expected bf16 or f16, got '{}'", dtype));
      if (down != "out_in" && down != "in_out")
        throw std::invalid_argument(fmt::format("--down-layout: expected out_in or in_out, got '{}'", down));
      spec.activation = act == "relu" ? twell::Activation::ReLU : twell::Activation::SiLU;
      if (act == "silu" && !(spec.threshold > 0.0f))
        throw std::invalid_argument(fmt::format(
            "--threshold: expected a value > 0 with --activation silu (a neuron is active iff |silu(g)| > threshold), got {}",
            spec.threshold));
      spec.dtype = dtype == "bf16" ? twell::DType::BF16 : twell::DType::FP16;
      spec.down_layout = down == "out_in" ? twell::WeightLayout::OutIn : twell::WeightLayout::InOut;
      spec.gated = !args.has("non-gated");
      if (args.has("consumer")) {
        const std::string consumer = args.get("consumer");
        if (consumer != "rows" && consumer != "block")
          throw std::invalid_argument(fmt::format("--consumer: expected rows or block, got '{}'", consumer));
        spec.consumer = consumer == "rows" ? twell::ConsumerVariant::RowGather : twell::ConsumerVariant::TokenBlock;
      }
      if (args.has("cluster-m")) spec.gate_cluster_m = static_cast<int>(args.get_int("cluster-m", 2, 1, 2));
      gen = twell::compiler::generateFfn(spec, target);
      if (spec.consumer == twell::ConsumerVariant::TokenBlock)
        for (const auto& k : gen.kernels)
          if (k.kind == twell::compiler::KernelKind::GatedDown && k.cta_m != 16)
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
