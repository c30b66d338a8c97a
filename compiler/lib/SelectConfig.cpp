// twell-select-config: attaches #twell.target and #twell.config to each kernel op that lacks them.
// A heuristic for now; the tuning database (runtime/) will supply measured configurations.
#include <type_traits>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "twell/kernels/constraints.h"
#include "twell/Dialect/TwellOps.h"
#include "twell/compiler/Passes.h"

namespace mlir::twell {

// The kernels' contracts (kernels/include/twell/kernels/constraints.h).
using namespace ::twell::kernels;

#define GEN_PASS_DEF_TWELLSELECTCONFIG
#include "twell/compiler/Passes.h.inc"

namespace {

// The gate kernel's main loop: wgmma (the persistent TMA + wgmma kernel) where the target has the
// wgmma and tma features (sm_90a) and WgmmaGateConstraints allow the shape; else mma_sync (tensor cores, a cp.async pipeline in dynamic shared memory)
// wherever MmaSyncGateConstraints allow it (d_model % 8 == 0, 64 <= tile_n <= 1024; every supported
// target, sm_80 and later, has mma.sync for bf16 and f16), else fma, the plain tiled loop: its CTA
// computes cta_m x tile_n = 16384 outputs on 256 threads, stepping K by 16 (by less where its operands
// would not fit 48 KiB of static shared memory: tile_n = 1024). The consumer handles one token row per
// CTA and carries the main loop of the gate kernel that feeds it.
constexpr int64_t kThreads = 256;

bool mmaSyncAllowed(int64_t dModel, LayoutAttr layout) {
  return MmaSyncGateConstraints::allowed(dModel, layout.getTileN());
}

ConfigAttr fmaGateConfig(MLIRContext* context, LayoutAttr layout) {
  using Gate = GateKernelConstraints;
  int64_t tileN = layout.getTileN();
  return ConfigAttr::get(context, Gate::kTileElements / tileN, Gate::defaultCtaK(tileN), Gate::kThreads);
}

ConfigAttr mmaSyncGateConfig(MLIRContext* context, LayoutAttr layout) {
  using Mma = MmaSyncGateConstraints;
  int64_t tileN = layout.getTileN();
  return ConfigAttr::get(context, Mma::ctaM(tileN), Mma::kCtaK, Mma::kThreads, Mainloop::MmaSync,
                         Mma::maxStages(tileN));
}

bool wgmmaAllowed(int64_t dModel, LayoutAttr layout, TargetAttr target) {
  return target.hasWgmmaMainloopFeatures() &&
         WgmmaGateConstraints::allowed(dModel, layout.getTileN());
}

// The K step d_model allows (ctaKFor), the deepest ring that fits beside the epilogue's staging, and
// clusters sharing the w_gate tile where the target multicasts.
// `clusterM` 0: the default.
ConfigAttr wgmmaGateConfig(MLIRContext* context, int64_t dModel, LayoutAttr layout, TargetAttr target,
                           int64_t clusterM) {
  using Wg = WgmmaGateConstraints;
  const int64_t ctaK = Wg::ctaKFor(dModel);
  if (clusterM == 0) clusterM = target.hasFeature(Feature::Multicast) ? Wg::kDefaultClusterM : 1;
  return ConfigAttr::get(context, Wg::kCtaM, ctaK, Wg::kThreads, Mainloop::Wgmma, Wg::maxStages(layout.getTileN(), ctaK),
                         clusterM, ConsumerVariant::None);
}

// The best main loop the target and shape allow.
Mainloop bestMainloop(int64_t dModel, LayoutAttr layout, TargetAttr target) {
  if (wgmmaAllowed(dModel, layout, target)) return Mainloop::Wgmma;
  if (mmaSyncAllowed(dModel, layout)) return Mainloop::MmaSync;
  return Mainloop::Fma;
}

// `preferred` when the target and shape allow it, else mma_sync if allowed, else fma.
ConfigAttr gateConfig(MLIRContext* context, int64_t dModel, LayoutAttr layout, TargetAttr target,
                      Mainloop preferred, int64_t clusterM) {
  if (preferred == Mainloop::Wgmma && wgmmaAllowed(dModel, layout, target))
    return wgmmaGateConfig(context, dModel, layout, target, clusterM);
  if (preferred != Mainloop::Fma && mmaSyncAllowed(dModel, layout))
    return mmaSyncGateConfig(context, layout);
  return fmaGateConfig(context, layout);
}

int64_t dModelOf(Operation* op) {
  return llvm::cast<RankedTensorType>(op->getOperand(0).getType()).getDimSize(1);
}

// One row per warp wherever allowed (measured faster at the paper's shape: bench/README.md v9), else
// one row per CTA.
// With consumer = block: 16 token rows per CTA on tensor cores (gated_down_block.cuh) with the
// deepest ring that fits the target's shared memory, where the shape allows it (gated layers only).
// ConsumerOp: GatedDownOp or DownOp.
template <class ConsumerOp>
ConfigAttr consumerConfig(MLIRContext* context, Mainloop gateMainloop, ConsumerOp down, ConsumerChoice consumer) {
  using Down = GatedDownKernelConstraints;
  if (consumer == ConsumerChoice::Block && std::is_same_v<ConsumerOp, GatedDownOp>) {
    const int64_t tileN = down.getLayout().getTileN();
    const int64_t dFF = llvm::cast<RankedTensorType>(down.getH().getType()).getDimSize(1);
    const int64_t stages = Down::blockStages(dModelOf(down), dFF, tileN,
                                             Down::maxDynamicSharedBytes(down.getTargetAttr().getComputeCapability()));
    if (stages > 0 && Down::blockShapeAllowed(gateMainloop != Mainloop::Fma, down.getDownLayout() == DownLayout::InOut,
                                              dModelOf(down), tileN))
      return ConfigAttr::get(context, ConsumerVariant::TokenBlock, Down::kBlockCtaM, Down::kBlockThreads, gateMainloop, stages);
  }
  const bool warpRows = Down::warpRowAllowed(gateMainloop != Mainloop::Fma,
                                             down.getDownLayout() == DownLayout::InOut, dModelOf(down), kThreads);
  return ConfigAttr::get(context, warpRows ? ConsumerVariant::WarpRow : ConsumerVariant::CtaRow,
                         warpRows ? kThreads / 32 : Down::kCtaM, kThreads, gateMainloop, /*stages=*/0);
}


struct TwellSelectConfig : impl::TwellSelectConfigBase<TwellSelectConfig> {
  using Base::Base;

  void runOnOperation() override {
    MLIRContext* context = &getContext();
    std::string arch = target;
    if (clusterM != 0 && clusterM != 1 && clusterM != 2) {
      getOperation().emitError() << "twell-select-config: cluster-m: expected 1 or 2 (or 0: the heuristic's), got "
                                 << static_cast<int64_t>(clusterM);
      return signalPassFailure();
    }
    auto emitError = [&] { return getOperation().emitError() << "twell-select-config: target: "; };
    TargetAttr defaultTarget = TargetAttr::getChecked(
        llvm::function_ref<InFlightDiagnostic()>(emitError), context, llvm::StringRef(arch),
        llvm::ArrayRef<Feature>(TargetAttr::defaultFeatures(arch)));
    if (!defaultTarget) return signalPassFailure();

    // Gate kernels first: a consumer takes the main loop of the gate kernel feeding it. A gate kernel
    // whose consumer already has a config (kept) follows that config's main loop where it can.
    bool failed = false;
    getOperation().walk([&](GateMatmulOp gate) {
      if (!gate.getTargetAttr()) gate.setTargetAttr(defaultTarget);
      if (gate.getConfigAttr()) return;
      Mainloop preferred = bestMainloop(dModelOf(gate), gate.getLayout(), gate.getTargetAttr());
      for (Operation* user : gate.getH().getUsers())
        if (llvm::isa<GatedDownOp, DownOp>(user))
          if (auto config = user->getAttrOfType<ConfigAttr>("config")) preferred = config.getMainloop();
      ConfigAttr config = gateConfig(context, dModelOf(gate), gate.getLayout(), gate.getTargetAttr(), preferred,
                                     static_cast<int64_t>(clusterM));
      // An explicit cluster-m = 2 only the sm_90a wgmma gate on a multicast target can honour.
      if (clusterM == 2 && (config.getMainloop() != Mainloop::Wgmma ||
                            !gate.getTargetAttr().hasFeature(Feature::Multicast))) {
        gate.emitError() << "twell-select-config: cluster-m=2 needs the wgmma gate on a target with feature "
                            "multicast (sm_90a, d_model % 32 == 0, tile_n 64, 128 or 256); this gate gets mainloop "
                         << stringifyMainloop(config.getMainloop()) << " on " << gate.getTargetAttr();
        failed = true;
        return;
      }
      gate.setConfigAttr(config);
    });
    if (failed) return signalPassFailure();
    auto configure = [&](auto down) {
      if (!down.getTargetAttr()) down.setTargetAttr(defaultTarget);
      if (!down.getConfigAttr()) {
        // Without a visible gate kernel (h is an argument), the main loop one would get here.
        Mainloop gateMainloop = bestMainloop(dModelOf(down), down.getLayout(), down.getTargetAttr());
        if (auto gate = down.getH().template getDefiningOp<GateMatmulOp>())
          if (ConfigAttr config = gate.getConfigAttr()) gateMainloop = config.getMainloop();
        down.setConfigAttr(consumerConfig(context, gateMainloop, down, consumer));
      }
      // The decode kernels beside it, where their constraints allow them.
      if (down.getDecodeAttr() || decode == DecodeChoice::None) return;
      const int64_t dFF = llvm::cast<RankedTensorType>(down.getH().getType()).getDimSize(1);
      const ConfigAttr config = down.getConfigAttr();
      const bool tokenBlock = config.getConsumer() == ConsumerVariant::TokenBlock;
      if (!DecodeKernelConstraints::allowed(config.getMainloop() != Mainloop::Fma, tokenBlock, dModelOf(down), dFF,
                                            down.getLayout().getTileN(), down.getTargetAttr().getComputeCapability()))
        return;
      const DownLayout layout = decode == DecodeChoice::Auto    ? down.getDownLayout()
                                : decode == DecodeChoice::OutIn ? DownLayout::OutIn
                                                     : DownLayout::InOut;
      down.setDecodeAttr(DownLayoutAttr::get(context, layout));
    };
    getOperation().walk([&](GatedDownOp down) { configure(down); });
    getOperation().walk([&](DownOp down) { configure(down); });
  }
};

}  // namespace
}  // namespace mlir::twell
