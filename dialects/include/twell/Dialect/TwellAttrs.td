// Attributes of the twell dialect: the TwELL layout (a tensor encoding), the GPU target and the
// kernel configuration, and the enums they use.
#ifndef TWELL_ATTRS_TD
#define TWELL_ATTRS_TD

include "twell/Dialect/TwellDialect.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/TensorEncoding.td"

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

// The gate activation and its sparsity predicate (runtime/include/twell/spec.h, twell::Activation):
// relu: active iff relu(g) > threshold; silu: active iff |silu(g)| > threshold.
def Twell_Activation : I32EnumAttr<"Activation", "gate activation", [
    I32EnumAttrCase<"ReLU", 0, "relu">,
    I32EnumAttrCase<"SiLU", 1, "silu">]> {
  let cppNamespace = "::mlir::twell";
  let genSpecializedAttr = 0;
}
def Twell_ActivationAttr : EnumAttr<Twell_Dialect, Twell_Activation, "activation"> {
  let assemblyFormat = "`<` $value `>`";
}

// Layout of the down projection weight: out_in is nn.Linear's [d_model, d_ff] (the default),
// in_out is [d_ff, d_model] and must be declared.
def Twell_DownLayout : I32EnumAttr<"DownLayout", "layout of the down projection weight", [
    I32EnumAttrCase<"OutIn", 0, "out_in">,
    I32EnumAttrCase<"InOut", 1, "in_out">]> {
  let cppNamespace = "::mlir::twell";
  let genSpecializedAttr = 0;
}
def Twell_DownLayoutAttr : EnumAttr<Twell_Dialect, Twell_DownLayout, "down_layout"> {
  let assemblyFormat = "`<` $value `>`";
}

// GPU features a kernel may use. wgmma, tma and multicast (TMA multicast across a cluster) exist only
// on sm_90a; mma_sync and cp_async are portable (sm_80 and later).
def Twell_Feature : I32EnumAttr<"Feature", "GPU feature", [
    I32EnumAttrCase<"Wgmma", 0, "wgmma">,
    I32EnumAttrCase<"Tma", 1, "tma">,
    I32EnumAttrCase<"Multicast", 2, "multicast">,
    I32EnumAttrCase<"MmaSync", 3, "mma_sync">,
    I32EnumAttrCase<"CpAsync", 4, "cp_async">]> {
  let cppNamespace = "::mlir::twell";
  let genSpecializedAttr = 0;
}

// The gate kernel's GEMM main loop (#twell.config mainloop; KernelConstraints.h): fma, the CTA-tiled fp32
// FMA loop on static shared memory (any target, any shape); mma_sync, tensor cores through mma.sync
// m16n8k16 + ldmatrix fed by a cp.async pipeline (sm_80+, d_model % 8 == 0, 64 <= tile_n <= 1024);
// wgmma, the persistent warp-specialized TMA + wgmma kernel (sm_90a with features wgmma and tma,
// d_model % 8 == 0, tile_n 64, 128 or 256).
// A gated_down's config carries its gate kernel's main loop (its overflow recompute repeats it).
def Twell_Mainloop : I32EnumAttr<"Mainloop", "gate GEMM main loop", [
    I32EnumAttrCase<"Fma", 0, "fma">,
    I32EnumAttrCase<"MmaSync", 1, "mma_sync">,
    I32EnumAttrCase<"Wgmma", 2, "wgmma">]> {
  let cppNamespace = "::mlir::twell";
  let genSpecializedAttr = 0;
}

//===----------------------------------------------------------------------===//
// Parameters with their own syntax
//===----------------------------------------------------------------------===//

// An f32 printed in its shortest round-trip decimal form (`0.0`, `0.25`, `1.0e-05`).
def Twell_ThresholdParameter : APFloatParameter<"sparsity threshold (f32)"> {
  let parser = "::mlir::twell::parseF32Parameter($_parser)";
  let printer = "::mlir::twell::printF32Parameter($_printer, $_self)";
}

// The consumer kernel's variant (#twell.config consumer): none on a gate kernel's config (omitted);
// on a twell.gated_down / twell.down one of cta_row (one token row per CTA), warp_row (one per warp,
// persistent) or token_block (16 rows per CTA on tensor cores). cta_m must agree (1, threads / 32, 16):
// the variant is named, not read off a tile size.
def Twell_ConsumerVariant : I32EnumAttr<"ConsumerVariant", "consumer kernel variant", [
    I32EnumAttrCase<"None", 0, "none">,
    I32EnumAttrCase<"CtaRow", 1, "cta_row">,
    I32EnumAttrCase<"WarpRow", 2, "warp_row">,
    I32EnumAttrCase<"TokenBlock", 3, "token_block">]> {
  let cppNamespace = "::mlir::twell";
  let genSpecializedAttr = 0;
}

// `warp_row`; none when omitted (a gate kernel's config).
def Twell_ConsumerVariantParameter : EnumParameter<Twell_ConsumerVariant> {
  let defaultValue = "::mlir::twell::ConsumerVariant::None";
  let parser = "::mlir::twell::parseConsumerVariant($_parser)";
}

// `mma_sync`; fma when omitted.
def Twell_MainloopParameter : EnumParameter<Twell_Mainloop> {
  let defaultValue = "::mlir::twell::Mainloop::Fma";
  let parser = "::mlir::twell::parseMainloop($_parser)";
}

// `[wgmma, tma]`, possibly empty.
def Twell_FeatureListParameter : ArrayRefParameter<"::mlir::twell::Feature", "GPU features"> {
  let parser = "::mlir::twell::parseFeatureList($_parser)";
  let printer = "::mlir::twell::printFeatureList($_printer, $_self)";
}

//===----------------------------------------------------------------------===//
// #twell.layout
//===----------------------------------------------------------------------===//

def Twell_LayoutAttr : AttrDef<Twell_Dialect, "Layout",
                               [DeclareAttrInterfaceMethods<VerifiableTensorEncoding>]> {
  let mnemonic = "layout";
  let summary = "TwELL layout of the hidden activation H [M, d_ff]";
  let description = [{
    Encoding of a rank-2 tensor H [M, d_ff] stored in TwELL (TWELL_FORMAT.md): d_ff is cut into
    ceil(d_ff / tile_n) tiles of `tile_n` columns (the N extent of the gate GEMM's CTA tile); every
    (row, tile) owns `slots` + 1 words of 32 bits: the nnz of the tile-row, then the entries in
    ascending column order, each the value (`value` type, high bits) and its column inside the tile
    (`index` type, low bits). An entry is active iff act(g) > threshold (relu) or |act(g)| > threshold
    (silu). The threshold is finite, at most the largest finite `value` (f16: 65504) and never -0.0
    (the parser and the float builder read it as 0.0).

    ```mlir
    tensor<?x5632xbf16, #twell.layout<tile_n = 256, slots = 31, value = bf16, index = i16,
                                      activation = relu, threshold = 0.0>>
    ```
  }];
  let parameters = (ins
    "int64_t":$tile_n,
    "int64_t":$slots,
    "::mlir::Type":$value,
    "::mlir::Type":$index,
    EnumParameter<Twell_Activation>:$activation,
    Twell_ThresholdParameter:$threshold
  );
  let builders = [
    AttrBuilder<(ins "int64_t":$tile_n, "int64_t":$slots, "::mlir::Type":$value,
                     "::mlir::Type":$index, "::mlir::twell::Activation":$activation,
                     "float":$threshold), [{
      // -0.0 as 0.0, as the parser reads it: one predicate, one kernel name.
      return $_get($_ctxt, tile_n, slots, value, index, activation,
                   ::llvm::APFloat(threshold == 0.0f ? 0.0f : threshold));
    }]>
  ];
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The threshold as a float (the parameter is always an f32 APFloat).
    float getThresholdValue() const { return getThreshold().convertToFloat(); }
    /// Width of a column index, in bits.
    unsigned getIndexBits() const;
    /// Number of tiles of a row of d_ff columns.
    int64_t getNumTiles(int64_t d_ff) const { return (d_ff + getTileN() - 1) / getTileN(); }
  }];
}

//===----------------------------------------------------------------------===//
// #twell.target
//===----------------------------------------------------------------------===//

def Twell_TargetAttr : AttrDef<Twell_Dialect, "Target"> {
  let mnemonic = "target";
  let summary = "GPU architecture and the features kernels may use";
  let description = [{
    `#twell.target<"sm_90a", [wgmma, tma, multicast]>`. The arch string is part of a kernel's
    identity (ptxas for sm_90 rejects sm_90a PTX). Hopper-only features (wgmma, tma, multicast)
    require "sm_90a"; every arch may use the portable ones (mma_sync, cp_async).
  }];
  let parameters = (ins
    StringRefParameter<"compute architecture, sm_<major><minor>[a]">:$arch,
    Twell_FeatureListParameter:$features
  );
  let assemblyFormat = "`<` $arch `,` $features `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    bool hasFeature(::mlir::twell::Feature feature) const {
      return ::llvm::is_contained(getFeatures(), feature);
    }
    /// What the wgmma gate kernel (mainloop = wgmma) needs: the wgmma and tma features.
    bool hasWgmmaMainloopFeatures() const {
      return hasFeature(::mlir::twell::Feature::Wgmma) && hasFeature(::mlir::twell::Feature::Tma);
    }
    /// The compute capability, major * 10 + minor (90 for "sm_90a").
    int getComputeCapability() const;
    /// The target's default feature set: all Hopper features on sm_90a, the portable ones elsewhere.
    static ::llvm::SmallVector<::mlir::twell::Feature> defaultFeatures(::llvm::StringRef arch);
  }];
}

//===----------------------------------------------------------------------===//
// #twell.config
//===----------------------------------------------------------------------===//

def Twell_ConfigAttr : AttrDef<Twell_Dialect, "Config"> {
  let mnemonic = "config";
  let summary = "kernel configuration: CTA tile, block size and GEMM main loop";
  let description = [{
    `#twell.config<cta_m = 64, cta_k = 16, threads = 256>`: token rows per CTA (`cta_m`), the K
    step of the GEMM main loop (`cta_k`, gate kernel only; omitted means none) and threads per CTA.
    `mainloop` is the gate GEMM's main loop, `fma` (the default, omitted), `mma_sync` or `wgmma`; on
    a gated_down it names the main loop of the gate kernel that feeds it. `stages` is the depth of the
    gate kernel's shared-memory ring (cp.async for mma_sync, TMA for wgmma; 0, omitted, otherwise):
    `#twell.config<cta_m = 128, cta_k = 32, threads = 512, mainloop = mma_sync, stages = 4>`,
    `#twell.config<cta_m = 128, cta_k = 64, threads = 384, mainloop = wgmma, stages = 4>`.
    `cluster_m` (wgmma gate only; 1, omitted, otherwise) groups that many CTAs of consecutive M blocks
    into a thread-block cluster that shares each w_gate tile: every CTA loads 1 / cluster_m of it and
    TMA multicasts it to all (target feature `multicast`), which divides the w_gate bytes read from L2
    by cluster_m: `#twell.config<cta_m = 128, cta_k = 32, threads = 384, mainloop = wgmma, stages = 6,
    cluster_m = 2>`. `consumer` names a twell.gated_down / twell.down kernel's variant (required there,
    absent on a gate kernel's config): `cta_row` (cta_m = 1), `warp_row` (cta_m = threads / 32) or
    `token_block` (cta_m = 16, 256 threads, `stages` its cp.async ring):
    `#twell.config<cta_m = 8, threads = 256, mainloop = wgmma, consumer = warp_row>`.
  }];
  let parameters = (ins
    "int64_t":$cta_m,
    DefaultValuedParameter<"int64_t", "0", "K step of the GEMM main loop; 0 = none">:$cta_k,
    "int64_t":$threads,
    Twell_MainloopParameter:$mainloop,
    DefaultValuedParameter<"int64_t", "0", "cp.async pipeline stages (mma_sync gate); 0 = none">:$stages,
    DefaultValuedParameter<"int64_t", "1", "CTAs per cluster along M sharing the w_gate tile">:$cluster_m,
    Twell_ConsumerVariantParameter:$consumer
  );
  let builders = [
    // An fma configuration (no pipeline).
    AttrBuilder<(ins "int64_t":$cta_m, "int64_t":$cta_k, "int64_t":$threads), [{
      return $_get($_ctxt, cta_m, cta_k, threads, ::mlir::twell::Mainloop::Fma, 0, 1, ::mlir::twell::ConsumerVariant::None);
    }]>,
    // Without clusters (cluster_m = 1).
    AttrBuilder<(ins "int64_t":$cta_m, "int64_t":$cta_k, "int64_t":$threads, "::mlir::twell::Mainloop":$mainloop,
                     "int64_t":$stages), [{
      return $_get($_ctxt, cta_m, cta_k, threads, mainloop, stages, 1, ::mlir::twell::ConsumerVariant::None);
    }]>,
    // A consumer kernel's (no K loop, no cluster).
    AttrBuilder<(ins "::mlir::twell::ConsumerVariant":$consumer, "int64_t":$cta_m, "int64_t":$threads,
                     "::mlir::twell::Mainloop":$mainloop, "int64_t":$stages), [{
      return $_get($_ctxt, cta_m, 0, threads, mainloop, stages, 1, consumer);
    }]>
  ];
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

#endif  // TWELL_ATTRS_TD
