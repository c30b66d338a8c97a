"""Whole-model benchmark of a trained SparseLM: the dense model against a copy whose FFNs
`twell.torch.sparsify_` replaced, in one process on one GPU, bf16, under torch.inference_mode.

Measured (README.md, "Protocol"):
  - held-out cross-entropy of both on the same windows, and their difference (must be < 1e-3 nats);
  - prefill: model.hidden (the decoder without the LM head) at 64 x 2048 tokens, the paper's protocol,
    CUDA-event median over timed runs in alternating rounds; peak memory above the resident weights;
  - decode at batch 1, 8 and 64: a 256-byte prompt prefilled, then one greedy decode step captured in a
    CUDA graph and replayed, the median replay; peak memory of cache, graph pool and workspaces;
  - the FFN density of the dense model on the held-out tokens.
Prints a markdown table and writes every number to --json. Exits 1 when the cross-entropies differ by
1e-3 nats or more, or when sparsify_ left a GatedMLP in place.

    python bench/sparse_lm/bench_model.py --ckpt lm.pt --corpus build/data/gcide.dict.dz --json bench.json
"""

import argparse
import copy
import json
import statistics
import sys

import torch

# At module level on purpose: without twell the benchmark has nothing to compare, so a missing or
# broken package must stop it with the import error, never fall back to dense-only numbers.
import twell.torch

from corpus import heldout_windows, load_tokens, split_heldout
from model import GatedMLP, load_checkpoint
from train import evaluate

CE_TOLERANCE = 1e-3  # nats per byte: twell computes the same function, only the summation order differs

FULL = {
    "eval_windows": 16, "eval_seq": 1024, "eval_batch": 16,
    "prefill_batch": 64, "prefill_seq": 2048, "prefill_rounds": 2, "prefill_warmup": 3, "prefill_timed_per_round": 10,
    "decode_batches": [1, 8, 64], "prompt_len": 256, "decode_steps": 64, "decode_warmup": 3,
}
QUICK = {
    "eval_windows": 4, "eval_seq": 1024, "eval_batch": 4,
    "prefill_batch": 8, "prefill_seq": 2048, "prefill_rounds": 1, "prefill_warmup": 1, "prefill_timed_per_round": 3,
    "decode_batches": [1, 8], "prompt_len": 256, "decode_steps": 16, "decode_warmup": 3,
}
BACKENDS = ("dense", "twell")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="checkpoint written by train.py")
    p.add_argument("--corpus", required=True, help="the corpus the checkpoint was trained on (held-out split)")
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--quick", action="store_true", help="smoke run: fewer repetitions, smaller batches")
    p.add_argument("--heldout-frac", type=float, default=0.02, help="must match the training run's")
    p.add_argument("--split", action="store_true",
                   help="the hot/cold split per layer (SparseGatedMLP.calibrate_split on held-out calibration tokens)")
    return p.parse_args(argv)


def free_memory():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


class PeakMemory:
    """Peak bytes allocated inside the block above what was allocated on entry (so the other backend's
    resident weights do not count), and the bytes still held on exit (lazily allocated workspaces)."""

    def __enter__(self):
        free_memory()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.peak_extra_bytes = torch.cuda.max_memory_allocated() - self.base
        self.retained_bytes = torch.cuda.memory_allocated() - self.base


def time_calls(fn, count):
    """CUDA-event milliseconds of `count` back-to-back calls, one interval per call; one synchronization
    at the end, so host launch latency overlaps the previous call as in a real serving loop."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def bench_prefill(models, inputs, protocol):
    """Alternating rounds (dense, twell, twell, dense, ...) of warm-up + timed model.hidden(inputs)."""
    times = {name: [] for name in BACKENDS}
    memory = {}
    for round_index in range(protocol["prefill_rounds"]):
        order = BACKENDS if round_index % 2 == 0 else BACKENDS[::-1]
        for name in order:
            model = models[name]
            with PeakMemory() as peak:
                for _ in range(protocol["prefill_warmup"]):
                    model.hidden(inputs)
                times[name] += time_calls(lambda: model.hidden(inputs), protocol["prefill_timed_per_round"])
            if name not in memory:  # the first round includes the first calls' lazy allocations
                memory[name] = {"peak_extra_bytes": peak.peak_extra_bytes, "retained_bytes": peak.retained_bytes}
            free_memory()
    tokens = inputs.numel()
    result = {}
    for name in BACKENDS:
        median_ms = statistics.median(times[name])
        result[name] = {"median_ms": median_ms, "tokens_per_ms": tokens / median_ms, "times_ms": times[name], **memory[name]}
    dense_hidden = models["dense"].hidden(inputs).float()
    twell_hidden = models["twell"].hidden(inputs).float()
    result["hidden_rel_diff"] = ((twell_hidden - dense_hidden).norm() / dense_hidden.norm()).item()
    del dense_hidden, twell_hidden
    free_memory()
    return result


def bench_decode(model, prompts, protocol, graph=True):
    """Greedy decoding after prompts [B, prompt_len]: one step (decode_step, argmax, pos += 1) captured in
    a CUDA graph and replayed decode_steps times (graph=False: the step run eagerly instead, for models
    whose step cannot be captured, e.g. bench_tp.py's over gloo). Returns timings, memory and the
    generated bytes."""
    batch, prompt_len = prompts.shape
    steps = protocol["decode_steps"]
    with PeakMemory() as peak:
        # The warm-up steps run at positions after the prompt too, so the cache must hold them.
        model.allocate_kv_cache(batch, prompt_len + max(steps, protocol["decode_warmup"]))
        tokens = torch.empty(batch, 1, dtype=torch.long, device=prompts.device)
        pos = torch.empty((), dtype=torch.long, device=prompts.device)
        # Written by the graph itself, so that reading the output adds nothing between timed replays.
        generated = torch.zeros(batch, max(steps, protocol["decode_warmup"]), dtype=torch.long, device=prompts.device)

        def start_from_prompt():
            logits = model.prefill(prompts)
            tokens.copy_(logits[:, -1].argmax(-1, keepdim=True))
            pos.fill_(prompt_len)

        def step():
            logits = model.decode_step(tokens, pos)
            tokens.copy_(logits.argmax(-1, keepdim=True))
            generated.index_copy_(1, (pos - prompt_len).view(1), tokens)
            pos.add_(1)

        start_from_prompt()
        if graph:
            # PyTorch's CUDA-graph rule: warm up on a side stream before capture; twell's ops also choose
            # their kernels per token-count bucket on first calls, synchronizing then, which capture forbids.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(protocol["decode_warmup"]):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                step()
            start_from_prompt()  # the warm-up advanced pos; the capture itself ran nothing
            times = time_calls(cuda_graph.replay, steps)
            del cuda_graph
        else:
            for _ in range(protocol["decode_warmup"]):
                step()
            start_from_prompt()
            times = time_calls(step, steps)
        model.free_kv_cache()
    median_ms = statistics.median(times)
    result = {
        "median_step_ms": median_ms,
        "tokens_per_s": batch / (median_ms / 1e3),
        "times_ms": times,
        "peak_extra_bytes": peak.peak_extra_bytes,
    }
    return result, generated[:, :steps]


def resident_bytes(build):
    """Bytes that stay allocated after build() (a model's weights and buffers), and build()'s result."""
    free_memory()
    before = torch.cuda.memory_allocated()
    value = build()
    free_memory()
    return torch.cuda.memory_allocated() - before, value


def sparsified_copy(model):
    twell_model = copy.deepcopy(model)
    twell.torch.sparsify_(twell_model)
    left = sum(isinstance(m, GatedMLP) for m in twell_model.modules())
    if left:
        raise SystemExit(f"twell.torch.sparsify_ left {left} GatedMLP modules in place: the twell numbers would be dense")
    return twell_model


def calibrate_splits(twell_model, heldout, batch=4, seq=2048):
    """SparseGatedMLP.calibrate_split per layer on that layer's inputs for `batch` x `seq` held-out
    tokens (the windows at the end of the held-out split; the evaluation's are evenly spaced from its
    start), for prefill-sized calls. Returns dense_neurons per layer."""
    mlps = [m for m in twell_model.modules() if isinstance(m, twell.torch.SparseGatedMLP)]
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda m, a: inputs.__setitem__(m, a[0].detach())) for m in mlps]
    tokens = heldout[-(batch * seq + 1):-1].reshape(batch, seq).long()  # bytes (uint8) -> embedding indices
    with torch.no_grad():
        twell_model.hidden(tokens)
    for h in hooks:
        h.remove()
    return [m.calibrate_split(inputs[m], tokens=16384) for m in mlps]


def markdown_table(results):
    # (metric, dense, twell, format): CE needs more digits than the ratios it is compared by.
    heldout, prefill = results["heldout"], results["prefill"]
    rows = [("held-out CE (nats/byte)", heldout["ce"]["dense"], heldout["ce"]["twell"], ".5f")]
    rows.append((f"prefill {prefill['batch']}x{prefill['seq']} tokens/ms", prefill["dense"]["tokens_per_ms"], prefill["twell"]["tokens_per_ms"], ".1f"))
    rows.append(("prefill peak extra (GiB)", prefill["dense"]["peak_extra_bytes"] / 2**30, prefill["twell"]["peak_extra_bytes"] / 2**30, ".3f"))
    for batch, entry in results["decode"].items():
        rows.append((f"decode batch {batch} tokens/s", entry["dense"]["tokens_per_s"], entry["twell"]["tokens_per_s"], ".0f"))
        rows.append((f"decode batch {batch} peak extra (MiB)", entry["dense"]["peak_extra_bytes"] / 2**20, entry["twell"]["peak_extra_bytes"] / 2**20, ".1f"))
    rows.append(("weights (MiB)", results["weights_bytes"]["dense"] / 2**20, results["weights_bytes"]["twell"] / 2**20, ".1f"))
    lines = ["| metric | dense | twell | twell / dense |", "|---|---:|---:|---:|"]
    for name, dense, sparse, fmt in rows:
        ratio = f"{sparse / dense:.3f}" if dense else "-"
        lines.append(f"| {name} | {dense:{fmt}} | {sparse:{fmt}} | {ratio} |")
    lines.append("")
    lines.append(
        f"CE |dense - twell| = {heldout['ce_abs_diff']:.2e} nats; FFN density (dense, held-out) = "
        f"{100 * heldout['density_mean']:.3f}% (per layer {', '.join(f'{100 * d:.2f}%' for d in heldout['density_per_layer'])}); "
        f"prefill hidden relative difference = {prefill['hidden_rel_diff']:.2e}"
    )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_model.py needs a CUDA device")
    protocol = QUICK if args.quick else FULL
    device = torch.device("cuda")
    _, heldout_cpu = split_heldout(load_tokens(args.corpus), args.heldout_frac)
    heldout = heldout_cpu.to(device)

    # Built outside inference mode: parameters made there would be inference tensors, which deepcopy
    # and module surgery may not handle.
    with torch.no_grad():
        weights_bytes = {}
        weights_bytes["dense"], (dense_model, checkpoint) = resident_bytes(lambda: load_checkpoint(args.ckpt, device, torch.bfloat16))
        weights_bytes["twell"], twell_model = resident_bytes(lambda: sparsified_copy(dense_model))
        models = {"dense": dense_model, "twell": twell_model}
        dense_neurons = calibrate_splits(twell_model, heldout) if args.split else None

    with torch.inference_mode():
        results = {
            "checkpoint": args.ckpt,
            "config": checkpoint["config"],
            "train_stats": {k: v for k, v in checkpoint["stats"].items() if k != "train_log"},
            "device": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "twell": getattr(twell, "__version__", None),
            "quick": args.quick,
            "protocol": protocol,
            "weights_bytes": weights_bytes,
            "dense_neurons_per_layer": dense_neurons,
        }

        inputs, targets = heldout_windows(heldout, protocol["eval_windows"], protocol["eval_seq"])
        dense_eval = evaluate(dense_model, inputs, targets, protocol["eval_batch"], with_density=True)
        twell_eval = evaluate(twell_model, inputs, targets, protocol["eval_batch"], with_density=False)
        density = dense_eval["density_per_layer"]
        results["heldout"] = {
            "tokens": targets.numel(),
            "ce": {"dense": dense_eval["ce"], "twell": twell_eval["ce"]},
            "ce_abs_diff": abs(dense_eval["ce"] - twell_eval["ce"]),
            "density_per_layer": density,
            "density_mean": sum(density) / len(density),
        }
        del inputs, targets
        free_memory()

        inputs, targets = heldout_windows(heldout, protocol["prefill_batch"], protocol["prefill_seq"])
        results["prefill"] = {"batch": protocol["prefill_batch"], "seq": protocol["prefill_seq"], **bench_prefill(models, inputs, protocol)}
        # Positions beyond the training length (train.py --seq) can activate more neurons: the
        # prefill's own density and CE show whether the timed input is representative.
        prefill_eval = evaluate(dense_model, inputs, targets, protocol["eval_batch"], with_density=True)
        results["prefill"]["dense_ce"] = prefill_eval["ce"]
        results["prefill"]["density_mean"] = sum(prefill_eval["density_per_layer"]) / len(prefill_eval["density_per_layer"])
        del inputs, targets
        free_memory()

        results["decode"] = {}
        for index, batch in enumerate(protocol["decode_batches"]):
            prompts, _ = heldout_windows(heldout, batch, protocol["prompt_len"])
            entry, generated = {}, {}
            for name in BACKENDS if index % 2 == 0 else BACKENDS[::-1]:
                entry[name], generated[name] = bench_decode(models[name], prompts, protocol)
                free_memory()
            # Greedy paths diverge after the first bf16 near-tie, so this is information, not a test.
            entry["token_agreement"] = (generated["dense"] == generated["twell"]).float().mean().item()
            results["decode"][str(batch)] = entry

    # Which path each layer's dispatch "auto" took per token bucket, and the times that chose it.
    results["twell_paths"] = [{str(k): {"path": v, "ms": m.path_times.get(k)} for k, v in m.paths.items()}
                              for m in twell_model.modules() if isinstance(m, twell.torch.SparseGatedMLP)]
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(markdown_table(results))
    if results["heldout"]["ce_abs_diff"] >= CE_TOLERANCE:
        print(f"FAIL: held-out CE differs by {results['heldout']['ce_abs_diff']:.2e} >= {CE_TOLERANCE} nats", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
