"""One rank of test_tensor_parallel_cpu.py's runs of scripts/tp_launch.sh (not a test file itself).

Builds a small random SparseLM in bf16 (the same weights on every rank: one seed), its tensor-parallel
copies (bench/sparse_lm/tp_model.py: heads and d_ff sharded), and runs tp_model.run_checks against the
single-process model and its fp32 copy: every layer's MLP, the logits, the KV-cache decode path.
Variants: "dense" (Megatron, bf16 all-reduce), "dense_fp32_reduce", the negative controls "broken"
(every rank holds rank 0's neurons, so some are summed twice and others never; at 2 ranks) and
"broken_attention" (every rank holds rank 0's heads), and with --twell
"twell" (twell.torch.TensorParallelSparseGatedMLP; needs a GPU).
Writes OUT/env_rank{r}.json (what this rank saw) and, on rank 0, OUT/results.json.
"""
import argparse
import copy
import json
import os
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "sparse_lm"))

import tp_model  # noqa: E402
from model import SparseLM, SparseLMConfig  # noqa: E402

CONFIG = SparseLMConfig(d_model=512, d_ff=1408, n_layers=2, n_heads=4, max_seq=64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--twell", action="store_true")
    args = p.parse_args()
    info = tp_model.init_distributed()
    out = pathlib.Path(args.out)
    env = {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "TWELL_TP_BACKEND")}
    (out / f"env_rank{info.rank}.json").write_text(json.dumps({
        "env": env, "rank": info.rank, "world": info.world, "device": str(info.device),
        "backend": torch.distributed.get_backend()}))

    torch.manual_seed(0)
    with torch.no_grad():
        full = SparseLM(CONFIG)
        for p_ in full.parameters():  # larger than the training init, so that every layer moves the logits
            if p_.dim() == 2:
                p_.normal_(0.0, 0.05)
        full = full.to(info.device, torch.bfloat16).eval()
        reference = copy.deepcopy(full).float()
        tp = {
            "dense": tp_model.tensor_parallel_copy(full, "dense"),
            "dense_fp32_reduce": tp_model.tensor_parallel_copy(full, "dense", reduce_dtype=torch.float32),
            "broken": tp_model.tensor_parallel_copy(full, "dense"),
            "broken_attention": tp_model.tensor_parallel_copy(full, "dense"),
        }
        for layer, source in zip(tp["broken"].layers, full.layers):
            first, last = layer.mlp.first, layer.mlp.last
            layer.mlp = tp_model.ColumnRowParallelMLP(source.mlp, first=0, last=last - first)
        for layer, source in zip(tp["broken_attention"].layers, full.layers):
            layer.self_attn = tp_model.HeadParallelAttention(source.self_attn, first=0, last=layer.self_attn.n_heads)
        single = {name: full for name in tp}
        if args.twell:
            import twell.torch

            tp["twell"] = tp_model.tensor_parallel_copy(full, "twell")
            single["twell"] = copy.deepcopy(full)
            twell.torch.sparsify_(single["twell"])

    shards = {"heads": [layer.self_attn.n_heads for layer in tp["dense"].layers],
              "kv_heads": None, "d_ff": [layer.mlp.last - layer.mlp.first for layer in tp["dense"].layers]}
    tp["dense"].allocate_kv_cache(2, 8)
    shards["kv_heads"] = tp["dense"].kv_cache.keys.shape[2]
    tp["dense"].free_kv_cache()

    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 256, (4, 48), generator=generator).to(info.device)
    decode_tokens = torch.randint(0, 256, (3, 24), generator=generator).to(info.device)
    with torch.inference_mode():
        results, ok = tp_model.run_checks(tp, single if info.rank == 0 else None, reference if info.rank == 0 else None,
                                          inputs, decode_tokens, prompt_len=16, batch=2)
    if info.rank == 0:
        (out / "results.json").write_text(json.dumps({"checks": results, "ok": ok, "shards": shards,
                                                      "world": info.world, "shared_device": info.shared_device}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
