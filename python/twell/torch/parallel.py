"""Tensor parallelism through torch.distributed: an MLP sharded along d_ff across the ranks of a
process group. Rank r holds the neurons [r d_ff / world, (r + 1) d_ff / world): those rows of
gate_proj and up_proj and those columns of down_proj. Its own twell plan computes their part of y,
and an all-reduce sums the parts (Megatron's column/row split of an MLP, which needs no
communication between the two projections; the FFN is a sum over neurons).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .._errors import InvalidArgumentError
from .modules import SparseGatedMLP, _activation_of


def shard_rows(d_ff: int, world: int, rank: int) -> tuple[int, int]:
    """The neurons [first, last) of `rank`: d_ff split into `world` near-equal slices, each a multiple
    of 8 neurons (twell's 16-byte weight-row alignment) except possibly the last."""
    for name, value in (("d_ff", d_ff), ("world", world), ("rank", rank)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgumentError(f"twell.torch.parallel: {name}: expected an int, got {value!r}")
    if d_ff < 1 or world < 1:
        raise InvalidArgumentError(f"twell.torch.parallel: d_ff and world: expected >= 1, got {d_ff} and {world}")
    if not 0 <= rank < world:
        raise InvalidArgumentError(f"twell.torch.parallel: rank: expected 0..{world - 1}, got {rank}")
    per = -(-d_ff // world)
    per = -(-per // 8) * 8
    first = min(d_ff, rank * per)
    return first, min(d_ff, first + per)


class TensorParallelSparseGatedMLP(nn.Module):
    """This rank's slice of a gated MLP (twell.torch.SparseGatedMLP over its neurons) and the
    all-reduce of y over `group`. The partial y are summed in fp32 (then rounded to x's dtype), so the
    result does not depend on the reduction order more than fp32 rounding allows.

    Build it on every rank of the group from the same full MLP (from_mlp), or from this rank's
    slices directly."""

    def __init__(self, local: SparseGatedMLP, group: dist.ProcessGroup | None = None):
        super().__init__()
        self.local, self.group = local, group

    @classmethod
    def from_mlp(cls, mlp: nn.Module, group: dist.ProcessGroup | None = None, *, threshold: float | None = None,
                 **options) -> "TensorParallelSparseGatedMLP":
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        d_ff = mlp.gate_proj.weight.shape[0]
        first, last = shard_rows(d_ff, world, rank)
        if last <= first:
            raise InvalidArgumentError(f"twell.torch.parallel: d_ff {d_ff} leaves rank {rank} of {world} no neurons")

        def linear(weight: Tensor) -> nn.Linear:
            out_features, in_features = weight.shape
            lin = nn.Linear(in_features, out_features, bias=False, device=weight.device, dtype=weight.dtype)
            with torch.no_grad():
                lin.weight.copy_(weight)
            return lin

        with torch.no_grad():
            gate = linear(mlp.gate_proj.weight[first:last])
            up = linear(mlp.up_proj.weight[first:last])
            down = linear(mlp.down_proj.weight[:, first:last].contiguous())
        local = SparseGatedMLP(gate, up, down, **_options_of(mlp, threshold), **options)
        return cls(local, group)

    def forward(self, x: Tensor) -> Tensor:
        partial = self.local(x).float()
        dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=self.group)
        return partial.to(x.dtype)


def _options_of(mlp: nn.Module, threshold: float | None) -> dict:
    """The activation and threshold SparseGatedMLP.from_mlp would take (its checks and messages)."""
    activation = _activation_of(mlp)
    if activation is None or (activation == "silu" and threshold is None):
        SparseGatedMLP.from_mlp(mlp, threshold=threshold)  # raises the explanation
    return {"activation": activation, "threshold": 0.0 if threshold is None else threshold}
