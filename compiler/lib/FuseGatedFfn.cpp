// twell-fuse-gated-ffn: gate_matmul + gated_down on the same x -> gated_ffn.
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/PatternMatch.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/compiler/Passes.h"

namespace mlir::twell {

#define GEN_PASS_DEF_TWELLFUSEGATEDFFN
#include "twell/compiler/Passes.h.inc"

namespace {

// The gate kernel a consumer (twell.gated_down or twell.down) fuses with: the producer of its H, on
// the same x, when no other op reads H (the fused op never materializes it); else null.
template <class ConsumerOp>
GateMatmulOp fusableGate(ConsumerOp down) {
  auto gate = down.getH().template getDefiningOp<GateMatmulOp>();
  if (!gate || !gate.getH().hasOneUse() || gate.getX() != down.getX()) return GateMatmulOp();
  return gate;
}

LogicalResult fuse(GatedDownOp down, RewriterBase& rewriter) {
  GateMatmulOp gate = fusableGate(down);
  if (!gate) return failure();
  rewriter.setInsertionPoint(down);
  rewriter.replaceOpWithNewOp<GatedFfnOp>(down, down.getY().getType(), down.getX(), gate.getWGate(),
                                          down.getWUp(), down.getWDown(), gate.getLayout(),
                                          down.getDownLayoutAttr());
  rewriter.eraseOp(gate);
  return success();
}

LogicalResult fuse(DownOp down, RewriterBase& rewriter) {
  GateMatmulOp gate = fusableGate(down);
  if (!gate) return failure();
  rewriter.setInsertionPoint(down);
  rewriter.replaceOpWithNewOp<FfnOp>(down, down.getY().getType(), down.getX(), gate.getWGate(), down.getWDown(),
                                     gate.getLayout(), down.getDownLayoutAttr());
  rewriter.eraseOp(gate);
  return success();
}

struct TwellFuseGatedFfn : impl::TwellFuseGatedFfnBase<TwellFuseGatedFfn> {
  void runOnOperation() override {
    llvm::SmallVector<Operation*> candidates;
    getOperation().walk([&](Operation* op) {
      if (llvm::isa<GatedDownOp, DownOp>(op)) candidates.push_back(op);
    });
    IRRewriter rewriter(&getContext());
    for (Operation* op : candidates) {
      if (auto gated = llvm::dyn_cast<GatedDownOp>(op)) (void)fuse(gated, rewriter);
      else (void)fuse(llvm::cast<DownOp>(op), rewriter);
    }
  }
};

}  // namespace
}  // namespace mlir::twell
