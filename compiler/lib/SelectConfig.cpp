// twell-select-config: attaches #twell.target and #twell.config to each kernel op that lacks them:
// a heuristic, or the measured choice of a tuning database file (`tuning-file`: TunedChoice.h).
#include <optional>
#include <type_traits>

#include "TunedChoice.h"
#include "llvm/ADT/DenseMap.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
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

// The FFN a consumer op computes, as a tuning entry is keyed. The user's w_down layout is the `decode`
// option's where it names one (a plan's consumer reads a transposed copy of an out_in w_down and its
// decode kernels the user's: Generate.cpp), else the consumer's own.
template <class ConsumerOp>
::twell::compiler::TunedFfn tunedFfn(ConsumerOp down, TargetAttr target, DecodeChoice decode) {
  const LayoutAttr layout = down.getLayout();
  ::twell::compiler::TunedFfn ffn;
  ffn.arch = target.getArch().str();
  ffn.spec.d_model = dModelOf(down);
  ffn.spec.d_ff = llvm::cast<RankedTensorType>(down.getH().getType()).getDimSize(1);
  ffn.spec.gated = std::is_same_v<ConsumerOp, GatedDownOp>;
  ffn.spec.activation =
      layout.getActivation() == Activation::ReLU ? ::twell::Activation::ReLU : ::twell::Activation::SiLU;
  ffn.spec.threshold = layout.getThresholdValue();
  ffn.spec.dtype = layout.getValue().isBF16() ? ::twell::DType::BF16 : ::twell::DType::FP16;
  const DownLayout user = decode == DecodeChoice::OutIn   ? DownLayout::OutIn
                          : decode == DecodeChoice::InOut ? DownLayout::InOut
                                                          : down.getDownLayout();
  ffn.spec.down_layout = user == DownLayout::OutIn ? ::twell::WeightLayout::OutIn : ::twell::WeightLayout::InOut;
  ffn.tileN = layout.getTileN();
  ffn.slots = layout.getSlots();
  return ffn;
}

// Where an op's configuration came from, when a tuning file was given.
constexpr llvm::StringLiteral kConfigSourceAttr = "twell.config_source";

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
    if (tokens < 0) {
      getOperation().emitError()
          << "twell-select-config: tokens: expected 0 (the largest tuned bucket) or a token count, got "
          << static_cast<int64_t>(tokens);
      return signalPassFailure();
    }

    // The tuning file, read once per function; per FFN, TunedChoice.h decides whether its entry applies.
    const std::string tuningPath = tuningFile;
    std::optional<::twell::TuningFile> tuning;
    std::string whyUnread;
    if (!tuningPath.empty()) {
      tuning = ::twell::read_tuning_file(tuningPath, &whyUnread);
      if (!tuning)
        getOperation().emitWarning() << "twell-select-config: tuning-file " << tuningPath << " ignored (" << whyUnread
                                     << "): the heuristic configures its kernels";
    }
    llvm::DenseMap<Operation*, ::twell::compiler::TunedChoice> choices;
    // The choice for the FFN of a consumer op; nullptr without a tuning file.
    auto choiceFor = [&](Operation* down) -> const ::twell::compiler::TunedChoice* {
      if (tuningPath.empty()) return nullptr;
      auto [it, inserted] = choices.try_emplace(down);
      if (inserted) {
        auto targetOf = [&](auto op) { return op.getTargetAttr() ? op.getTargetAttr() : defaultTarget; };
        const ::twell::compiler::TunedFfn ffn =
            llvm::isa<GatedDownOp>(down)
                ? tunedFfn(llvm::cast<GatedDownOp>(down), targetOf(llvm::cast<GatedDownOp>(down)), decode)
                : tunedFfn(llvm::cast<DownOp>(down), targetOf(llvm::cast<DownOp>(down)), decode);
        it->second = ::twell::compiler::tunedChoice(tuning, tuningPath, whyUnread, ffn, tokens, tuningWorkload);
      }
      return &it->second;
    };
    auto markSource = [&](Operation* op, const ::twell::compiler::TunedChoice* choice) {
      if (tuningPath.empty()) return;
      op->setAttr(
          kConfigSourceAttr,
          StringAttr::get(context,
                          choice ? choice->source
                                 : "heuristic (tuning-file " + tuningPath +
                                       ": h has no twell.gated_down or twell.down here, so the FFN's key is unknown)"));
    };

    // Gate kernels first: a consumer takes the main loop of the gate kernel feeding it. A gate kernel
    // whose consumer already has a config (kept) follows that config's main loop where it can.
    bool failed = false;
    // The training ops take the target alone (their configuration is their contract's).
    getOperation().walk([&](Operation* op) {
      if (llvm::isa<TrainRowBackwardOp, TrainWeightGradOp>(op) && !op->getAttr("target")) op->setAttr("target", defaultTarget);
    });
    getOperation().walk([&](GateMatmulOp gate) {
      if (!gate.getTargetAttr()) gate.setTargetAttr(defaultTarget);
      if (gate.getConfigAttr()) return;
      Mainloop preferred = bestMainloop(dModelOf(gate), gate.getLayout(), gate.getTargetAttr());
      const ::twell::compiler::TunedChoice* choice = nullptr;
      for (Operation* user : gate.getH().getUsers())
        if (llvm::isa<GatedDownOp, DownOp>(user)) {
          if (auto config = user->getAttrOfType<ConfigAttr>("config")) preferred = config.getMainloop();
          choice = choiceFor(user);
        }
      // cluster-m given (1 or 2) wins; else the tuned cluster where the target can multicast; else the heuristic's.
      int64_t cluster = clusterM;
      if (cluster == 0 && choice && choice->config &&
          (choice->config->cluster_m == 1 || gate.getTargetAttr().hasFeature(Feature::Multicast)))
        cluster = choice->config->cluster_m;
      ConfigAttr config =
          gateConfig(context, dModelOf(gate), gate.getLayout(), gate.getTargetAttr(), preferred, cluster);
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
      markSource(gate, choice);
    });
    if (failed) return signalPassFailure();
    auto configure = [&](auto down) {
      if (!down.getTargetAttr()) down.setTargetAttr(defaultTarget);
      const ::twell::compiler::TunedChoice* choice = choiceFor(down);
      if (!down.getConfigAttr()) {
        // Without a visible gate kernel (h is an argument), the main loop one would get here.
        Mainloop gateMainloop = bestMainloop(dModelOf(down), down.getLayout(), down.getTargetAttr());
        if (auto gate = down.getH().template getDefiningOp<GateMatmulOp>())
          if (ConfigAttr config = gate.getConfigAttr()) gateMainloop = config.getMainloop();
        // consumer=block wins; else the tuned variant; else rows.
        ConsumerChoice variant = consumer;
        if (variant == ConsumerChoice::Rows && choice && choice->config &&
            choice->config->consumer == ::twell::ConsumerVariant::TokenBlock)
          variant = ConsumerChoice::Block;
        down.setConfigAttr(consumerConfig(context, gateMainloop, down, variant));
        markSource(down, choice);
      }
      // The decode kernels beside it, where their constraints allow them and unless the tuned entry
      // found that they did not pay off.
      if (down.getDecodeAttr() || decode == DecodeChoice::None) return;
      if (choice && choice->decode.has_value() && !*choice->decode) return;
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
