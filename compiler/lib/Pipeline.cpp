// The kernel pipeline (split -> select-config -> specialize) and the registration for drivers.
#include <mutex>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassRegistry.h"
#include "twell/Dialect/TwellDialect.h"
#include "twell/compiler/Passes.h"
#include "twell/compiler/Registration.h"

namespace mlir::twell {

void buildTwellKernelPipeline(OpPassManager& pm, llvm::StringRef arch, llvm::StringRef consumer, int64_t clusterM,
                              llvm::StringRef decode) {
  // Nest explicitly: a func-anchored pass added to a module-anchored manager would not run on funcs
  // (BUILD_NOTES.md).
  OpPassManager& funcPm = pm.nest<func::FuncOp>();
  funcPm.addPass(createTwellSplitGatedFfn());
  TwellSelectConfigOptions options;
  options.target = arch.str();
  options.consumer = consumer.str();
  options.clusterM = clusterM;
  options.decode = decode.str();
  funcPm.addPass(createTwellSelectConfig(options));
  funcPm.addPass(createTwellSpecialize());
}

namespace {

struct KernelPipelineOptions : PassPipelineOptions<KernelPipelineOptions> {
  Option<std::string> target{*this, "target",
                             llvm::cl::desc("GPU architecture, sm_<major><minor>[a]"),
                             llvm::cl::init("sm_90a")};
  Option<std::string> consumer{*this, "consumer", llvm::cl::desc("gated consumer variant: rows or block"),
                               llvm::cl::init("rows")};
  Option<int64_t> clusterM{*this, "cluster-m",
                           llvm::cl::desc("the wgmma gate's CTAs per cluster: 1 or 2 (0: the heuristic's)"),
                           llvm::cl::init(0)};
  Option<std::string> decode{*this, "decode",
                             llvm::cl::desc("the decode kernels' w_down layout: auto, out_in, in_out or none"),
                             llvm::cl::init("auto")};
};

}  // namespace

void registerTwellDialectsAndPasses(DialectRegistry& registry) {
  registry.insert<TwellDialect, func::FuncDialect>();
  static std::once_flag once;
  std::call_once(once, [] {
    registerTwellPasses();
    PassPipelineRegistration<KernelPipelineOptions>(
        "twell-kernel-pipeline",
        "Split every twell.gated_ffn into kernels, select their configuration and specialize them",
        [](OpPassManager& pm, const KernelPipelineOptions& options) {
          buildTwellKernelPipeline(pm, options.target, options.consumer, options.clusterM, options.decode);
        });
  });
}

}  // namespace mlir::twell
