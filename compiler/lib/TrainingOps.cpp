// The training ops' spec and kernel name (TrainingOps.h).
#include "TrainingOps.h"

#include "EmitTraining.h"
#include "llvm/Support/Casting.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/BuiltinTypes.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/error.h"

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

kernels::KernelSource emitTrainingOp(mlir::Operation* op) {
  auto target = op->getAttrOfType<tw::TargetAttr>("target");
  const auto name = op->getAttrOfType<mlir::StringAttr>("kernel_name");
  if (!target || !name)
    throw Error(ErrorCode::InvalidArgument, op->getName().getStringRef().str() +
                                                ": expected a specialized op (target and kernel_name: run the kernel pipeline first)");
  const Target t{target.getComputeCapability(), target.getArch().ends_with("a")};
  const FfnSpec spec = trainingOpSpec(op);
  kernels::KernelSource k =
      llvm::isa<tw::TrainRowBackwardOp>(op) ? emitTrainRowBackward(spec, t) : emitTrainWeightGrad(spec, t);
  if (name.getValue() != k.name)
    throw Error(ErrorCode::Compile, op->getName().getStringRef().str() + ": kernel_name " + name.getValue().str() +
                                        ", but the emitter's kernel is " + k.name + " (a twell bug)");
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os);
  k.source = "// " + text + "\n" + k.source;
  return k;
}

}  // namespace twell::compiler
