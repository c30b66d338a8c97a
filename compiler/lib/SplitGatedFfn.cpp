// twell-split-gated-ffn: gated_ffn -> gate_matmul (TwELL epilogue) + gated_down, the two kernels
// the runtime launches.
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/PatternMatch.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/compiler/Passes.h"

namespace mlir::twell {

#define GEN_PASS_DEF_TWELLSPLITGATEDFFN
#include "twell/compiler/Passes.h.inc"

namespace {

// The gate kernel of a layer op (twell.gated_ffn or twell.ffn), inserted before it: H in the layer's
// TwELL layout.
template <class LayerOp>
GateMatmulOp createGate(LayerOp ffn, RewriterBase& rewriter) {
  auto xType = llvm::cast<RankedTensorType>(ffn.getX().getType());
  int64_t dFF = llvm::cast<RankedTensorType>(ffn.getWGate().getType()).getDimSize(0);
  auto hType =
      RankedTensorType::get({xType.getDimSize(0), dFF}, xType.getElementType(), ffn.getLayout());
  rewriter.setInsertionPoint(ffn);
  return GateMatmulOp::create(rewriter, ffn.getLoc(), hType, ffn.getX(), ffn.getWGate(), TargetAttr(),
                              ConfigAttr(), StringAttr());
}

void split(GatedFfnOp ffn, RewriterBase& rewriter) {
  GateMatmulOp gate = createGate(ffn, rewriter);
  rewriter.replaceOpWithNewOp<GatedDownOp>(ffn, ffn.getY().getType(), ffn.getX(), gate.getH(),
                                           ffn.getWUp(), ffn.getWDown(), ffn.getDownLayoutAttr(),
                                           TargetAttr(), ConfigAttr(), StringAttr(), DownLayoutAttr());
}

// The non-gated layer: the same gate kernel feeding twell.down.
void split(FfnOp ffn, RewriterBase& rewriter) {
  GateMatmulOp gate = createGate(ffn, rewriter);
  rewriter.replaceOpWithNewOp<DownOp>(ffn, ffn.getY().getType(), ffn.getX(), gate.getH(), ffn.getWDown(),
                                      ffn.getDownLayoutAttr(), TargetAttr(), ConfigAttr(), StringAttr(), DownLayoutAttr());
}

struct TwellSplitGatedFfn : impl::TwellSplitGatedFfnBase<TwellSplitGatedFfn> {
  void runOnOperation() override {
    llvm::SmallVector<Operation*> ffns;
    getOperation().walk([&](Operation* op) {
      if (llvm::isa<GatedFfnOp, FfnOp>(op)) ffns.push_back(op);
    });
    IRRewriter rewriter(&getContext());
    for (Operation* op : ffns) {
      if (auto gated = llvm::dyn_cast<GatedFfnOp>(op)) split(gated, rewriter);
      else split(llvm::cast<FfnOp>(op), rewriter);
    }
  }
};

}  // namespace
}  // namespace mlir::twell
