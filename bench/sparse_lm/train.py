"""Trains SparseLM on a byte corpus for a number of steps or a wall-clock budget: cross-entropy plus an L1
penalty on the FFN hidden activations h (../shared/design/TRAINING.md), AdamW, bf16 autocast over fp32 master weights.

The schedules follow the fraction of --steps done (the same schedule at the same step whatever each step
costs: runs of two FFN paths compare step for step; --seconds then only stops a run that is too slow),
or, without --steps, the fraction of the --seconds budget spent: linear warm-up, then cosine decay of the
learning rate to --min-lr-ratio of the peak; the L1 coefficient ramps from 0 over --l1-warmup-frac, because the penalty at full strength from
the first step drives neurons to zero before the gate has learned anything (dead neurons, higher loss).

Logs JSON lines (about every --log-every seconds, synchronizing only then); at the end evaluates the
held-out windows and writes a checkpoint (model.save_checkpoint) with the final statistics.

    python bench/sparse_lm/train.py --corpus build/data/gcide.dict.dz --l1 3e-4 --seconds 150 --out lm.pt
"""

import argparse
import contextlib
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from corpus import BatchSampler, heldout_windows, load_tokens, split_heldout
from model import GatedMLP, SparseLM, SparseLMConfig, save_checkpoint


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="gzip/dictzip byte corpus (scripts/fetch_gcide.sh)")
    p.add_argument("--out", required=True, help="checkpoint path to write")
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--d-ff", type=int, default=5632)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--max-seq", type=int, default=2048, help="RoPE table length (>= --seq; the benchmark's prefill uses 2048)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final learning rate / peak")
    p.add_argument("--warmup-frac", type=float, default=0.05, help="learning-rate warm-up, fraction of the run")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--l1", type=float, default=2e-5, help="L1 coefficient on sum_j |h_j| (mean over tokens and layers)")
    p.add_argument("--l1-warmup-frac", type=float, default=0.1, help="L1 ramp from 0, fraction of the run")
    p.add_argument("--seconds", type=float, default=None,
                   help="wall-clock budget of the training loop (default 150); with --steps only a cap (default none)")
    p.add_argument("--steps", type=int, default=None, help="schedule and stop by steps (--seconds then only caps the wall-clock time; the final line's steps says "
                        "where a capped run stopped)")
    p.add_argument("--eval-windows", type=int, default=16, help="held-out windows of --seq bytes for the final evaluation")
    p.add_argument("--heldout-frac", type=float, default=0.02)
    p.add_argument("--log-every", type=float, default=10.0, help="seconds between log lines")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ffn", choices=("torch", "twell"), default="torch",
                   help="the FFNs' training path: PyTorch autograd, or twell's sparse forward and backward "
                        "(twell.torch.sparse_ffn_train, dispatch as --twell-dispatch)")
    p.add_argument("--twell-dispatch", choices=("auto", "sparse", "twell_dense"), default="auto",
                   help="--ffn twell: auto = per layer and token bucket the fastest whole step of twell's TwELL path, twell's "
                        "dense path and PyTorch, re-timed every --recalibrate-every steps (which also releases twell's "
                        "plans); sparse = twell's TwELL path always; twell_dense = twell's dense path always")
    p.add_argument("--twell-split", action="store_true",
                   help="--ffn twell: one step before each re-timing, order every layer's neurons most active first "
                        "(weights and AdamW moments: twell.torch.training.reorder_neurons_) and set its training split "
                        "(dense_neurons) from twell's cost model (hot_first_split); auto then times the split as twell's "
                        "TwELL candidate")
    p.add_argument("--recalibrate-every", type=int, default=200,
                   help="--ffn twell: steps between re-timings of twell against PyTorch (the density falls as training goes)")
    args = p.parse_args(argv)
    if args.seconds is None:
        args.seconds = math.inf if args.steps else 150.0
    if args.twell_split and (args.ffn != "twell" or args.twell_dispatch != "auto"):
        p.error("--twell-split needs --ffn twell --twell-dispatch auto (a layer the cost model sends to twell's dense "
                "path keeps dense_neurons 0 and reaches that path through auto's timing)")
    if args.seq > args.max_seq:
        p.error(f"--seq {args.seq} exceeds --max-seq {args.max_seq}")
    return args


def lr_multiplier(progress, warmup_frac, min_ratio):
    """Multiplier of the peak learning rate at `progress` in [0, 1]: linear warm-up, then cosine to min_ratio."""
    if progress < warmup_frac:
        return progress / warmup_frac
    decay = min(1.0, (progress - warmup_frac) / max(1e-9, 1.0 - warmup_frac))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * decay))


def schedule_progress(args, step, elapsed):
    """The schedules' position in [0, 1]: with --steps the step's alone (--seconds only stops the run: a
    path whose first steps are slow, such as twell's JIT compiles and dense early phase, must not ramp the
    L1 term and the learning rate ahead of another path's at the same step), else the time spent."""
    return min(1.0, step / args.steps if args.steps else elapsed / args.seconds)


def autocast(device, enabled):
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def cross_entropy(logits, targets, reduction="mean"):
    # fp32 logits: a bf16 log-softmax over 256 classes loses about 1e-2 nats.
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)


@torch.no_grad()
def evaluate(model, inputs, targets, batch, with_density=True, use_autocast=False):
    """Cross-entropy (nats per byte) over all tokens of the windows inputs/targets [N, T], and, when
    with_density (the model's MLPs must then be GatedMLP), the FFN density per layer over the same tokens.
    Returns {"ce": float, "density_per_layer": [float] or None}."""
    was_training = model.training
    model.eval()
    ce_sum = torch.zeros((), dtype=torch.float64, device=inputs.device)
    density_sum = None
    for i in range(0, inputs.shape[0], batch):
        x, y = inputs[i : i + batch], targets[i : i + batch]
        with autocast(inputs.device, use_autocast):
            if with_density:
                logits, stats = model.forward_with_stats(x)
                weighted = stats.density.double() * y.numel()
                density_sum = weighted if density_sum is None else density_sum + weighted
            else:
                logits = model(x)
        ce_sum += cross_entropy(logits, y, reduction="sum").double()
    model.train(was_training)
    tokens = targets.numel()
    return {"ce": (ce_sum / tokens).item(), "density_per_layer": (density_sum / tokens).tolist() if with_density else None}


def param_groups(model, weight_decay):
    # Decay the matrices only: decaying RMSNorm gains pulls them toward 0, which only rescales the
    # normalized stream and fights the next layer's weights.
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices, "weight_decay": weight_decay}, {"params": vectors, "weight_decay": 0.0}]


def log(record):
    print(json.dumps(record), flush=True)


def prepare_twell(mlps, args):
    """Makes every layer's twell training plans at once, in threads (twell.torch.training.prepare): a new
    split compiles its kernels (about 2 s each on the H200's host), and the layers' first calls would make
    them one after another (bench/README.md v63)."""
    from twell.torch import training as twell_training

    futures = []
    for mlp in mlps:
        if mlp.gate_proj.weight.device.type != "cuda":
            continue
        # (the fp32 master weights: the calls take their bf16 casts under autocast)
        futures.append(twell_training.prepare(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight,
                                              tokens=args.batch * args.seq, dtype=torch.bfloat16,
                                              dispatch=args.twell_dispatch, dense_neurons=mlp.twell_dense_neurons))
    for f in futures:
        f.result()


def train(args):
    """Runs the training described by args (parse_args); returns (model, final statistics)."""
    device = torch.device(args.device)
    use_autocast = device.type == "cuda"
    torch.manual_seed(args.seed)
    train_tokens, heldout_tokens = split_heldout(load_tokens(args.corpus), args.heldout_frac)
    sampler = BatchSampler(train_tokens, args.batch, args.seq, device, seed=args.seed)
    config = SparseLMConfig(args.d_model, args.d_ff, args.layers, args.heads, args.max_seq)
    model = SparseLM(config).to(device)
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    for i, mlp in enumerate(mlps):
        mlp.backend, mlp.twell_key, mlp.twell_dispatch = args.ffn, 1000 + i, args.twell_dispatch
    optimizer = torch.optim.AdamW(
        param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda"
    )
    n_params = sum(p.numel() for p in model.parameters())
    log({"config": vars(config), "parameters": n_params, "train_bytes": train_tokens.numel(), "heldout_bytes": heldout_tokens.numel()})

    train_log = []
    start = last_log = time.perf_counter()
    last_log_step = 0
    step = 0
    recalibrated_at = None  # the step whose re-timing already started (its plans prepared: not dropped again)
    if args.ffn == "twell" and use_autocast:
        prepare_twell(mlps, args)  # (timed: part of the run)
        recalibrated_at = 0
    while True:
        elapsed = time.perf_counter() - start
        # The clock is read before the step is enqueued; the GPU trails the host by at most a few
        # steps (the launch queue), a negligible error for a budget of minutes.
        progress = schedule_progress(args, step, elapsed)
        if progress >= 1.0 or elapsed >= args.seconds:
            break
        lr = args.lr * lr_multiplier(progress, args.warmup_frac, args.min_lr_ratio)
        l1_coef = args.l1 * min(1.0, progress / args.l1_warmup_frac) if args.l1_warmup_frac > 0 else args.l1
        for group in optimizer.param_groups:
            group["lr"] = lr

        if args.ffn == "twell" and step % args.recalibrate_every == 0 and recalibrated_at != step:
            from twell.torch import training as twell_training
            twell_training.recalibrate()
        inputs, targets = sampler.sample()
        split_now = args.ffn == "twell" and args.twell_split and (step + 1) % args.recalibrate_every == 0
        for mlp in mlps:
            mlp.capture = split_now
        with autocast(device, use_autocast):
            logits, stats = model.forward_with_stats(inputs)
        ce = cross_entropy(logits, targets)
        l1 = stats.l1.mean()
        loss = ce + l1_coef * l1
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if split_now:  # before the next step's re-timing: the neurons hot-first, each layer's split
            from twell.torch import training as twell_training
            splits = []
            for mlp in mlps:
                if mlp.captured is None:  # (not through twell: off CUDA)
                    continue
                order, n = twell_training.hot_first_split(mlp.captured, mlp.gate_proj.weight,
                                                          tokens=args.batch * args.seq)
                twell_training.reorder_neurons_(order, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight,
                                                optimizer)
                mlp.twell_dense_neurons = n if n < mlp.gate_proj.weight.shape[0] else 0
                mlp.captured, mlp.capture = None, False
                splits.append(n)
            log({"step": step, "twell_split": splits})
            # The next step re-times: forget the decisions now and make the new splits' plans together.
            twell_training.recalibrate()
            recalibrated_at = step
            prepare_twell(mlps, args)

        now = time.perf_counter()
        if step == 1 or now - last_log >= args.log_every:
            record = {
                "step": step,
                "seconds": round(now - start, 1),
                "lr": lr,
                "l1_coef": l1_coef,
                "ce": round(ce.item(), 4),
                "l1": round(l1.item(), 3),
                "density": [round(d, 5) if d == d else None for d in stats.density.tolist()],
                "peak_torch_mb": round(torch.cuda.max_memory_allocated() / 2**20) if device.type == "cuda" else None,
                "tokens_per_s": round((step - last_log_step) * args.batch * args.seq / (time.perf_counter() - last_log)),
            }
            train_log.append(record)
            log(record)
            last_log, last_log_step = time.perf_counter(), step
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.perf_counter() - start

    inputs, targets = heldout_windows(heldout_tokens.to(device), args.eval_windows, args.seq)
    result = evaluate(model, inputs, targets, args.batch, use_autocast=use_autocast)
    density = result["density_per_layer"]
    stats = {
        "ffn": args.ffn,
        "steps": step,
        "train_seconds": round(train_seconds, 1),
        "ms_per_step": round(1e3 * train_seconds / max(step, 1), 2),
        # torch's own peak, and the device's whole use at the end (twell's plans and states are allocated
        # outside torch's allocator and live for the run: the second minus torch's reserved bytes).
        "peak_torch_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20) if device.type == "cuda" else None,
        "device_used_mb_end": round((torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]) / 2**20)
        if device.type == "cuda" else None,
        "torch_reserved_mb_end": round(torch.cuda.memory_reserved() / 2**20) if device.type == "cuda" else None,
        "tokens_seen": step * args.batch * args.seq,
        "heldout_ce": result["ce"],
        "heldout_density_per_layer": density,
        "heldout_density_mean": sum(density) / len(density),
        "heldout_tokens": targets.numel(),
        "train_log": train_log,
    }
    if args.ffn == "twell" and args.twell_split:  # each layer's last training split (0: none)
        stats["twell_dense_neurons"] = [m.twell_dense_neurons for m in mlps]
    if args.ffn == "twell":  # which path each layer's buckets took at the last timing, and the times (ms)
        from twell.torch import training as twell_training
        stats["twell_dispatch"] = [{"layer": d["bucket"][0] - 1000, "path": d["path"], "ms": d["ms"]}
                                   for d in twell_training.dispatch_decisions()]
    log({"final": {k: v for k, v in stats.items() if k != "train_log"}})
    return model, stats


def main(argv=None):
    args = parse_args(argv)
    model, stats = train(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_checkpoint(args.out, model, stats, vars(args))
    return model, stats


if __name__ == "__main__":
    main()
