"""twell from PyTorch: the `twell::sparse_gated_ffn` and `twell::sparse_ffn` operators, the
SparseGatedMLP module and sparsify_ (README, "PyTorch").

    import twell.torch
    twell.torch.sparsify_(model)     # Llama/Qwen-style ReLU MLPs -> twell, in place
    y = model(x)
    y, l1 = twell.torch.sparse_ffn_train(x, w_gate, w_up, w_down)   # training: sparse forward and backward
"""
from . import ops, parallel
from ._plans import cached_plans, clear as clear_plans, set_context_options
from .modules import SparseGatedMLP, sparsify_
from .ops import dense_reference, sparse_ffn, sparse_gated_ffn
from .training import sparse_ffn_train
from .parallel import TensorParallelSparseGatedMLP

__all__ = ["SparseGatedMLP", "sparsify_", "sparse_gated_ffn", "sparse_ffn", "dense_reference", "ops", "parallel",
           "TensorParallelSparseGatedMLP", "set_context_options", "cached_plans", "clear_plans", "sparse_ffn_train"]
