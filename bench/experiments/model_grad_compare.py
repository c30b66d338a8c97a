"""The whole model's gradients with twell's FFN training path against PyTorch's, on one batch of a model
trained for a while (issue 15: twell-trained runs ended with a higher held-out CE than dense ones).

Trains the byte-level model of bench/sparse_lm densely for --steps, then, on one fresh batch and the same
weights, computes the gradient of ce + l1_coef * l1 three ways: PyTorch in fp32 (no autocast: the
reference), PyTorch under bf16 autocast (what the dense runs train with) and twell (--ffn twell, dispatch
sparse, bf16 autocast). Prints, per parameter group, the relative error of each against the reference and
the cosine between twell's and the reference; then the same with l1_coef 0 (the L1 term's share).

  PYTHONPATH=python:bench/sparse_lm python bench/experiments/model_grad_compare.py --corpus gcide.dict.dz
"""
import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/sparse_lm")
import train as T  # noqa: E402
from model import GatedMLP  # noqa: E402


def grads(model, inputs, targets, backend, use_autocast, l1_coef):
    for m in model.modules():
        if isinstance(m, GatedMLP):
            m.backend, m.twell_dispatch = backend, "sparse"
    model.zero_grad(set_to_none=True)
    with T.autocast(inputs.device, use_autocast):
        logits, stats = model.forward_with_stats(inputs)
    loss = T.cross_entropy(logits, targets) + l1_coef * stats.l1.mean()
    loss.backward()
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--l1", type=float, default=3e-4)
    a = ap.parse_args()
    args = T.parse_args(["--corpus", a.corpus, "--out", "/tmp/grad_compare.pt", "--batch", "16", "--seq", "2048",
                         "--l1", str(a.l1), "--l1-warmup-frac", "0.1", "--steps", str(a.steps), "--seconds", "600"])
    model, _ = T.train(args)
    train_tokens, _ = T.split_heldout(T.load_tokens(args.corpus), args.heldout_frac)
    sampler = T.BatchSampler(train_tokens, 8, args.seq, torch.device("cuda"), seed=123)
    inputs, targets = sampler.sample()
    for l1_coef in (a.l1, 0.0):
        ref = grads(model, inputs, targets, "torch", False, l1_coef)
        dense = grads(model, inputs, targets, "torch", True, l1_coef)
        tw = grads(model, inputs, targets, "twell", True, l1_coef)
        print(f"\nl1_coef {l1_coef}: relative error against fp32 autograd (norm-wise), and cos(twell, fp32)")
        print(f"{'parameter':44} | {'bf16 autocast':>13} | {'twell':>9} | {'cos':>9} | {'|g| ref':>9}")
        for n, g in ref.items():
            if "mlp" not in n and "layers.0" not in n and "embed" not in n:
                continue
            e = lambda x: ((x - g).norm() / g.norm().clamp_min(1e-30)).item()
            cos = torch.nn.functional.cosine_similarity(tw[n].flatten(), g.flatten(), dim=0).item()
            print(f"{n:44} | {e(dense[n]):13.3e} | {e(tw[n]):9.3e} | {cos:9.6f} | {g.norm().item():9.3e}")


if __name__ == "__main__":
    main()
