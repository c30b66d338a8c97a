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

#endif  // TWELL_OPS_TD
