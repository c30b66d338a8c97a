// Operations of the twell dialect. They work on tensors: x [M, d_model] and the weights; M (tokens) may
// be dynamic, d_model and d_ff must be static. Element types are bf16 or f16, one per op, equal to the
// TwELL layout's value type. Every illegal combination is a verifier error naming the operand.
#ifndef TWELL_OPS_TD
#define TWELL_OPS_TD

include "twell/Dialect/TwellDialect.td"
include "twell/Dialect/TwellAttrs.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Twell_GateMatmulOp : Twell_Op<"gate_matmul", [Pure]> {
  let summary = "gate GEMM with activation, threshold and TwELL packing in the epilogue";
  let description = [{
    H = act(x Wg^T), keeping the entries that pass the layout's threshold, packed into TwELL by the
    GEMM's epilogue. x: [M, d_model]; w_gate: [d_ff, d_model] (nn.Linear layout); the result
    [M, d_ff] carries the `#twell.layout` encoding. `target`, `config` and `kernel_name` are set by
    twell-select-config and twell-specialize.

    ```mlir
    %h = twell.gate_matmul %x, %wg : (tensor<?x2048xbf16>, tensor<5632x2048xbf16>)
           -> tensor<?x5632xbf16, #twell.layout<...>>
    ```
  }];
  let arguments = (ins
    AnyTensor:$x,
    AnyTensor:$w_gate,
    OptionalAttr<Twell_TargetAttr>:$target,
    OptionalAttr<Twell_ConfigAttr>:$config,
    OptionalAttr<StrAttr>:$kernel_name
  );
  let results = (outs AnyTensor:$h);
  let assemblyFormat = "$x `,` $w_gate attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::twell::LayoutAttr getLayout();
  }];
}

def Twell_GatedDownOp : Twell_Op<"gated_down", [Pure]> {
  let summary = "gated consumer: up projection of the active neurons, gating, down projection";
  let description = [{
    y = (h ⊙ (x Wu^T)) Wd^T, computing the up projection only for the entries present in the TwELL
    tensor h. x: [M, d_model]; h: [M, d_ff] with a `#twell.layout` encoding; w_up: [d_ff, d_model];
    w_down: [d_model, d_ff] for `out_in` (nn.Linear, the default) or [d_ff, d_model] for `in_out`;
    y: [M, d_model].

    `decode`, where present: the emitter also makes this consumer's decode kernels (calls of at most
    64 tokens: runtime/device/twell/device/decode.cuh), which read w_down in that layout (a plan that
    gives this consumer an in_out copy of an out_in weight keeps its decode calls on the out_in one).
    twell-select-config sets it where DecodeKernelConstraints (KernelConstraints.h) allow them.
  }];
  let arguments = (ins
    AnyTensor:$x,
    AnyTensor:$h,
    AnyTensor:$w_up,
    AnyTensor:$w_down,
    DefaultValuedAttr<Twell_DownLayoutAttr, "::mlir::twell::DownLayout::OutIn">:$down_layout,
    OptionalAttr<Twell_TargetAttr>:$target,
    OptionalAttr<Twell_ConfigAttr>:$config,
    OptionalAttr<StrAttr>:$kernel_name,
    OptionalAttr<Twell_DownLayoutAttr>:$decode
  );
  let results = (outs AnyTensor:$y);
  let assemblyFormat = [{
    $x `,` $h `,` $w_up `,` $w_down attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::twell::LayoutAttr getLayout();
  }];
}

def Twell_DownOp : Twell_Op<"down", [Pure]> {
  let summary = "non-gated consumer: down projection of the active neurons";
  let description = [{
    y = h Wd^T over the entries present in the TwELL tensor h (a non-gated FFN's second layer: h is
    already act(x W1^T)). x: [M, d_model], read only to recompute the overflowing tile-rows the
    backup lacks (the gate's arithmetic); h: [M, d_ff] with a `#twell.layout` encoding; w_down:
    [d_model, d_ff] for `out_in` (nn.Linear, the default) or [d_ff, d_model] for `in_out`; y:
    [M, d_model]. Configs, and `decode`, as for twell.gated_down, without the token block.
  }];
  let arguments = (ins
    AnyTensor:$x,
    AnyTensor:$h,
    AnyTensor:$w_down,
    DefaultValuedAttr<Twell_DownLayoutAttr, "::mlir::twell::DownLayout::OutIn">:$down_layout,
    OptionalAttr<Twell_TargetAttr>:$target,
    OptionalAttr<Twell_ConfigAttr>:$config,
    OptionalAttr<StrAttr>:$kernel_name,
    OptionalAttr<Twell_DownLayoutAttr>:$decode
  );
  let results = (outs AnyTensor:$y);
  let assemblyFormat = [{
    $x `,` $h `,` $w_down attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::twell::LayoutAttr getLayout();
  }];
}

def Twell_GatedFfnOp : Twell_Op<"gated_ffn", [Pure]> {
  let summary = "sparse gated FFN layer: gate_matmul feeding gated_down";
  let description = [{
    y = (act(x Wg^T) ⊙ (x Wu^T)) Wd^T with the hidden activation in the TwELL `layout`. Operands as
    for twell.gate_matmul and twell.gated_down. twell-split-gated-ffn turns it into the two kernels.
  }];
  let arguments = (ins
    AnyTensor:$x,
    AnyTensor:$w_gate,
    AnyTensor:$w_up,
    AnyTensor:$w_down,
    Twell_LayoutAttr:$layout,
    DefaultValuedAttr<Twell_DownLayoutAttr, "::mlir::twell::DownLayout::OutIn">:$down_layout
  );
  let results = (outs AnyTensor:$y);
  let assemblyFormat = [{
    $x `,` $w_gate `,` $w_up `,` $w_down attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Twell_FfnOp : Twell_Op<"ffn", [Pure]> {
  let summary = "sparse non-gated FFN layer: gate_matmul feeding down";
  let description = [{
    y = act(x Wg^T) Wd^T with the hidden activation in the TwELL `layout` (Wg: the first linear
    layer, [d_ff, d_model]). Operands as for twell.gate_matmul and twell.down. twell-split-gated-ffn
    turns it into the two kernels.
  }];
  let arguments = (ins
    AnyTensor:$x,
    AnyTensor:$w_gate,
    AnyTensor:$w_down,
    Twell_LayoutAttr:$layout,
    DefaultValuedAttr<Twell_DownLayoutAttr, "::mlir::twell::DownLayout::OutIn">:$down_layout
  );
  let results = (outs AnyTensor:$y);
  let assemblyFormat = [{
    $x `,` $w_gate `,` $w_down attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Twell_TrainRowBackwardOp : Twell_Op<"train_row_backward", [Pure]> {
  let summary = "training backward by token row: dx and the gradients at h's entries";
  let description = [{
    The backward of a TwELL FFN layer's row-wise products (paper section 4, ../shared/design/TRAINING.md):
    for every entry j of row m in the forward's TwELL tensor h, dh = dy_m . Wd_j (+ lambda sign(h), the
    L1 term) gives dg (the gradient at the gate's pre-activation g) and, gated, du (at x Wu^T); then
    dx_m = sum_j dg_j Wg_j + du_j Wu_j. Entries that the forward kept in its backup (overflowing
    tile-rows) are recomputed with the gate's arithmetic, bit for bit.

    x, dy: [M, d_model]; h: [M, d_ff] with the forward's `#twell.layout` (its activation and threshold
    are the layer's); w_gate: [d_ff, d_model]; w_down: [d_ff, d_model] (in_out: the consumer's
    layout); w_up: [d_ff, d_model], present iff the layer is gated. Results: dx [M, d_model]; dg and
    (gated) du [M, d_ff] f32, logically dense, stored only at h's entries (the kernel writes one value
    per TwELL word). The element type of x, dy, the weights and dx is the layout's value type.
    `target` is set by twell-select-config, `kernel_name` by twell-specialize; the configuration is
    the contract's (TrainRowBackwardConstraints: one CTA or one warp per row), not an attribute.

    ```mlir
    %dx, %dg, %du = twell.train_row_backward %x, %dy, %h, %wg, %wd, %wu
        : (tensor<?x2048xbf16>, tensor<?x2048xbf16>, tensor<?x5632xbf16, #twell.layout<...>>,
           tensor<5632x2048xbf16>, tensor<5632x2048xbf16>, tensor<5632x2048xbf16>)
        -> (tensor<?x2048xbf16>, tensor<?x5632xf32>, tensor<?x5632xf32>)
    ```
  }];
  let arguments = (ins
    AnyTensor:$x,
    AnyTensor:$dy,
    AnyTensor:$h,
    AnyTensor:$w_gate,
    AnyTensor:$w_down,
    Optional<AnyTensor>:$w_up,
    OptionalAttr<Twell_TargetAttr>:$target,
    OptionalAttr<StrAttr>:$kernel_name
  );
  let results = (outs AnyTensor:$dx, AnyTensor:$dg, Optional<AnyTensor>:$du);
  let assemblyFormat = [{
    $x `,` $dy `,` $h `,` $w_gate `,` $w_down (`,` $w_up^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::twell::LayoutAttr getLayout();
  }];
}

def Twell_TrainWeightGradOp : Twell_Op<"train_weight_grad", [Pure]> {
  let summary = "training weight gradients from the entries of h";
  let description = [{
    The weight gradients of a TwELL FFN layer, per neuron over the rows where it is active (paper
    section 4): dWg_j = sum_m dg_mj x_m, dWu_j = sum_m du_mj x_m (gated), dWd^T_j = sum_m h_mj dy_m,
    in fp32 and in a fixed order (deterministic: no float atomics).

    x, dy: [M, d_model]; h: [M, d_ff] with its `#twell.layout`; dg and (gated) du: [M, d_ff] f32,
    twell.train_row_backward's results (read at h's entries only). Results, in this order: dw_gate,
    dw_down_t and (gated) dw_up, each [d_ff, d_model] f32 (dw_down_t is dWd^T, the in_out layout); du and
    dw_up are both present or both absent. `target` and `kernel_name` as for twell.train_row_backward; the
    per-neuron counters live in shared memory, so d_ff is bounded by the target's (TrainWeightGradConstraints).
  }];
  let arguments = (ins
    AnyTensor:$x,
    AnyTensor:$dy,
    AnyTensor:$h,
    AnyTensor:$dg,
    Optional<AnyTensor>:$du,
    OptionalAttr<Twell_TargetAttr>:$target,
    OptionalAttr<StrAttr>:$kernel_name
  );
  let results = (outs AnyTensor:$dw_gate, AnyTensor:$dw_down_t, Optional<AnyTensor>:$dw_up);
  let assemblyFormat = [{
    $x `,` $dy `,` $h `,` $dg (`,` $du^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::twell::LayoutAttr getLayout();
  }];
}

#endif  // TWELL_OPS_TD
