// The kernel pipeline (split -> select-config -> specialize) and the registration for drivers.
#include <mutex>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassRegistry.h"
#include "twell/Dialect/TwellDialect.h"
#include "twell/compiler/Passes.h"
#include "twell/compiler/Registration.h"

namespace mlir::twell {

void buildTwellKernelPipeline(OpPassManager& pm, const TwellSelectConfigOptions& options) {
  // Nest explicitly: a func-anchored pass added to a module-anchored manager would not run on funcs
  // (BUILD_NOTES.md).
  OpPassManager& funcPm = pm.nest<func::FuncOp>();
  funcPm.addPass(createTwellSplitGatedFfn());
  funcPm.addPass(createTwellSelectConfig(options));
  funcPm.addPass(createTwellSpecialize());
}

void registerTwellDialectsAndPasses(DialectRegistry& registry) {
  registry.insert<TwellDialect, func::FuncDialect>();
  static std::once_flag once;
  std::call_once(once, [] {
    registerTwellPasses();
    // The pipeline's options are twell-select-config's, parsed by that pass (declared once, in
    // Passes.td): `-twell-kernel-pipeline="target=sm_80 consumer=block"`.
    registerPassPipeline(
        "twell-kernel-pipeline",
        "Split every twell.gated_ffn into kernels, select their configuration and specialize them (options: "
        "twell-select-config's)",
        [](OpPassManager& pm, llvm::StringRef options, llvm::function_ref<LogicalResult(const llvm::Twine&)> errorHandler) {
          std::unique_ptr<Pass> select = createTwellSelectConfig();
          if (failed(select->initializeOptions(options, errorHandler))) return failure();
          OpPassManager& funcPm = pm.nest<func::FuncOp>();
          funcPm.addPass(createTwellSplitGatedFfn());
          funcPm.addPass(std::move(select));
          funcPm.addPass(createTwellSpecialize());
          return success();
        },
        [](llvm::function_ref<void(const mlir::detail::PassOptions&)>) {});
  });
}

}  // namespace mlir::twell
