"""Tensor parallelism for SparseLM (Megatron-style, over torch.distributed): every layer split across the
ranks of a process group, the rest of the model (embedding and tied head, norms, RoPE tables) replicated.

- Attention by heads: rank r holds heads [r H / world, (r + 1) H / world): those rows of each of the
  fused q, k and v projections (column-parallel) and those columns of o_proj (row-parallel); its KV cache
  holds only its heads. The partial o_proj outputs are summed by one all-reduce in the activation dtype
  (bf16), the same in both MLP variants below.
- MLP by d_ff (twell.torch.parallel.shard_rows: near-equal slices, multiples of 8 neurons), y summed by
  one all-reduce per layer:
    "dense": ColumnRowParallelMLP, plain PyTorch: gate_proj and up_proj column-parallel shards (their
             rows), down_proj a row-parallel shard (its columns), all-reduce in bf16 (Megatron's; fp32
             on request, as twell's module does);
    "twell": twell.torch.TensorParallelSparseGatedMLP (this rank's neurons in a SparseGatedMLP, the
             partial y summed in fp32, then rounded to bf16).
So each layer costs two all-reduces of [tokens, d_model] in both variants.

Launch: scripts/tp_launch.sh, which exports TWELL_TP_BACKEND and the NVLink-multicast variables;
init_distributed() checks them again here (scripts/tp_rank.py's check).
"""

import copy
import importlib.util
import os
import pathlib
from collections import namedtuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from model import Attention, GatedMLP

ROOT = pathlib.Path(__file__).resolve().parents[2]

# TP output vs single-process output (same weights), relative Frobenius norm, is accepted up to this
# many times the single-process bf16 model's own distance from the same computation in fp32. Why 3:
# sharding changes only where bf16 rounding happens (each rank's partial sum is rounded before the
# all-reduce, and GEMMs of other shapes accumulate in another order), so the TP result is another bf16
# evaluation of the same function, with an error of the order of the single one's, e. If the two errors
# were independent and equal their difference would be about 1.4 e, 2 e at worst when opposed; 3 e
# leaves room for the TP error to be up to ~2.8 e (the extra rounding of the partial sums). A wrong shard
# (a missing or duplicated head or neuron) gives differences of order 1, hundreds of times e. Measured on
# the CPU test's model (python/tests/tp_worker.py, 2 ranks): 0.87 e for the MLPs, the logits and the
# decode steps; its broken shardings 0.9-1.0, i.e. ~300 e.
TOLERANCE_FACTOR = 3.0

Distributed = namedtuple("Distributed", ["rank", "world", "local_rank", "device", "backend", "shared_device"])


def _tp_rank_module():
    spec = importlib.util.spec_from_file_location("tp_rank", ROOT / "scripts" / "tp_rank.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_launch_env(environ=None):
    """scripts/tp_rank.py's check: NVLink multicast off, TWELL_TP_BACKEND, torchrun's rank variables."""
    _tp_rank_module().check_launch_env(environ)


def init_distributed():
    """Checks the launch environment and joins the default process group (TWELL_TP_BACKEND; the rank,
    world and rendezvous from torch.distributed.run's variables). The device: cuda:LOCAL_RANK when
    there are enough GPUs, else cuda:(LOCAL_RANK mod GPUs) (ranks share a GPU: gloo only, a functional
    check), else the CPU (gloo)."""
    check_launch_env()
    backend = os.environ["TWELL_TP_BACKEND"]
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    shared = False
    if gpus:
        device = torch.device("cuda", local_rank % gpus)
        shared = local_world > gpus
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if backend == "nccl" and (device.type != "cuda" or shared):
        raise SystemExit(f"rank {os.environ['RANK']}: backend nccl needs one CUDA GPU per rank ({gpus} visible, {local_world} local ranks)")
    dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, device, backend, shared)


def all_reduce_(t, group=None):
    """Sums t over `group` in place (what the layers below call). On gloo, CUDA tensors of 16-bit floats
    are summed through an fp32 copy (gloo's CUDA paths are not relied on for them; only the functional
    checks with ranks sharing a GPU use gloo): the same result for 2 ranks, one rounding of the sum."""
    if t.is_cuda and t.dtype in (torch.bfloat16, torch.float16) and dist.get_backend(group) == "gloo":
        wide = t.float()
        dist.all_reduce(wide, op=dist.ReduceOp.SUM, group=group)
        t.copy_(wide)
    else:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)


def heads_of(n_heads, world, rank):
    """The heads [first, last) of `rank`: equal slices, so n_heads must be a multiple of world."""
    if n_heads % world:
        raise ValueError(f"{n_heads} heads do not split evenly over {world} ranks")
    per = n_heads // world
    return rank * per, (rank + 1) * per


def _linear(weight):
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


class HeadParallelAttention(Attention):
    """Heads [first, last) of a full `Attention` (Attention.forward over fewer heads), the partial o_proj
    output all-reduced (in its dtype) over `group`."""

    def __init__(self, attention, group=None, first=None, last=None):
        nn.Module.__init__(self)
        if first is None:
            first, last = heads_of(attention.n_heads, dist.get_world_size(group), dist.get_rank(group))
        self.group, self.first_head = group, first
        self.n_heads, self.head_dim = last - first, attention.head_dim
        d_model = attention.qkv_proj.weight.shape[1]
        with torch.no_grad():
            qkv = attention.qkv_proj.weight.view(3, attention.n_heads, attention.head_dim, d_model)
            self.qkv_proj = _linear(qkv[:, first:last].reshape(3 * self.n_heads * self.head_dim, d_model))
            self.o_proj = _linear(attention.o_proj.weight[:, first * self.head_dim:last * self.head_dim])

    def forward(self, *args, **kwargs):
        y = super().forward(*args, **kwargs)
        all_reduce_(y, self.group)
        return y


class ColumnRowParallelMLP(nn.Module):
    """The dense baseline: neurons [first, last) of a GatedMLP in plain PyTorch (gate_proj and up_proj
    rows: column-parallel; down_proj columns: row-parallel), then one all-reduce of y over `group` in
    `reduce_dtype` (default: x's dtype, as Megatron's row-parallel layer; torch.float32: as twell's)."""

    def __init__(self, mlp, group=None, first=None, last=None, reduce_dtype=None):
        super().__init__()
        from twell.torch.parallel import shard_rows  # the same neurons as the twell variant holds

        if first is None:
            first, last = shard_rows(mlp.gate_proj.weight.shape[0], dist.get_world_size(group), dist.get_rank(group))
        if last <= first:
            raise ValueError(f"d_ff {mlp.gate_proj.weight.shape[0]} leaves this rank no neurons")
        self.group, self.first, self.last, self.reduce_dtype = group, first, last, reduce_dtype
        with torch.no_grad():
            self.gate_proj = _linear(mlp.gate_proj.weight[first:last])
            self.up_proj = _linear(mlp.up_proj.weight[first:last])
            self.down_proj = _linear(mlp.down_proj.weight[:, first:last])
        self.act_fn = mlp.act_fn

    def forward(self, x):
        y = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        if self.reduce_dtype is None or self.reduce_dtype == y.dtype:
            all_reduce_(y, self.group)
            return y
        partial = y.to(self.reduce_dtype)
        all_reduce_(partial, self.group)
        return partial.to(y.dtype)


def tensor_parallel_copy(model, mlp="dense", group=None, reduce_dtype=None, **twell_options):
    """A copy of SparseLM `model` holding this rank's shard of every layer: HeadParallelAttention, and
    ColumnRowParallelMLP (mlp="dense") or twell.torch.TensorParallelSparseGatedMLP (mlp="twell", with
    `twell_options` for its SparseGatedMLP). `model` is left as it was. Call on every rank of `group`."""
    if mlp not in ("dense", "twell"):
        raise ValueError(f"mlp: expected 'dense' or 'twell', got {mlp!r}")
    tp = copy.deepcopy(model)
    for layer, source in zip(tp.layers, model.layers):
        if not isinstance(source.mlp, GatedMLP):
            raise TypeError(f"expected the dense model's GatedMLP, got {type(source.mlp).__name__}")
        layer.self_attn = HeadParallelAttention(source.self_attn, group)
        if mlp == "dense":
            layer.mlp = ColumnRowParallelMLP(source.mlp, group, reduce_dtype=reduce_dtype)
        else:
            import twell.torch

            layer.mlp = twell.torch.TensorParallelSparseGatedMLP.from_mlp(source.mlp, group, **twell_options)
    return tp


# ---- the equality checks (bench_tp.py, python/tests/test_tensor_parallel_cpu.py) -------------------

def rel_diff(a, b):
    """||a - b|| / ||b|| (Frobenius, fp32); 0 when both are 0."""
    a, b = a.float(), b.float()
    diff, norm = (a - b).norm().item(), b.norm().item()
    if norm == 0:
        return 0.0 if diff == 0 else float("inf")
    return diff / norm


def compare(tp, single, reference, factor=TOLERANCE_FACTOR):
    """TP vs single-process outputs, with the single one's distance from the fp32 reference as the
    scale of bf16 rounding (TOLERANCE_FACTOR says why)."""
    scale = rel_diff(single, reference)
    diff = rel_diff(tp, single)
    return {
        "tp_vs_single": diff,
        "single_vs_fp32": scale,
        "tp_vs_fp32": rel_diff(tp, reference),
        "max_abs_diff": (tp.float() - single.float()).abs().max().item(),
        "tolerance": factor * scale,
        "ok": diff <= factor * scale,
    }


def forward_logits(model, inputs, batch):
    """model(inputs) [N, T, vocab] in fp32, `batch` rows at a time (collective for a TP model)."""
    return torch.cat([model(inputs[i:i + batch]).float() for i in range(0, inputs.shape[0], batch)])


def decode_logits(model, tokens, prompt_len):
    """Prefills tokens[:, :prompt_len] into a fresh KV cache, then decode_step over the remaining tokens
    (teacher forcing: the given tokens, not the model's choices): logits [B, T - prompt_len + 1, vocab]
    in fp32 (the prefill's last position, then one per step). Frees the cache."""
    batch, seq = tokens.shape
    model.allocate_kv_cache(batch, seq)
    try:
        out = [model.prefill(tokens[:, :prompt_len])[:, -1].float()]
        pos = torch.empty((), dtype=torch.long, device=tokens.device)
        for t in range(prompt_len, seq):
            pos.fill_(t)
            out.append(model.decode_step(tokens[:, t:t + 1], pos).float())
    finally:
        model.free_kv_cache()
    return torch.stack(out, dim=1)


def mlp_inputs(model, inputs):
    """The input of every layer's MLP during model.hidden(inputs), in layer order."""
    captured = []
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, a: captured.append(a[0].detach().clone())) for layer in model.layers]
    try:
        model.hidden(inputs)
    finally:
        for h in hooks:
            h.remove()
    return captured


def fp32_mlp(mlp, x):
    """The GatedMLP's function in fp32 (weights and input upcast): the reference of the MLP checks."""
    g = F.linear(x.float(), mlp.gate_proj.weight.float())
    u = F.linear(x.float(), mlp.up_proj.weight.float())
    return F.linear(mlp.act_fn(g) * u, mlp.down_proj.weight.float())


def run_checks(tp_models, single_models, reference, inputs, decode_tokens, prompt_len, batch):
    """The equality checks of the TP models (dict name -> model, every rank) against the single-process
    models of the same weights (dict name -> model, rank 0 only; None elsewhere), with the fp32 dense
    model `reference` (rank 0) as the bf16 scale:
      - "mlp": every layer's MLP on that layer's input in the single dense model (taken on rank 0,
        broadcast: every rank computes the TP MLP on the same tensor);
      - "logits": the whole model's logits on inputs [N, T] (`batch` rows at a time);
      - "decode": prefill of decode_tokens[:, :prompt_len] and teacher-forced decode steps after it.
    Collective: call on every rank. Returns (results on rank 0 / None elsewhere, ok on every rank)."""
    rank = dist.get_rank()
    results = {name: {} for name in tp_models} if rank == 0 else None

    # MLPs, layer by layer
    some_model = next(iter(tp_models.values()))
    rows = inputs[:batch]
    xs = mlp_inputs(single_models["dense"], rows) if rank == 0 else None
    for i in range(len(some_model.layers)):
        weight = some_model.embed_tokens.weight
        # Sent as fp32 (exact for bf16 and fp16) so that gloo never sees a 16-bit CUDA tensor.
        x = xs[i].float() if rank == 0 else torch.empty(*rows.shape, weight.shape[1], device=weight.device)
        dist.broadcast(x, src=0)
        x = x.to(weight.dtype)
        for name, model in tp_models.items():
            y = model.layers[i].mlp(x)
            if rank == 0:
                single = single_models[name].layers[i].mlp(x)
                ref = fp32_mlp(reference.layers[i].mlp, x)
                results[name].setdefault("mlp", []).append(compare(y, single, ref))

    # whole model: logits, and the KV-cache decode path
    ref_logits = forward_logits(reference, inputs, batch) if rank == 0 else None
    ref_decode = decode_logits(reference, decode_tokens, prompt_len) if rank == 0 else None
    for name, model in tp_models.items():
        logits = forward_logits(model, inputs, batch)
        decoded = decode_logits(model, decode_tokens, prompt_len)
        if rank == 0:
            results[name]["logits"] = compare(logits, forward_logits(single_models[name], inputs, batch), ref_logits)
            results[name]["decode"] = compare(decoded, decode_logits(single_models[name], decode_tokens, prompt_len), ref_decode)
    # fp32 on purpose: the one CUDA dtype every path here has sent through gloo (ranks sharing a GPU).
    ok = torch.tensor([1.0 if rank != 0 or all_ok(results) else 0.0], device=some_model.embed_tokens.weight.device)
    dist.broadcast(ok, src=0)
    return results, bool(ok.item())


def all_ok(results):
    return all(entry["ok"] for checks in results.values() for check in checks.values()
               for entry in (check if isinstance(check, list) else [check]))
