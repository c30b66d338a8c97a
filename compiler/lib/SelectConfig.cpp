// twell-select-config: attaches #twell.target and #twell.config to each kernel op that lacks them.
// A heuristic for now; the tuning database (runtime/) will supply measured configurations.
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "twell/Dialect/KernelConstraints.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/compiler/Passes.h"

namespace mlir::twell {

#define GEN_PASS_DEF_TWELLSELECTCONFIG
#include "twell/compiler/Passes.h.inc"

namespace {

// The issue-2 kernels are plain tiled ones (KernelConstraints.h): the gate kernel's CTA computes
// cta_m x tile_n = 16384 outputs on 256 threads, stepping K by 16 (by less where its operands would not
// fit 48 KiB of static shared memory: tile_n = 1024); the consumer handles one token row per CTA.
constexpr int64_t kGateCtaK = 16;
constexpr int64_t kThreads = 256;

ConfigAttr gateConfig(MLIRContext* context, LayoutAttr layout) {
  using Gate = GateKernelConstraints;
  int64_t tileN = layout.getTileN();
  int64_t ctaM = Gate::kTileElements / tileN;
  int64_t ctaK = kGateCtaK;
  while (ctaK > 1 && Gate::staticSharedBytes(ctaM, ctaK, tileN) > Gate::kMaxStaticSharedBytes)
    ctaK /= 2;
  return ConfigAttr::get(context, ctaM, ctaK, Gate::kThreads);
}

ConfigAttr gatedDownConfig(MLIRContext* context) {
  return ConfigAttr::get(context, GatedDownKernelConstraints::kCtaM, /*cta_k=*/0, kThreads);
}

struct TwellSelectConfig : impl::TwellSelectConfigBase<TwellSelectConfig> {
  using Base::Base;

  void runOnOperation() override {
    MLIRContext* context = &getContext();
    std::string arch = target;
    auto emitError = [&] { return getOperation().emitError() << "twell-select-config: target: "; };
    TargetAttr defaultTarget = TargetAttr::getChecked(
        llvm::function_ref<InFlightDiagnostic()>(emitError), context, llvm::StringRef(arch),
        llvm::ArrayRef<Feature>(TargetAttr::defaultFeatures(arch)));
    if (!defaultTarget) return signalPassFailure();

    getOperation().walk([&](Operation* op) {
      if (auto gate = llvm::dyn_cast<GateMatmulOp>(op)) {
        if (!gate.getTargetAttr()) gate.setTargetAttr(defaultTarget);
        if (!gate.getConfigAttr()) gate.setConfigAttr(gateConfig(context, gate.getLayout()));
      } else if (auto down = llvm::dyn_cast<GatedDownOp>(op)) {
        if (!down.getTargetAttr()) down.setTargetAttr(defaultTarget);
        if (!down.getConfigAttr()) down.setConfigAttr(gatedDownConfig(context));
      }
    });
  }
};

}  // namespace
}  // namespace mlir::twell
