// The training ops' spec and kernel name (TrainingOps.h).
#include "TrainingOps.h"

#include "EmitTraining.h"
#include "llvm/Support/Casting.h"
#include "mlir/IR/BuiltinTypes.h"
#include "twell/Dialect/TwellOps.h"

namespace twell::compiler {
namespace tw = mlir::twell;

FfnSpec trainingOpSpec(mlir::Operation* op) {
  auto read = [](mlir::Value x, tw::LayoutAttr layout, int64_t d_ff, bool gated) {
    FfnSpec s;
    s.d_model = llvm::cast<mlir::RankedTensorType>(x.getType()).getDimSize(1);
    s.d_ff = d_ff;
    s.gated = gated;
    s.activation = layout.getActivation() == tw::Activation::ReLU ? Activation::ReLU : Activation::SiLU;
    s.threshold = layout.getThresholdValue();
    s.dtype = layout.getValue().isBF16() ? DType::BF16 : DType::FP16;
    s.down_layout = WeightLayout::InOut;
    s.tile_n = static_cast<int>(layout.getTileN());
    s.slots = static_cast<int>(layout.getSlots());
    return s;
  };
  auto dFF = [](mlir::Value h) { return llvm::cast<mlir::RankedTensorType>(h.getType()).getDimSize(1); };
  if (auto row = llvm::dyn_cast<tw::TrainRowBackwardOp>(op))
    return read(row.getX(), row.getLayout(), dFF(row.getH()), static_cast<bool>(row.getWUp()));
  auto weight = llvm::cast<tw::TrainWeightGradOp>(op);
  return read(weight.getX(), weight.getLayout(), dFF(weight.getH()), static_cast<bool>(weight.getDu()));
}

std::string trainingOpKernelName(mlir::Operation* op) {
  return llvm::isa<tw::TrainRowBackwardOp>(op) ? trainRowBackwardName(trainingOpSpec(op))
                                                : trainWeightGradName(trainingOpSpec(op));
}

}  // namespace twell::compiler
