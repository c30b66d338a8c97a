// Verifiers of the twell operations. Messages name the operand and the dimension, say what is
// expected (with the layout convention it follows) and what was given, e.g.
//   w_up: expected shape [5632, 2048] (d_ff x d_model, nn.Linear layout), got [5632, 1024]
#include "twell/Dialect/TwellOps.h"

#include <string>

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpImplementation.h"
#include "twell/kernels/constraints.h"

#define GET_OP_CLASSES
#include "twell/Dialect/TwellOps.cpp.inc"

namespace mlir::twell {

// The kernels' contracts (kernels/include/twell/kernels/constraints.h).
using namespace ::twell::kernels;
namespace {

std::string formatShape(llvm::ArrayRef<int64_t> shape) {
  std::string text = "[";
  for (auto [i, extent] : llvm::enumerate(shape)) {
    if (i) text += ", ";
    text += ShapedType::isDynamic(extent) ? std::string("?") : std::to_string(extent);
  }
  return text + "]";
}

// Checks the parts shared by all twell ops, in operand order, and records the sizes they fix.
class ShapeChecker {
 public:
  explicit ShapeChecker(Operation* op) : op_(op) {}

  // x [M, d_model]: fixes the element type, M and d_model.
  LogicalResult checkX(Value x) {
    auto type = getMatrix("x", x.getType());
    if (!type) return failure();
    element_ = type.getElementType();
    if (!element_.isBF16() && !element_.isF16())
      return op_->emitOpError() << "x: expected element type bf16 or f16, got " << element_;
    if (type.getEncoding())
      return op_->emitOpError() << "x: expected a tensor without encoding, got " << type;
    tokens_ = type.getDimSize(0);
    dModel_ = type.getDimSize(1);
    if (ShapedType::isDynamic(dModel_))
      return op_->emitOpError() << "x: d_model (dimension 1) must be static, got " << type;
    if (dModel_ < 1)
      return op_->emitOpError() << "x: d_model (dimension 1) must be positive, got " << dModel_;
    return success();
  }

  // A TwELL tensor [M, d_ff] (gate_matmul's result, gated_down's h): fixes d_ff and the layout.
  LogicalResult checkTwell(StringRef name, Value value) {
    auto type = getMatrix(name, value.getType());
    if (!type || failed(checkElement(name, type))) return failure();
    layout_ = llvm::dyn_cast_if_present<LayoutAttr>(type.getEncoding());
    if (!layout_)
      return op_->emitOpError() << name << ": expected a tensor with a #twell.layout encoding, got "
                                << type;
    if (failed(checkTokens(name, type))) return failure();
    int64_t dFF = type.getDimSize(1);
    if (ShapedType::isDynamic(dFF))
      return op_->emitOpError() << name << ": d_ff (dimension 1) must be static, got " << type;
    return setDFF(name, "dimension 1", dFF);
  }

  // A weight with both dimensions fixed by what was checked before.
  LogicalResult checkWeight(StringRef name, Value value, llvm::ArrayRef<int64_t> expected,
                            StringRef convention) {
    auto type = getMatrix(name, value.getType());
    if (!type || failed(checkElement(name, type))) return failure();
    if (type.getEncoding())
      return op_->emitOpError() << name << ": expected a tensor without encoding, got " << type;
    if (type.getShape() != expected)
      return op_->emitOpError() << name << ": expected shape " << formatShape(expected) << " ("
                                << convention << "), got " << formatShape(type.getShape());
    return success();
  }

  // gated_ffn's w_gate [d_ff, d_model]: fixes d_ff.
  LogicalResult checkGateWeight(Value value) {
    auto type = getMatrix("w_gate", value.getType());
    if (!type) return failure();
    int64_t dFF = type.getDimSize(0);
    if (ShapedType::isDynamic(dFF))
      return op_->emitOpError() << "w_gate: d_ff (dimension 0) must be static, got "
                                << formatShape(type.getShape());
    if (failed(setDFF("w_gate", "dimension 0", dFF))) return failure();
    return checkWeight("w_gate", value, {dFF_, dModel_}, "d_ff x d_model, nn.Linear layout");
  }

  LogicalResult checkDownWeight(Value value, DownLayout layout) {
    if (layout == DownLayout::OutIn)
      return checkWeight("w_down", value, {dModel_, dFF_},
                         "d_model x d_ff, nn.Linear layout; declare down_layout = #twell.down_layout<in_out> "
                         "for [d_ff, d_model]");
    return checkWeight("w_down", value, {dFF_, dModel_}, "d_ff x d_model, down_layout = #twell.down_layout<in_out>");
  }

  // y [M, d_model], plain tensor.
  LogicalResult checkY(Value y) { return checkRows("y", y); }

  // A plain [M, d_model] tensor of x's element type (y, dy, dx).
  LogicalResult checkRows(StringRef name, Value value) {
    auto type = getMatrix(name, value.getType());
    if (!type || failed(checkElement(name, type))) return failure();
    if (type.getEncoding())
      return op_->emitOpError() << name << ": expected a tensor without encoding, got " << type;
    if (failed(checkTokens(name, type))) return failure();
    if (type.getDimSize(1) != dModel_)
      return op_->emitOpError() << name << ": expected shape " << formatShape({tokens_, dModel_})
                                << " (tokens x d_model), got " << formatShape(type.getShape());
    return success();
  }

  // An f32 tensor without encoding of the given shape (the training ops' gradients).
  LogicalResult checkF32(StringRef name, Value value, llvm::ArrayRef<int64_t> expected, StringRef convention) {
    auto type = getMatrix(name, value.getType());
    if (!type) return failure();
    if (!type.getElementType().isF32())
      return op_->emitOpError() << name << ": expected element type f32 (gradients accumulate in fp32), got "
                                << type.getElementType();
    if (type.getEncoding())
      return op_->emitOpError() << name << ": expected a tensor without encoding, got " << type;
    // (a dynamic extent in `expected` is the token count: the operands' where one is static)
    if (ShapedType::isDynamic(expected.front()) && failed(checkTokens(name, type))) return failure();
    llvm::SmallVector<int64_t> shown(expected.begin(), expected.end());
    for (int64_t& extent : shown)
      if (ShapedType::isDynamic(extent)) extent = tokens_;
    for (auto [got, want, wanted] : llvm::zip(type.getShape(), shown, expected)) {
      // A dynamic extent only where the tokens go; a static one equal to what is known.
      const bool wrong = ShapedType::isDynamic(got) ? !ShapedType::isDynamic(wanted)
                                                    : !ShapedType::isDynamic(want) && got != want;
      if (wrong)
        return op_->emitOpError() << name << ": expected shape " << formatShape(shown) << " (" << convention
                                  << "), got " << formatShape(type.getShape());
    }
    return success();
  }

  // The layout's value type is the element type of every operand.
  LogicalResult checkLayout(LayoutAttr layout) {
    if (layout.getValue() != element_)
      return op_->emitOpError() << "layout: value type " << layout.getValue()
                                << " differs from the element type " << element_ << " of x";
    return success();
  }

  int64_t dModel() const { return dModel_; }
  int64_t dFF() const { return dFF_; }
  LayoutAttr layout() const { return layout_; }

 private:
  RankedTensorType getMatrix(StringRef name, Type type) {
    auto ranked = llvm::dyn_cast<RankedTensorType>(type);
    if (!ranked) {
      op_->emitOpError() << name << ": expected a ranked tensor, got " << type;
      return {};
    }
    if (ranked.getRank() != 2) {
      op_->emitOpError() << name << ": expected a rank-2 tensor, got rank " << ranked.getRank()
                         << " (" << type << ")";
      return {};
    }
    return ranked;
  }

  LogicalResult checkElement(StringRef name, RankedTensorType type) {
    if (type.getElementType() != element_)
      return op_->emitOpError() << name << ": expected element type " << element_
                                << " (the element type of x), got " << type.getElementType();
    return success();
  }

  // Every operand's static token count agrees: x's, or where x's is dynamic the first static one seen.
  LogicalResult checkTokens(StringRef name, RankedTensorType type) {
    int64_t tokens = type.getDimSize(0);
    if (ShapedType::isDynamic(tokens)) return success();
    if (ShapedType::isDynamic(tokens_)) {
      tokens_ = tokens;
      tokensFrom_ = name.str();
      return success();
    }
    if (tokens != tokens_)
      return op_->emitOpError() << name << ": dimension 0 (tokens) is " << tokens << ", but " << tokensFrom_ << " has "
                                << tokens_ << " tokens";
    return success();
  }

  LogicalResult setDFF(StringRef name, StringRef where, int64_t dFF) {
    if (dFF < 1)
      return op_->emitOpError() << name << ": d_ff (" << where << ") must be positive, got " << dFF;
    dFF_ = dFF;
    return success();
  }

  Operation* op_;
  Type element_;
  int64_t tokens_ = ShapedType::kDynamic;
  std::string tokensFrom_ = "x";
  int64_t dModel_ = 0;
  int64_t dFF_ = 0;
  LayoutAttr layout_;
};

bool isCIdentifier(StringRef name) {
  if (name.empty() || llvm::isDigit(name.front())) return false;
  return llvm::all_of(name, [](char c) { return llvm::isAlnum(c) || c == '_'; });
}

// target / config / kernel_name of a kernel-level op.
LogicalResult verifyKernelAttributes(Operation* op, TargetAttr target, ConfigAttr config,
                                     StringAttr kernelName) {
  if (kernelName) {
    if (!isCIdentifier(kernelName.getValue()))
      return op->emitOpError() << "kernel_name: expected a C identifier (the kernel's extern \"C\" "
                                  "symbol), got \""
                               << kernelName.getValue() << "\"";
    if (!target || !config)
      return op->emitOpError()
             << "kernel_name: a specialized kernel must also carry its target and config";
  }
  return success();
}

// The gate kernel's configuration for mainloop fma (the default).
LogicalResult verifyFmaGateConfig(Operation* op, ConfigAttr config, int64_t tileN) {
  using Gate = GateKernelConstraints;
  if (config.getCtaK() < 1)
    return op->emitOpError() << "config: the gate kernel needs a K step, cta_k must be positive, got "
                             << config;
  if (!Gate::fillsTile(config.getCtaM(), tileN))
    return op->emitOpError() << "config: cta_m * tile_n must be " << Gate::kTileElements
                             << " for the gate kernel (cta_m = " << Gate::kTileElements / tileN
                             << " at tile_n = " << tileN << "), got cta_m = " << config.getCtaM();
  if (config.getThreads() != Gate::kThreads)
    return op->emitOpError() << "config: the gate kernel lays its threads out 16 x 16, threads must be "
                             << Gate::kThreads << ", got " << config.getThreads();
  int64_t sharedBytes = Gate::staticSharedBytes(config.getCtaM(), config.getCtaK(), tileN);
  if (sharedBytes > Gate::kMaxStaticSharedBytes)
    return op->emitOpError() << "config: the gate kernel would need " << sharedBytes
                             << " bytes of static shared memory (cta_k * (cta_m + tile_n) * 4 at cta_k = "
                             << config.getCtaK() << "), more than " << Gate::kMaxStaticSharedBytes
                             << ": lower cta_k";
  return success();
}

// The gate kernel's configuration for mainloop mma_sync (KernelConstraints.h, MmaSyncGateConstraints).
LogicalResult verifyMmaSyncGateConfig(Operation* op, ConfigAttr config, int64_t dModel, int64_t tileN) {
  using Mma = MmaSyncGateConstraints;
  if (!Mma::dModelAllowed(dModel))
    return op->emitOpError() << "config: mainloop mma_sync needs d_model % " << Mma::kDModelMultiple
                             << " == 0 (16-byte cp.async chunks), got d_model " << dModel;
  if (!Mma::tileNAllowed(tileN))
    return op->emitOpError() << "config: mainloop mma_sync needs " << Mma::kMinTileN
                             << " <= tile_n <= " << Mma::kMaxTileN << ", got tile_n " << tileN;
  if (config.getCtaK() != Mma::kCtaK)
    return op->emitOpError() << "config: mainloop mma_sync steps K by " << Mma::kCtaK
                             << ", cta_k must be " << Mma::kCtaK << ", got " << config.getCtaK();
  if (config.getThreads() != Mma::kThreads)
    return op->emitOpError() << "config: mainloop mma_sync runs " << Mma::kThreads
                             << " threads (16 warps), threads must be " << Mma::kThreads << ", got "
                             << config.getThreads();
  int64_t ctaM = Mma::ctaM(tileN);
  if (config.getCtaM() != ctaM)
    return op->emitOpError() << "config: mainloop mma_sync needs cta_m = min(" << Mma::kMaxCtaM << ", "
                             << Mma::kMaxTileElements << " / tile_n) = " << ctaM << " at tile_n = "
                             << tileN << ", got cta_m = " << config.getCtaM();
  int64_t stages = config.getStages();
  if (stages < Mma::kMinStages || stages > Mma::kMaxStages)
    return op->emitOpError() << "config: mainloop mma_sync needs a cp.async pipeline of "
                             << Mma::kMinStages << " to " << Mma::kMaxStages
                             << " stages, got stages = " << stages;
  int64_t sharedBytes = Mma::sharedBytes(ctaM, tileN, stages);
  if (sharedBytes > Mma::kMaxSharedBytes)
    return op->emitOpError() << "config: mainloop mma_sync with stages = " << stages << " would need "
                             << sharedBytes
                             << " bytes of shared memory (max(stages * (cta_m + tile_n) * 80, cta_m * "
                                "tile_n * 2)), more than "
                             << Mma::kMaxSharedBytes << ": lower stages (at most "
                             << Mma::maxStages(tileN) << " at tile_n = " << tileN << ")";
  return success();
}

// The gate kernel's configuration for mainloop wgmma (KernelConstraints.h, WgmmaGateConstraints).
LogicalResult verifyWgmmaGateConfig(Operation* op, ConfigAttr config, TargetAttr target, int64_t dModel,
                                    int64_t tileN) {
  using Wg = WgmmaGateConstraints;
  if (target && !target.hasWgmmaMainloopFeatures())
    return op->emitOpError() << "config: mainloop wgmma needs a target with features wgmma and tma "
                                "(sm_90a), got "
                             << target;
  if (!Wg::tileNAllowed(tileN))
    return op->emitOpError() << "config: mainloop wgmma takes the tile width as the wgmma N: tile_n "
                                "must be 64, 128 or 256, got "
                             << tileN;
  if (config.getCtaM() != Wg::kCtaM || !Wg::ctaKAllowed(config.getCtaK()) || config.getThreads() != Wg::kThreads)
    return op->emitOpError() << "config: mainloop wgmma needs cta_m = " << Wg::kCtaM
                             << ", cta_k = 32 or 64 (one 64- or 128-byte swizzle row), threads = " << Wg::kThreads
                             << " (a producer and two consumer warpgroups), got " << config;
  int64_t ctaK = config.getCtaK();
  if (dModel % ctaK != 0)
    return op->emitOpError() << "config: mainloop wgmma needs d_model % cta_k == 0 (whole K steps of "
                             << ctaK << "; cta_k 32 takes d_model % 32 == 0), got d_model " << dModel;
  int64_t stages = config.getStages();
  int64_t maxStages = Wg::maxStages(tileN, ctaK);
  if (stages < Wg::kMinStages || stages > maxStages)
    return op->emitOpError() << "config: mainloop wgmma needs a TMA ring of " << Wg::kMinStages << " to "
                             << maxStages << " stages at tile_n = " << tileN << ", cta_k = " << ctaK
                             << " (at most " << Wg::kMaxStages << ", and at most " << Wg::kMaxSharedBytes
                             << " bytes of shared memory), got stages = " << stages;
  if (!Wg::clusterMAllowed(config.getClusterM()))
    return op->emitOpError() << "config: mainloop wgmma shares the w_gate tile across cluster_m = 1 or 2 CTAs, got "
                             << "cluster_m = " << config.getClusterM();
  if (config.getClusterM() > 1 && target && !target.hasFeature(Feature::Multicast))
    return op->emitOpError() << "config: cluster_m = " << config.getClusterM()
                             << " multicasts the w_gate tile: it needs a target with feature multicast, got "
                             << target;
  return success();
}

// The config rules of the consumers (twell.gated_down, twell.down), after their operands' shapes
// were checked by `check`. `gated`: the token block is a gated kernel only.
LogicalResult verifyConsumer(Operation* op, ShapeChecker& check, DownLayout downLayout, TargetAttr target,
                             ConfigAttr config, StringAttr kernelName, bool gated) {
  auto emitOpError = [op] { return op->emitOpError(); };
  const char* kernel = gated ? "gated_down" : "down";
  if (config) {
    if (config.getCtaK() != 0)
      return emitOpError() << "config: the " << kernel << " kernel has no K loop, cta_k must be omitted, "
                              "got "
                           << config;
    if (config.getClusterM() != 1)
      return emitOpError() << "config: the " << kernel << " kernel runs no clusters, cluster_m must be omitted, got "
                           << config;
    using Down = GatedDownKernelConstraints;
    // The variant is named (ConfigAttr::verify checks that cta_m agrees with it).
    if (config.getConsumer() == ConsumerVariant::None)
      return emitOpError() << "config: the " << kernel << " kernel's variant must be named: consumer = cta_row (one token "
                              "row per CTA, cta_m = "
                           << Down::kCtaM << "), warp_row (one per warp, cta_m = threads / 32) or token_block ("
                           << Down::kBlockCtaM << " rows on " << Down::kBlockThreads << " threads), got " << config;
    const bool block = config.getConsumer() == ConsumerVariant::TokenBlock;
    const bool warpRows = config.getConsumer() == ConsumerVariant::WarpRow;
    if (block && !gated)
      return emitOpError() << "config: the token block (cta_m = " << Down::kBlockCtaM
                           << ") is a gated kernel; twell.down takes one token row per warp or per CTA";
    if (block) {
      const int64_t tileN = check.layout().getTileN();
      if (!Down::blockShapeAllowed(config.getMainloop() != Mainloop::Fma, downLayout == DownLayout::InOut,
                                   check.dModel(), tileN))
        return emitOpError() << "config: a token block (cta_m = " << Down::kBlockCtaM
                             << ") needs a tensor-core gate (mainloop mma_sync or wgmma), in_out down weights, d_model "
                                "128, 256, 512, 1024 or 2048 and tile_n <= "
                             << Down::kBlockMaxTileN << ", got mainloop " << stringifyMainloop(config.getMainloop())
                             << ", " << stringifyDownLayout(downLayout) << ", d_model " << check.dModel()
                             << ", tile_n " << tileN;
      if (config.getStages() < Down::kBlockMinStages || config.getStages() > Down::kBlockMaxStages)
        return emitOpError() << "config: a token block needs stages " << Down::kBlockMinStages << ".."
                             << Down::kBlockMaxStages << " (its cp.async ring), got " << config.getStages();
      const int64_t limit = Down::maxDynamicSharedBytes(target ? target.getComputeCapability() : 90);
      const int64_t bytes = Down::blockSharedBytes(check.dModel(), check.dFF(), tileN, config.getStages());
      if (bytes == 0 || bytes > limit)
        return emitOpError() << "config: a token block with stages = " << config.getStages() << " needs " << bytes
                             << " bytes of shared memory at d_model " << check.dModel() << ", d_ff " << check.dFF()
                             << ", tile_n " << tileN << "; the target allows " << limit;
    }
    if (warpRows &&
        !Down::warpRowAllowed(config.getMainloop() != Mainloop::Fma, downLayout == DownLayout::InOut,
                              check.dModel(), config.getThreads()))
      return emitOpError() << "config: one token row per warp needs a tensor-core gate (mainloop mma_sync "
                              "or wgmma), in_out down weights, d_model a multiple of "
                           << Down::kWarpRowDModelMultiple << " up to " << Down::kWarpRowMaxDModel << " and "
                           << Down::kWarpRowThreads << " threads, got mainloop "
                           << stringifyMainloop(config.getMainloop()) << ", "
                           << stringifyDownLayout(downLayout) << ", d_model " << check.dModel()
                           << ", threads " << config.getThreads();
    // The overflow recompute repeats the gate's arithmetic: the gate's shape rules hold here too.
    if (config.getMainloop() == Mainloop::MmaSync && !MmaSyncGateConstraints::dModelAllowed(check.dModel()))
      return emitOpError() << "config: mainloop mma_sync (the gate's, repeated by the overflow recompute) "
                              "needs d_model % "
                           << MmaSyncGateConstraints::kDModelMultiple << " == 0, got d_model " << check.dModel();
    if (config.getMainloop() == Mainloop::Wgmma) {
      if (target && !target.hasWgmmaMainloopFeatures())
        return emitOpError() << "config: mainloop wgmma (the gate's) needs a target with features wgmma "
                                "and tma (sm_90a), got "
                             << target;
      if (!WgmmaGateConstraints::allowed(check.dModel(), check.layout().getTileN()))
        return emitOpError() << "config: mainloop wgmma (the gate's) needs d_model % "
                             << WgmmaGateConstraints::kMinCtaK
                             << " == 0 and tile_n 64, 128 or 256, got d_model " << check.dModel()
                             << ", tile_n " << check.layout().getTileN();
    }
    if (!block && config.getStages() != 0)
      return emitOpError() << "config: only the token-block gated_down kernel (cta_m = " << Down::kBlockCtaM
                           << ") has a cp.async pipeline, stages must be omitted, got "
                           << config;
  }
  return verifyKernelAttributes(op, target, config, kernelName);
}


}  // namespace

namespace {
// The #twell.layout encoding of a TwELL tensor value (null when the type carries none; the verifiers
// report that case).
LayoutAttr twellEncoding(Value h) {
  auto type = llvm::dyn_cast<RankedTensorType>(h.getType());
  return type ? llvm::dyn_cast_if_present<LayoutAttr>(type.getEncoding()) : LayoutAttr();
}
}  // namespace

//===----------------------------------------------------------------------===//
// twell.gate_matmul
//===----------------------------------------------------------------------===//

LayoutAttr GateMatmulOp::getLayout() { return twellEncoding(getH()); }

LogicalResult GateMatmulOp::verify() {
  ShapeChecker check(*this);
  if (failed(check.checkX(getX())) || failed(check.checkTwell("h", getH())) ||
      failed(check.checkWeight("w_gate", getWGate(), {check.dFF(), check.dModel()},
                               "d_ff x d_model, nn.Linear layout")) ||
      failed(check.checkLayout(check.layout())))
    return failure();
  if (ConfigAttr config = getConfigAttr()) {
    int64_t tileN = check.layout().getTileN();
    if (config.getConsumer() != ConsumerVariant::None)
      return emitOpError() << "config: consumer names a consumer kernel's variant; the gate kernel's config has none, got "
                           << config;
    if (config.getMainloop() != Mainloop::Wgmma && config.getClusterM() != 1)
      return emitOpError() << "config: only mainloop wgmma runs in clusters (TMA multicast), cluster_m must be 1 "
                              "(omitted), got "
                           << config;
    if (config.getMainloop() == Mainloop::Wgmma) {
      if (failed(verifyWgmmaGateConfig(*this, config, getTargetAttr(), check.dModel(), tileN)))
        return failure();
    } else if (config.getMainloop() == Mainloop::MmaSync) {
      if (failed(verifyMmaSyncGateConfig(*this, config, check.dModel(), tileN))) return failure();
    } else if (failed(verifyFmaGateConfig(*this, config, tileN))) {
      return failure();
    }
  }
  return verifyKernelAttributes(*this, getTargetAttr(), getConfigAttr(), getKernelNameAttr());
}

//===----------------------------------------------------------------------===//
// twell.gated_down
//===----------------------------------------------------------------------===//

LayoutAttr GatedDownOp::getLayout() { return twellEncoding(getH()); }

LogicalResult GatedDownOp::verify() {
  ShapeChecker check(*this);
  if (failed(check.checkX(getX())) || failed(check.checkTwell("h", getH())) ||
      failed(check.checkLayout(check.layout())) ||
      failed(check.checkWeight("w_up", getWUp(), {check.dFF(), check.dModel()},
                               "d_ff x d_model, nn.Linear layout")) ||
      failed(check.checkDownWeight(getWDown(), getDownLayout())) || failed(check.checkY(getY())))
    return failure();
  return verifyConsumer(*this, check, getDownLayout(), getTargetAttr(), getConfigAttr(), getKernelNameAttr(), true);
}

//===----------------------------------------------------------------------===//
// twell.down
//===----------------------------------------------------------------------===//

LayoutAttr DownOp::getLayout() { return twellEncoding(getH()); }

LogicalResult DownOp::verify() {
  ShapeChecker check(*this);
  if (failed(check.checkX(getX())) || failed(check.checkTwell("h", getH())) ||
      failed(check.checkLayout(check.layout())) || failed(check.checkDownWeight(getWDown(), getDownLayout())) ||
      failed(check.checkY(getY())))
    return failure();
  return verifyConsumer(*this, check, getDownLayout(), getTargetAttr(), getConfigAttr(), getKernelNameAttr(), false);
}

//===----------------------------------------------------------------------===//
// twell.gated_ffn
//===----------------------------------------------------------------------===//

LogicalResult GatedFfnOp::verify() {
  ShapeChecker check(*this);
  if (failed(check.checkX(getX())) || failed(check.checkLayout(getLayout())) ||
      failed(check.checkGateWeight(getWGate())) ||
      failed(check.checkWeight("w_up", getWUp(), {check.dFF(), check.dModel()},
                               "d_ff x d_model, nn.Linear layout")) ||
      failed(check.checkDownWeight(getWDown(), getDownLayout())) || failed(check.checkY(getY())))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// twell.ffn
//===----------------------------------------------------------------------===//

LogicalResult FfnOp::verify() {
  ShapeChecker check(*this);
  if (failed(check.checkX(getX())) || failed(check.checkLayout(getLayout())) ||
      failed(check.checkGateWeight(getWGate())) || failed(check.checkDownWeight(getWDown(), getDownLayout())) ||
      failed(check.checkY(getY())))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// twell.train_row_backward, twell.train_weight_grad
//===----------------------------------------------------------------------===//

namespace {
// kernel_name of a training op: a C identifier, set with the target (these ops have no config: theirs
// is the contract's).
LogicalResult verifyTrainingKernelAttributes(Operation* op, TargetAttr target, StringAttr kernelName) {
  if (!kernelName) return success();
  if (!isCIdentifier(kernelName.getValue()))
    return op->emitOpError() << "kernel_name: expected a C identifier (the kernel's extern \"C\" symbol), got \""
                             << kernelName.getValue() << "\"";
  if (!target) return op->emitOpError() << "kernel_name: a specialized kernel must also carry its target";
  return success();
}
}  // namespace

LayoutAttr TrainRowBackwardOp::getLayout() { return twellEncoding(getH()); }

LogicalResult TrainRowBackwardOp::verify() {
  ShapeChecker check(*this);
  if (failed(check.checkX(getX())) || failed(check.checkRows("dy", getDy())) || failed(check.checkTwell("h", getH())) ||
      failed(check.checkLayout(check.layout())) ||
      failed(check.checkWeight("w_gate", getWGate(), {check.dFF(), check.dModel()}, "d_ff x d_model, nn.Linear layout")) ||
      failed(check.checkWeight("w_down", getWDown(), {check.dFF(), check.dModel()},
                               "d_ff x d_model: the in_out layout the row consumer reads")) ||
      (getWUp() && failed(check.checkWeight("w_up", getWUp(), {check.dFF(), check.dModel()},
                                            "d_ff x d_model, nn.Linear layout"))) ||
      failed(check.checkRows("dx", getDx())))
    return failure();
  const int64_t M = ShapedType::kDynamic;
  if (failed(check.checkF32("dg", getDg(), {M, check.dFF()}, "tokens x d_ff, at h's entries")))
    return failure();
  if (static_cast<bool>(getWUp()) != static_cast<bool>(getDu()))
    return emitOpError() << "du: expected a du result exactly when w_up is given (a gated layer), got "
                         << (getWUp() ? "w_up without du" : "du without w_up");
  if (getDu() && failed(check.checkF32("du", getDu(), {M, check.dFF()}, "tokens x d_ff, at h's entries")))
    return failure();
  if (check.dModel() > TrainRowBackwardConstraints::kMaxDModel)
    return emitOpError() << "x: d_model at most " << TrainRowBackwardConstraints::kMaxDModel
                         << " (a row of dx lives in registers), got " << check.dModel();
  return verifyTrainingKernelAttributes(*this, getTargetAttr(), getKernelNameAttr());
}

LayoutAttr TrainWeightGradOp::getLayout() { return twellEncoding(getH()); }

LogicalResult TrainWeightGradOp::verify() {
  ShapeChecker check(*this);
  if (failed(check.checkX(getX())) || failed(check.checkRows("dy", getDy())) || failed(check.checkTwell("h", getH())) ||
      failed(check.checkLayout(check.layout())))
    return failure();
  const int64_t M = ShapedType::kDynamic;
  const char* perWeight = "d_ff x d_model";
  if (failed(check.checkF32("dg", getDg(), {M, check.dFF()}, "tokens x d_ff, at h's entries")) ||
      (getDu() && failed(check.checkF32("du", getDu(), {M, check.dFF()}, "tokens x d_ff, at h's entries"))) ||
      failed(check.checkF32("dw_gate", getDwGate(), {check.dFF(), check.dModel()}, perWeight)) ||
      failed(check.checkF32("dw_down_t", getDwDownT(), {check.dFF(), check.dModel()}, "d_ff x d_model: dWd^T")) ||
      (getDwUp() && failed(check.checkF32("dw_up", getDwUp(), {check.dFF(), check.dModel()}, perWeight))))
    return failure();
  if (static_cast<bool>(getDu()) != static_cast<bool>(getDwUp()))
    return emitOpError() << "dw_up: expected a dw_up result exactly when du is given (a gated layer), got "
                         << (getDu() ? "du without dw_up" : "dw_up without du");
  if (check.dModel() > TrainWeightGradConstraints::kMaxDModel)
    return emitOpError() << "x: d_model at most " << TrainWeightGradConstraints::kMaxDModel << ", got " << check.dModel();
  if (TargetAttr target = getTargetAttr()) {
    const int64_t tileN = check.layout().getTileN();
    const int64_t maxDFF = TrainWeightGradConstraints::maxDFF(
        tileN, GatedDownKernelConstraints::maxDynamicSharedBytes(target.getComputeCapability()));
    if (check.dFF() > maxDFF)
      return emitOpError() << "h: d_ff at most " << maxDFF << " on " << target
                           << " at tile_n " << tileN << " (a shared-memory counter per neuron), got " << check.dFF();
  }
  return verifyTrainingKernelAttributes(*this, getTargetAttr(), getKernelNameAttr());
}

}  // namespace mlir::twell
