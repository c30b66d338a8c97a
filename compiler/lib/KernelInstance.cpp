#include "KernelInstance.h"

#include <climits>

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/xxhash.h"
#include "twell/kernels/constraints.h"

namespace mlir::twell {

// The kernels' contracts (kernels/include/twell/kernels/constraints.h).
using namespace ::twell::kernels;

FailureOr<KernelInstance> KernelInstance::read(Operation* op) {
  KernelInstance kernel{};
  kernel.op = op;
  kernel.downLayout = DownLayout::OutIn;
  kernel.gated = true;
  if (auto gate = llvm::dyn_cast<GateMatmulOp>(op)) {
    kernel.kind = ::twell::compiler::KernelKind::GateTwell;
    kernel.layout = gate.getLayout();
    kernel.target = gate.getTargetAttr();
    kernel.config = gate.getConfigAttr();
  } else if (auto down = llvm::dyn_cast<GatedDownOp>(op)) {
    kernel.kind = ::twell::compiler::KernelKind::GatedDown;
    kernel.layout = down.getLayout();
    kernel.target = down.getTargetAttr();
    kernel.config = down.getConfigAttr();
    kernel.downLayout = down.getDownLayout();
  } else if (auto down = llvm::dyn_cast<DownOp>(op)) {
    kernel.kind = ::twell::compiler::KernelKind::GatedDown;
    kernel.layout = down.getLayout();
    kernel.target = down.getTargetAttr();
    kernel.config = down.getConfigAttr();
    kernel.downLayout = down.getDownLayout();
    kernel.gated = false;
  } else if (llvm::isa<GatedFfnOp, FfnOp>(op)) {
    return op->emitOpError() << "is not a kernel: split it into twell.gate_matmul and "
                             << (llvm::isa<GatedFfnOp>(op) ? "twell.gated_down" : "twell.down")
                             << " first (twell-split-gated-ffn)";
  } else {
    return op->emitOpError() << "is not a twell kernel op";
  }
  // The verifier guarantees rank-2 operands with static d_model (x) and d_ff (the TwELL tensor h).
  kernel.dModel = llvm::cast<RankedTensorType>(op->getOperand(0).getType()).getDimSize(1);
  kernel.dFF = llvm::cast<RankedTensorType>(kernel.kind == ::twell::compiler::KernelKind::GateTwell
                                                ? op->getResult(0).getType()
                                                : op->getOperand(1).getType())
                   .getDimSize(1);
  if (!kernel.target)
    return op->emitOpError() << "has no target: attach one with twell-select-config";
  if (!kernel.config)
    return op->emitOpError() << "has no config: attach one with twell-select-config";
  if (kernel.dModel > INT_MAX || kernel.dFF > INT_MAX)
    return op->emitOpError() << "d_model = " << kernel.dModel << " and d_ff = " << kernel.dFF
                             << " must fit the kernels' int constants (at most " << INT_MAX << ")";
  kernel.gateMainloop = kernel.config.getMainloop();
  if (kernel.kind == ::twell::compiler::KernelKind::GateTwell) {
    kernel.gateCtaK = kernel.config.getCtaK();
    return kernel;
  }
  // The consumer's overflow recompute repeats the gate kernel's arithmetic: it must know the main
  // loop (and K step) of the kernel that produced h.
  kernel.gateCtaK = kernel.gateMainloop == Mainloop::Wgmma     ? WgmmaGateConstraints::ctaKFor(kernel.dModel)
                    : kernel.gateMainloop == Mainloop::MmaSync ? MmaSyncGateConstraints::kCtaK
                                                               : GateKernelConstraints::defaultCtaK(kernel.layout.getTileN());
  auto gate = op->getOperand(1).getDefiningOp<GateMatmulOp>();  // h: operand 1 of both consumers
  if (ConfigAttr gateConfig = gate ? gate.getConfigAttr() : ConfigAttr()) {
    if (gateConfig.getMainloop() != kernel.gateMainloop)
      return op->emitOpError()
             << "config: mainloop " << stringifyMainloop(kernel.gateMainloop)
             << " differs from mainloop " << stringifyMainloop(gateConfig.getMainloop())
             << " of the twell.gate_matmul producing h: the consumer's overflow recompute must "
                "repeat the gate kernel's arithmetic, give both the same mainloop";
    kernel.gateCtaK = gateConfig.getCtaK();
  }
  return kernel;
}

bool KernelInstance::isTokenBlock() const {
  return kind == ::twell::compiler::KernelKind::GatedDown && config.getConsumer() == ConsumerVariant::TokenBlock;
}

bool KernelInstance::isWarpRowConsumer() const {
  return kind == ::twell::compiler::KernelKind::GatedDown && config.getConsumer() == ConsumerVariant::WarpRow;
}

int64_t KernelInstance::dynamicSharedBytes() const {
  if (kind == ::twell::compiler::KernelKind::GatedDown)
    return isTokenBlock()        ? GatedDownKernelConstraints::blockSharedBytes(dModel, dFF, layout.getTileN(),
                                                                                config.getStages())
           : isWarpRowConsumer() ? GatedDownKernelConstraints::warpRowSharedBytes(dModel)
                                 : 0;
  if (kind != ::twell::compiler::KernelKind::GateTwell) return 0;
  if (config.getMainloop() == Mainloop::Wgmma)
    return WgmmaGateConstraints::sharedBytes(layout.getTileN(), config.getCtaK(), config.getStages());
  if (config.getMainloop() != Mainloop::MmaSync) return 0;
  return MmaSyncGateConstraints::sharedBytes(config.getCtaM(), layout.getTileN(), config.getStages());
}

int64_t KernelInstance::operandAlignment() const {
  if (gateMainloop == Mainloop::Fma) return 1;
  if (isTokenBlock()) return GatedDownKernelConstraints::kBlockOperandAlignment;
  if (isWarpRowConsumer()) return GatedDownKernelConstraints::kWarpRowOperandAlignment;
  if (kind == ::twell::compiler::KernelKind::GateTwell && gateMainloop == Mainloop::Wgmma)
    return WgmmaGateConstraints::kOperandAlignment;
  return kind == ::twell::compiler::KernelKind::GateTwell
             ? MmaSyncGateConstraints::kOperandAlignment
             : GatedDownKernelConstraints::kOperandAlignmentAfterMmaSync;
}

const char* KernelInstance::templateName() const {
  return kind == ::twell::compiler::KernelKind::GateTwell ? "gate_twell" : "gated_down";
}

int64_t KernelInstance::gridY() const {
  return kind == ::twell::compiler::KernelKind::GateTwell ? layout.getNumTiles(dFF) : 1;
}

std::string KernelInstance::key() const {
  llvm::SmallVector<Feature> features(target.getFeatures());
  llvm::sort(features);
  std::string featureList = llvm::join(
      llvm::map_range(features, [](Feature f) { return stringifyFeature(f).str(); }), ",");
  uint32_t thresholdBits =
      static_cast<uint32_t>(layout.getThreshold().bitcastToAPInt().getZExtValue());
  return llvm::formatv(
      "kernel={0};value={1};d_model={2};d_ff={3};tile_n={4};slots={5};index_bits={6};"
      "activation={7};threshold={8:x-8};cta_m={9};cta_k={10};threads={11};down_layout={12};"
      "arch={13};features={14};mainloop={15};stages={16};gate_mainloop={17};gate_cta_k={18}{19}{20}",
      templateName(), isBF16() ? "bf16" : "f16", dModel, dFF, layout.getTileN(), layout.getSlots(),
      layout.getIndexBits(), stringifyActivation(layout.getActivation()), thresholdBits,
      config.getCtaM(), config.getCtaK(), config.getThreads(), stringifyDownLayout(downLayout),
      target.getArch(), featureList, stringifyMainloop(config.getMainloop()), config.getStages(),
      stringifyMainloop(gateMainloop), gateCtaK, gated ? "" : ";gated=false",  // gated keys as before v15
      config.getClusterM() == 1 ? std::string() : llvm::formatv(";cluster_m={0}", config.getClusterM()).str());
}

std::string KernelInstance::name() const {
  std::string prefix =
      kind == ::twell::compiler::KernelKind::GateTwell ? "twell_gate" : gated ? "twell_gated_down" : "twell_down";
  std::string suffix = kind == ::twell::compiler::KernelKind::GatedDown
                           ? (llvm::Twine("_") + stringifyDownLayout(downLayout)).str()
                           : std::string();
  auto hash = static_cast<uint32_t>(llvm::xxh3_64bits(key()));
  return llvm::formatv("{0}_k{1}_n{2}_t{3}_s{4}_{5}_{6}{7}_{8:x-8}", prefix, dModel, dFF,
                       layout.getTileN(), layout.getSlots(),
                       stringifyActivation(layout.getActivation()), isBF16() ? "bf16" : "f16",
                       suffix, hash)
      .str();
}

}  // namespace mlir::twell
