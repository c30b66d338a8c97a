// The twell dialect: TwELL (tile-wise ELLPACK) layouts of the hidden activation of sparse FFN layers,
// and the tensor-level operations that produce and consume them (../shared/design/ARCHITECTURE.md).
#ifndef TWELL_DIALECT_TD
#define TWELL_DIALECT_TD

include "mlir/IR/OpBase.td"

def Twell_Dialect : Dialect {
  let name = "twell";
  let cppNamespace = "::mlir::twell";
  let summary = "TwELL sparse FFN layers: layouts, kernels and their configuration";
  let description = [{
    The hidden activation H = act(x Wg^T) of a sparsity-trained FFN is stored in TwELL: the d_ff
    columns are cut into tiles of `tile_n` columns and every (row, tile) keeps at most `slots`
    packed (value, column) entries. The layout is an encoding attribute on ranked tensor types
    (`#twell.layout`), the way `sparse_tensor` encodings are; the ops are the gate GEMM that writes
    H in TwELL, the gated consumer that reads it, and their fused form.
  }];
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    // Defined next to the attribute storage classes (TwellAttrs.cpp), which must be complete there.
    void registerAttributes();
  }];
}

class Twell_Op<string mnemonic, list<Trait> traits = []> : Op<Twell_Dialect, mnemonic, traits>;

#endif  // TWELL_DIALECT_TD
