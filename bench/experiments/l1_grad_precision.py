"""How exactly each training path applies the L1 term's gradient (bench/README.md v44): one FFN layer
at the paper's shape with the magnitudes of bench/sparse_lm's training (x unit RMS, dy ~ 3e-5, the
penalty coef * sum |h| / tokens with coef = 3e-4 / 4 layers), gradients of (y * dy).sum() + coef * l1 for
fp32 master weights, against fp32 autograd on the same bf16 values:
  torch  the model's path (bench/sparse_lm/model.py GatedMLP.forward_with_stats under bf16 autocast)
  twell  twell.torch.sparse_ffn_train on bf16 copies of the masters
Prints norm-wise relative errors, with dy (the real step) and with dy = 0 (the L1 term's gradient alone).
    PYTHONPATH=python python bench/experiments/l1_grad_precision.py"""
import math

import torch
import torch.nn.functional as F

import twell.torch as tt


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main(tokens=32768, d_model=2048, d_ff=5632, density=0.005, coef=3e-4 / 4, dy_scale=3e-5):
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, d_model, generator=gen)
    x[:, 0] = 1
    wg = torch.randn(d_ff, d_model, generator=gen) * 0.02
    sigma = wg[:, 1:].norm(dim=1)
    wg[:, 0] = -sigma * float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - density)))
    wu = torch.randn(d_ff, d_model, generator=gen) * 0.02
    wd = torch.randn(d_model, d_ff, generator=gen) * 0.02
    x, wg, wu, wd = (t.to(dev, torch.bfloat16).float() for t in (x, wg, wu, wd))  # bf16 values, fp32 masters
    for label, scale in (("with dy", dy_scale), ("L1 term alone (dy = 0)", 0.0)):
        dy = torch.randn(tokens, d_model, device=dev) * scale

        def grads(step):
            masters = [t.clone().requires_grad_() for t in (wg, wu, wd)]
            y, l1 = step(*masters)
            ((y.float() * dy).sum() + coef * l1).backward()
            return [m.grad for m in masters]

        def reference(g_, u_, d_):
            g16 = F.linear(x.to(torch.bfloat16), g_.to(torch.bfloat16)).float()
            g = F.linear(x, g_)
            g = g + (g16 - g).detach()
            h = F.relu(g) * (g16 > 0) * F.linear(x, u_)
            return F.linear(h, d_), h.abs().sum(-1).mean()

        def torch_path(g_, u_, d_):
            with torch.autocast("cuda", torch.bfloat16):
                a = F.relu(F.linear(x, g_))
                h = a * F.linear(x, u_)
                return F.linear(h, d_), h.abs().sum(-1, dtype=torch.float32).mean()

        def twell_path(g_, u_, d_):
            b = torch.bfloat16
            return tt.sparse_ffn_train(x.to(b), g_.to(b), u_.to(b), d_.to(b), dispatch="sparse")

        ref = grads(reference)
        for name, step in (("torch bf16 autocast", torch_path), ("twell", twell_path)):
            got = grads(step)
            print(f"{label:24s} {name:20s} " + "  ".join(f"{w} {rel(g, r):.2e}" for w, g, r in zip(("dWg", "dWu", "dWd"), got, ref)),
                  flush=True)


if __name__ == "__main__":
    main()
