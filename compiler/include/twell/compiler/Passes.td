// Passes of the twell compiler (ARCHITECTURE.md, "Flow of one kernel"): fuse / split the FFN, choose a
// kernel configuration, specialize, emit CUDA C++. Generated into Passes.h.inc (-gen-pass-decls).
#ifndef TWELL_COMPILER_PASSES_TD
#define TWELL_COMPILER_PASSES_TD

include "mlir/Pass/PassBase.td"

def TwellFuseGatedFfn : Pass<"twell-fuse-gated-ffn", "::mlir::func::FuncOp"> {
  let summary = "Fuse a twell.gate_matmul feeding one twell.gated_down into twell.gated_ffn";
  let description = [{
    Rewrites `%h = twell.gate_matmul %x, %wg` whose only use is
    `twell.gated_down %x, %h, %wu, %wd` (the same %x) into `twell.gated_ffn %x, %wg, %wu, %wd` with
    the layout of %h. Kernel attributes (target, config, kernel_name) are dropped: they describe the
    two kernels, not the fused op.
  }];
  let dependentDialects = ["::mlir::twell::TwellDialect"];
}

def TwellSplitGatedFfn : Pass<"twell-split-gated-ffn", "::mlir::func::FuncOp"> {
  let summary = "Split twell.gated_ffn into its two kernels, gate_matmul and gated_down";
  let description = [{
    The kernel-level form: the gate GEMM with the TwELL epilogue writes H, the gated consumer reads
    it. The inverse of twell-fuse-gated-ffn.
  }];
  let dependentDialects = ["::mlir::twell::TwellDialect"];
}

def TwellSelectConfig : Pass<"twell-select-config", "::mlir::func::FuncOp"> {
  let summary = "Attach a #twell.target and a #twell.config to every kernel op";
  let description = [{
    Sets `target` (the `target` option's arch with its default features: wgmma, tma, multicast on
    sm_90a; mma_sync, cp_async elsewhere) and `config` on each twell.gate_matmul and
    twell.gated_down that lacks them; attributes already present are kept. The configuration comes
    from a heuristic (twell/kernels/constraints.h). The gate kernel uses the tensor-core main loop,
    `mainloop = mma_sync`, wherever it is allowed (d_model % 8 == 0 and 64 <= tile_n <= 1024, on
    every target): cta_m = min(128, 32768 / tile_n), cta_k = 32, 256 threads and the deepest
    cp.async pipeline of 4, 3 or 2 stages whose shared memory fits 200 KiB. Otherwise it uses
    `mainloop = fma`: cta_m = 16384 / tile_n, cta_k = 16 (8 at tile_n = 1024, where 16 would overflow
    48 KiB of static shared memory), 256 threads. The gated consumer gets one token row per CTA,
    256 threads and the mainloop of the gate kernel producing its h (a gate kernel without a config
    whose consumer has one follows that config's mainloop where allowed). With `consumer=block` the
    consumer takes 16 token rows per CTA on tensor cores (cta_m = 16, 256 threads, the deepest cp.async
    ring of 6..3 stages that fits the target's shared memory) where the shape allows it. The wgmma
    gate (sm_90a: wgmma, tma) takes cta_k 64 (32 where d_model % 64 != 0), the deepest TMA ring that
    fits beside its staging area and `cluster-m` CTAs per cluster (default: 2 where the target has
    multicast). Each consumer of a tensor-core gate without a `decode` attribute gets one where
    DecodeKernelConstraints allow the decode kernels (not beside the token block, not on targets with
    99 KiB of shared memory per CTA): the consumer's own down layout, or the `decode` option's.

    With `tuning-file=<path>` (a file of the tuning database, twell/tuning_format.h: `twellc tune`'s
    output, one hardware and FFN spec), each FFN whose kernels lack a config takes the measured choice
    of the file's entry where it applies: the file's arch is the kernels' target, its spec is the
    FFN's (d_model, d_ff, gated, activation, threshold, dtype, and the user's w_down layout: the
    `decode` option's out_in / in_out where given, else the consumer's), and the TwELL configuration
    of the bucket holding `tokens` (0: the largest bucket; where the dense path won, its TwELL
    runner-up) has the tile_n and slots of the FFN's tensor type. It then gives the gate's `cluster_m`
    (where the target multicasts), the consumer variant (`token_block` where the shape allows it) and
    whether the decode kernels are emitted (not when every tuned bucket of at most 64 tokens chose
    them off). The layout itself is part of the tensor type and is not changed: a tuned tile_n or
    slots that differs leaves the heuristic in place (write the tuned layout in the IR, or let a plan
    choose it: PlanOptions::tuning). A non-default option (`consumer=block`, `cluster-m=1|2`,
    `decode=none`) wins over the file. An absent, unreadable or damaged file is a
    warning and reads as no entry. Each op the pass configures then carries
    `twell.config_source = "tuning-file <path> workload <w> bucket <tokens>: ..."` or
    `"heuristic (tuning-file <path>: <why not>)"`.
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"sm_90a\"",
           "GPU architecture, sm_<major><minor>[a]">,
    Option<"consumer", "consumer", "::mlir::twell::ConsumerChoice", /*default=*/"::mlir::twell::ConsumerChoice::Rows",
           "gated consumer variant", [{::llvm::cl::values(
             clEnumValN(::mlir::twell::ConsumerChoice::Rows, "rows", "one token row per warp or CTA"),
             clEnumValN(::mlir::twell::ConsumerChoice::Block, "block",
                        "16 token rows per CTA on tensor cores, where the shape allows it"))}]>,
    Option<"clusterM", "cluster-m", "int64_t", /*default=*/"0",
           "the wgmma gate's CTAs per cluster sharing the w_gate tile by TMA multicast: 1 or 2; 0 = 2 where "
           "the target has multicast, else 1">,
    Option<"decode", "decode", "::mlir::twell::DecodeChoice", /*default=*/"::mlir::twell::DecodeChoice::Auto",
           "the decode kernels' w_down layout", [{::llvm::cl::values(
             clEnumValN(::mlir::twell::DecodeChoice::Auto, "auto", "the consumer's down layout"),
             clEnumValN(::mlir::twell::DecodeChoice::OutIn, "out_in", "nn.Linear [d_model, d_ff]"),
             clEnumValN(::mlir::twell::DecodeChoice::InOut, "in_out", "[d_ff, d_model]"),
             clEnumValN(::mlir::twell::DecodeChoice::None, "none",
                        "no decode attribute (one already present is kept)"))}]>,
    Option<"tuningFile", "tuning-file", "std::string", /*default=*/"\"\"",
           "a tuning database file whose entry gives cluster_m, the consumer variant and the decode choice "
           "where it matches the FFN (see the description)">,
    Option<"tokens", "tokens", "int64_t", /*default=*/"0",
           "with tuning-file: the calls' token count whose bucket is taken (0: the largest bucket)">,
    Option<"tuningWorkload", "tuning-workload", "std::string", /*default=*/"\"\"",
           "with tuning-file: the workload (e.g. density:0.5%); empty: the most recently tuned">,
  ];
  let dependentDialects = ["::mlir::twell::TwellDialect"];
}

def TwellSpecialize : Pass<"twell-specialize", "::mlir::func::FuncOp"> {
  let summary = "Check every kernel is fully static and explicit, and name it";
  let description = [{
    Fails, naming the op and what is missing, when a twell.gated_ffn is left unsplit, a kernel lacks
    its target or config, or a size does not fit the kernels' int constants. Sets `kernel_name` on
    each kernel op: a C identifier that reads the shape and layout
    (`twell_gate_k2048_n5632_t256_s31_relu_bf16_1a2b3c4d`) and ends with a hash of every constant
    the emitted kernel depends on, so a kernel's identity changes whenever any of them does.
  }];
}

def TwellEmitCuda : Pass<"twell-emit-cuda", "::mlir::ModuleOp"> {
  let summary = "Print the CUDA C++ translation unit of every specialized kernel";
  let description = [{
    For lit tests and inspection: writes, for each specialized kernel op in order, a line
    `// ----- kernel <name> <kind> threads=.. cta_m=.. grid_y=.. smem_bytes=.. operand_alignment=..`
    followed by the translation unit that EmitCuda.h's emitCudaKernels returns, then each training
    op's kernel (`// ----- training kernel <name> <kind> ...`, EmitTraining.h), to stdout. The IR is
    unchanged.
  }];
}

#endif  // TWELL_COMPILER_PASSES_TD
