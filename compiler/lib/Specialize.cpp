// twell-specialize: every kernel op becomes fully explicit and gets its identity, `kernel_name`.
#include "KernelInstance.h"
#include "TrainingOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/compiler/Passes.h"

namespace mlir::twell {

#define GEN_PASS_DEF_TWELLSPECIALIZE
#include "twell/compiler/Passes.h.inc"

namespace {

struct TwellSpecialize : impl::TwellSpecializeBase<TwellSpecialize> {
  void runOnOperation() override {
    bool failedAny = false;
    getOperation().walk([&](Operation* op) {
      // The training ops' configuration is their contract's: the spec they describe names them.
      if (llvm::isa<TrainRowBackwardOp, TrainWeightGradOp>(op)) {
        if (!op->getAttr("target")) {
          op->emitOpError() << "twell-specialize: expected a target (twell-select-config sets it)";
          failedAny = true;
          return;
        }
        op->setAttr("kernel_name", StringAttr::get(&getContext(), ::twell::compiler::trainingOpKernelName(op)));
        return;
      }
      if (!llvm::isa<GateMatmulOp, GatedDownOp, DownOp, GatedFfnOp, FfnOp>(op)) return;
      FailureOr<KernelInstance> kernel = KernelInstance::read(op);
      if (failed(kernel)) {
        failedAny = true;
        return;
      }
      auto name = StringAttr::get(&getContext(), kernel->name());
      op->setAttr("kernel_name", name);  // the kernel ops' kernel_name attribute
    });
    if (failedAny) signalPassFailure();
  }
};

}  // namespace
}  // namespace mlir::twell
