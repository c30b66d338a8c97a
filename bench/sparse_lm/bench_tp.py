"""Tensor-parallel whole-model benchmark: a trained SparseLM sharded over the ranks of a torch.distributed
group, dense PyTorch against twell, one process per GPU, bf16, under torch.inference_mode. Start it with
scripts/tp_launch.sh (NVLink multicast off in every process; backend nccl when there is a GPU per rank):

    scripts/tp_launch.sh 2 bench/sparse_lm/bench_tp.py --ckpt lm.pt --corpus gcide.dict.dz --json tp2.json
    scripts/tp_launch.sh 1 bench/sparse_lm/bench_tp.py --ckpt lm.pt --corpus gcide.dict.dz --json tp1.json

The sharding (tp_model.py), the same on every rank and in both variants except the MLP:
  - attention sharded by heads (column-parallel q/k/v, row-parallel o_proj, one bf16 all-reduce);
  - "dense": tp_model.ColumnRowParallelMLP, Megatron's column/row parallel MLP in plain PyTorch, one
    all-reduce per layer in bf16 (--dense-reduce fp32: in fp32, as twell's module does);
  - "twell": twell.torch.TensorParallelSparseGatedMLP (this rank's neurons, its own plan; fp32 all-reduce).
Every rank holds the embedding, norms and tied head (replicated).

Protocol: bench_model.py's (README.md, "Protocol"), its functions run in lockstep on every rank: held-out
CE; prefill of model.hidden at 64 x 2048 tokens (all ranks see the whole batch), CUDA-event medians over
alternating rounds; decode at batch 1, 8 and 64 with one greedy step (all-reduces included) captured in a
CUDA graph and replayed (eager when the backend is gloo, which graphs cannot capture). A barrier precedes
each timed phase. The table shows rank 0's numbers; every rank's medians go to --json.

Checks (exit status 1 when one fails, on every rank): tp_model.run_checks, each TP model against the
single-process model of the same weights on rank 0 (every layer's MLP on that layer's input, the logits
on the evaluation windows, a prefill plus 16 teacher-forced KV-cache decode steps), within
tp_model.TOLERANCE_FACTOR times the single model's own distance from the fp32 computation; and, as in
bench_model.py, |CE dense - CE twell| < 1e-3 nats/byte.
"""

import argparse
import copy
import json
import sys

import torch
import torch.distributed as dist

# At module level on purpose, as in bench_model.py: without twell there is nothing to compare.
import twell.torch

import tp_model
from bench_model import (CE_TOLERANCE, FULL, QUICK, BACKENDS, bench_decode, bench_prefill, calibrate_splits,
                         free_memory, markdown_table, resident_bytes, sparsified_copy)
from corpus import heldout_windows, load_tokens, split_heldout
from model import GatedMLP, load_checkpoint
from train import evaluate

CHECK_DECODE_BATCH = 8
CHECK_DECODE_STEPS = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="checkpoint written by train.py")
    p.add_argument("--corpus", required=True, help="the corpus the checkpoint was trained on (held-out split)")
    p.add_argument("--json", required=True, help="where rank 0 writes the results")
    p.add_argument("--quick", action="store_true", help="smoke run: fewer repetitions, smaller batches")
    p.add_argument("--heldout-frac", type=float, default=0.02, help="must match the training run's")
    p.add_argument("--split", action="store_true",
                   help="the hot/cold split of each rank's twell shard (SparseGatedMLP.calibrate_split)")
    p.add_argument("--dense-reduce", choices=("bf16", "fp32"), default="bf16",
                   help="dtype of the dense baseline's MLP all-reduce (bf16: Megatron's; twell's module uses fp32)")
    p.add_argument("--decode-graphs", choices=("auto", "on", "off"), default="auto",
                   help="capture the decode step in a CUDA graph (auto: with nccl; gloo cannot be captured)")
    return p.parse_args(argv)


def check_summary(checks):
    lines = []
    for name, entry in checks.items():
        parts = []
        for kind in ("mlp", "logits", "decode"):
            items = entry[kind] if isinstance(entry[kind], list) else [entry[kind]]
            worst = max(items, key=lambda c: c["tp_vs_single"] / c["tolerance"] if c["tolerance"] else float("inf"))
            where = f" (worst of {len(items)} layers)" if kind == "mlp" else ""
            verdict = "ok" if all(c["ok"] for c in items) else "FAIL"
            parts.append(f"{kind}{where} {worst['tp_vs_single']:.2e} <= {worst['tolerance']:.2e} "
                         f"(single vs fp32 {worst['single_vs_fp32']:.2e}): {verdict}")
        lines.append(f"{name}: " + "; ".join(parts))
    return lines


def main(argv=None):
    args = parse_args(argv)
    info = tp_model.init_distributed()
    rank, world, device = info.rank, info.world, info.device
    if device.type != "cuda":
        raise SystemExit("bench_tp.py needs a CUDA device per rank (twell's kernels)")
    graphs = args.decode_graphs == "on" or (args.decode_graphs == "auto" and info.backend == "nccl")
    if graphs and info.backend != "nccl":
        raise SystemExit("--decode-graphs on needs the nccl backend: gloo collectives cannot be captured")
    protocol = QUICK if args.quick else FULL
    _, heldout_cpu = split_heldout(load_tokens(args.corpus), args.heldout_frac)
    heldout = heldout_cpu.to(device)
    reduce_dtype = torch.float32 if args.dense_reduce == "fp32" else None

    # Built outside inference mode, as in bench_model.py. Every rank loads the whole checkpoint and keeps
    # its shards; rank 0 also keeps the single-process models (bf16 dense, twell, fp32) for the checks.
    with torch.no_grad():
        full, checkpoint = load_checkpoint(args.ckpt, device, torch.bfloat16)
        weights_bytes = {}
        weights_bytes["dense"], dense_tp = resident_bytes(
            lambda: tp_model.tensor_parallel_copy(full, "dense", reduce_dtype=reduce_dtype))
        weights_bytes["twell"], twell_tp = resident_bytes(lambda: tp_model.tensor_parallel_copy(full, "twell"))
        for model in (dense_tp, twell_tp):
            if any(isinstance(m, GatedMLP) for m in model.modules()):
                raise SystemExit("a GatedMLP was left in a tensor-parallel copy: its numbers would not be sharded")
        models = {"dense": dense_tp, "twell": twell_tp}
        dense_neurons = calibrate_splits(twell_tp, heldout) if args.split else None
        if rank == 0:
            single = {"dense": full, "twell": sparsified_copy(full)}
            reference = copy.deepcopy(full).float()
        else:
            single = reference = None
        del full
        free_memory()

    with torch.inference_mode():
        results = {
            "checkpoint": args.ckpt,
            "config": checkpoint["config"],
            "train_stats": {k: v for k, v in checkpoint["stats"].items() if k != "train_log"},
            "device": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "nccl": str(torch.cuda.nccl.version()) if info.backend == "nccl" else None,
            "twell": getattr(twell, "__version__", None),
            "quick": args.quick,
            "protocol": protocol,
            "tensor_parallel": {
                "degree": world,
                "backend": info.backend,
                "ranks_share_a_gpu": info.shared_device,
                "attention": "sharded by heads (q/k/v column-parallel, o_proj row-parallel, bf16 all-reduce), both variants",
                "dense_mlp": f"Megatron column/row parallel in PyTorch, {args.dense_reduce} all-reduce",
                "twell_mlp": "twell.torch.TensorParallelSparseGatedMLP, fp32 all-reduce",
                "decode_graphs": graphs,
            },
            "weights_bytes": weights_bytes,
        }

        # Equality with the single-process model, then the held-out CE of both TP models.
        inputs, targets = heldout_windows(heldout, protocol["eval_windows"], protocol["eval_seq"])
        decode_tokens, _ = heldout_windows(heldout, CHECK_DECODE_BATCH, protocol["prompt_len"] + CHECK_DECODE_STEPS)
        checks, checks_ok = tp_model.run_checks(models, single, reference, inputs, decode_tokens,
                                                protocol["prompt_len"], protocol["eval_batch"])
        evals = {name: evaluate(models[name], inputs, targets, protocol["eval_batch"], with_density=False) for name in BACKENDS}
        if rank == 0:
            single_eval = evaluate(single["dense"], inputs, targets, protocol["eval_batch"], with_density=True)
            density = single_eval["density_per_layer"]
            results["checks"] = checks
            results["heldout"] = {
                "tokens": targets.numel(),
                "ce": {name: evals[name]["ce"] for name in BACKENDS},
                "ce_single_process_dense": single_eval["ce"],
                "ce_abs_diff": abs(evals["dense"]["ce"] - evals["twell"]["ce"]),
                "density_per_layer": density,
                "density_mean": sum(density) / len(density),
            }
        del inputs, targets, decode_tokens, single, reference
        free_memory()

        inputs, targets = heldout_windows(heldout, protocol["prefill_batch"], protocol["prefill_seq"])
        dist.barrier()
        results["prefill"] = {"batch": protocol["prefill_batch"], "seq": protocol["prefill_seq"], **bench_prefill(models, inputs, protocol)}
        results["prefill"]["dense_ce"] = evaluate(dense_tp, inputs, targets, protocol["eval_batch"], with_density=False)["ce"]
        del inputs, targets
        free_memory()

        results["decode"] = {}
        for index, batch in enumerate(protocol["decode_batches"]):
            prompts, _ = heldout_windows(heldout, batch, protocol["prompt_len"])
            entry, generated = {}, {}
            for name in BACKENDS if index % 2 == 0 else BACKENDS[::-1]:
                dist.barrier()
                entry[name], generated[name] = bench_decode(models[name], prompts, protocol, graph=graphs)
                free_memory()
            entry["token_agreement"] = (generated["dense"] == generated["twell"]).float().mean().item()
            results["decode"][str(batch)] = entry

    mine = {
        "rank": rank,
        "device": str(device),
        "prefill_median_ms": {name: results["prefill"][name]["median_ms"] for name in BACKENDS},
        "decode_median_step_ms": {b: {name: e[name]["median_step_ms"] for name in BACKENDS} for b, e in results["decode"].items()},
        "heads": dense_tp.layers[0].self_attn.n_heads,
        "d_ff": [layer.mlp.last - layer.mlp.first for layer in dense_tp.layers],
        "weights_bytes": weights_bytes,
        "dense_neurons_per_layer": dense_neurons,
        "twell_paths": [{str(k): {"path": v, "ms": m.path_times.get(k)} for k, v in m.paths.items()}
                        for m in twell_tp.modules() if isinstance(m, twell.torch.SparseGatedMLP)],
    }
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mine)

    status = torch.zeros(1, device=device)  # fp32: see tp_model.run_checks
    if rank == 0:
        results["per_rank"] = per_rank
        failures = [] if checks_ok else ["a tensor-parallel output differs from the single-process one beyond the tolerance"]
        if results["heldout"]["ce_abs_diff"] >= CE_TOLERANCE:
            failures.append(f"held-out CE differs by {results['heldout']['ce_abs_diff']:.2e} >= {CE_TOLERANCE} nats")
        results["failures"] = failures
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"tensor parallel degree {world}, backend {info.backend}, {results['device']}; attention sharded by heads in both; "
              f"dense MLP: Megatron column/row, {args.dense_reduce} all-reduce; twell MLP: TensorParallelSparseGatedMLP, fp32 "
              f"all-reduce; decode {'CUDA graphs' if graphs else 'eager'}; table: rank 0")
        if info.shared_device:
            print("NOTE: ranks share a GPU (gloo): a functional check, the timings are not a measurement")
        print(markdown_table(results))
        print("single-process vs tensor-parallel (relative Frobenius difference <= tolerance):")
        for line in check_summary(checks):
            print("  " + line)
        for failure in failures:
            print(f"FAIL: {failure}", file=sys.stderr)
        status.fill_(1.0 if failures else 0.0)
    dist.broadcast(status, src=0)
    dist.destroy_process_group()
    if status.item():
        sys.exit(1)


if __name__ == "__main__":
    main()
