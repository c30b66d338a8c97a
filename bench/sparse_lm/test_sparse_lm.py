"""CPU tests of the corpus, the model, its KV-cache decoding and the training loop (tiny shapes, seconds).

Run: python -m pytest bench/sparse_lm -q
Each model test checks against a computation written independently here (explicit softmax attention,
complex-number RoPE, matrix products), not against the module's own helpers.
"""

import gzip
import importlib
import math
import random
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import corpus
import train
from model import GatedMLP, SparseLM, SparseLMConfig, load_checkpoint

TINY = SparseLMConfig(d_model=64, d_ff=176, n_layers=2, n_heads=4, max_seq=64)
TINY_ARGS = ["--d-model", "64", "--d-ff", "176", "--layers", "2", "--heads", "4", "--max-seq", "64",
             "--batch", "8", "--seq", "32", "--lr", "3e-3", "--steps", "30", "--seconds", "1e9",
             "--eval-windows", "8", "--l1-warmup-frac", "0.2", "--device", "cpu", "--log-every", "1e9"]
STRONG_L1 = 0.03  # at this shape it drives the density from ~50% to well under 1% within 30 steps


def write_gzip(path, data):
    path.write_bytes(gzip.compress(data))
    return str(path)


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    """~150 KB of sentences drawn from 100 common words: structure a tiny model learns in 30 steps."""
    words = ("the of and to in is was that for it with as his on be at by had are but from or have an they "
             "which one you were her all she there would their we him been has when who will more no if out so "
             "said what up its about into than them can only other new some could time these two may then do "
             "first any my now such like our over man me even most made after also did many before must through "
             "back years where much your way well down should because each just those people").split()
    rng = random.Random(0)
    lines = (" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + "." for _ in range(4000))
    return write_gzip(tmp_path_factory.mktemp("corpus") / "text.gz", "\n".join(lines).encode())


# ---- corpus ----

def test_load_tokens_and_split(tmp_path):
    data = bytes(range(256)) * 40
    tokens = corpus.load_tokens(write_gzip(tmp_path / "c.gz", data))
    assert tokens.dtype == torch.uint8 and tokens.tolist() == list(data)
    train_part, heldout = corpus.split_heldout(tokens, 0.02)
    assert heldout.numel() == int(len(data) * 0.02)
    assert torch.equal(torch.cat([train_part, heldout]), tokens)


def test_batches_are_next_byte_windows_of_the_train_split(tmp_path):
    # Train bytes count up modulo 251; the held-out tail is all 255, a value the train part never has.
    data = bytes(i % 251 for i in range(4900)) + bytes([255]) * 100
    train_part, heldout = corpus.split_heldout(corpus.load_tokens(write_gzip(tmp_path / "c.gz", data)), 0.02)
    assert heldout.numel() == 100 and (heldout == 255).all()
    sampler = corpus.BatchSampler(train_part, batch=16, seq=40, device="cpu", seed=1)
    starts = set()
    for _ in range(50):
        inputs, targets = sampler.sample()
        assert inputs.shape == targets.shape == (16, 40) and inputs.dtype == targets.dtype == torch.int64
        assert (inputs != 255).all() and (targets != 255).all()
        assert torch.equal(targets, (inputs + 1) % 251)
        assert torch.equal(inputs[:, 1:], (inputs[:, :-1] + 1) % 251)
        starts.update(inputs[:, 0].tolist())
    assert len(starts) > 100  # random starts, not a fixed few
    again = corpus.BatchSampler(train_part, batch=16, seq=40, device="cpu", seed=1).sample()
    first = corpus.BatchSampler(train_part, batch=16, seq=40, device="cpu", seed=1).sample()
    assert torch.equal(again[0], first[0])


def test_heldout_windows_are_evenly_spaced_and_reach_the_end():
    tokens = torch.arange(1000) % 251
    inputs, targets = corpus.heldout_windows(tokens.to(torch.uint8), 5, 100)
    for row, start in enumerate([0, 225, 450, 674, 899]):  # round(linspace(0, 899, 5))
        assert inputs[row].tolist() == tokens[start : start + 100].tolist()
        assert targets[row].tolist() == tokens[start + 1 : start + 101].tolist()


# ---- model ----

def test_gated_mlp_is_a_llama_style_mlp():
    torch.manual_seed(0)
    mlp = GatedMLP(64, 176)
    for name, shape in (("gate_proj", (176, 64)), ("up_proj", (176, 64)), ("down_proj", (64, 176))):
        linear = getattr(mlp, name)
        assert isinstance(linear, nn.Linear) and linear.bias is None and linear.weight.shape == shape
    assert isinstance(mlp.act_fn, nn.ReLU)
    x = torch.randn(3, 5, 64)
    gate = x @ mlp.gate_proj.weight.T
    h = gate.clamp(min=0) * (x @ mlp.up_proj.weight.T)
    expected = h @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(x), expected)
    y, l1, density = mlp.forward_with_stats(x)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(l1, h.abs().sum(-1).mean())
    assert density.item() == pytest.approx((gate > 0).double().mean().item())
    assert 0.3 < density.item() < 0.7  # random weights: about half the gates open


def reference_logits(model, idx):
    """The documented architecture written out: RMSNorm, RoPE (Llama half-split, via complex numbers),
    causal softmax attention with an explicit mask, ReLU-gated MLP, tied head."""
    config = model.config
    head_dim = config.d_model // config.n_heads
    batch, seq = idx.shape

    def rms_norm(x, weight):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight

    def rope(x):  # [B, H, T, head_dim]
        freqs = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        rotation = torch.polar(torch.ones(seq, head_dim // 2, dtype=torch.float64), torch.arange(seq)[:, None] * freqs)
        z = torch.complex(x[..., : head_dim // 2].double(), x[..., head_dim // 2 :].double()) * rotation
        return torch.cat([z.real, z.imag], -1).float()

    x = model.embed_tokens.weight[idx]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    for layer in model.layers:
        a = rms_norm(x, layer.input_layernorm.weight)
        q, k, v = (a @ layer.self_attn.qkv_proj.weight.T).split(config.d_model, -1)
        q, k, v = (t.view(batch, seq, config.n_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(head_dim)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + attn.transpose(1, 2).reshape(batch, seq, config.d_model) @ layer.self_attn.o_proj.weight.T
        m = rms_norm(x, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        x = x + ((m @ mlp.gate_proj.weight.T).clamp(min=0) * (m @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    return rms_norm(x, model.norm.weight) @ model.embed_tokens.weight.T


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    model = SparseLM(TINY).eval()
    # Non-unit norm gains, so that a norm applied without its weight would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


def test_forward_matches_reference(tiny_model):
    idx = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(tiny_model(idx), reference_logits(tiny_model, idx), atol=1e-5, rtol=1e-4)
        hidden = tiny_model.hidden(idx)
        assert hidden.shape == (2, 24, 64)
        torch.testing.assert_close(hidden @ tiny_model.embed_tokens.weight.T, tiny_model(idx))


def test_forward_with_stats_matches_per_layer_computation(tiny_model):
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    captured = []
    hooks = [layer.mlp.register_forward_hook(lambda m, inp, out: captured.append(inp[0])) for layer in tiny_model.layers]
    with torch.no_grad():
        logits = tiny_model(idx)
        stats_logits, stats = tiny_model.forward_with_stats(idx)
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(stats_logits, logits)
    assert stats.l1.shape == stats.density.shape == (TINY.n_layers,)
    for i, (layer, x) in enumerate(zip(tiny_model.layers, captured)):
        gate = x @ layer.mlp.gate_proj.weight.T
        h = gate.clamp(min=0) * (x @ layer.mlp.up_proj.weight.T)
        torch.testing.assert_close(stats.l1[i], h.abs().sum(-1).mean())
        assert stats.density[i].item() == pytest.approx((gate > 0).double().mean().item())


@pytest.mark.parametrize("batch,prompt_len", [(1, 1), (3, 5), (2, 17)])
def test_kv_cache_decoding_reproduces_forward(tiny_model, batch, prompt_len):
    seq = 24
    idx = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = tiny_model(idx)
        tiny_model.allocate_kv_cache(batch, seq + 4)  # longer than used: the mask must hide the rest
        tiny_model.kv_cache.keys.fill_(1e3)  # garbage in unwritten positions must not leak in
        tiny_model.kv_cache.values.fill_(1e3)
        torch.testing.assert_close(tiny_model.prefill(idx[:, :prompt_len]), expected[:, :prompt_len], atol=1e-5, rtol=1e-5)
        pos = torch.tensor(prompt_len)
        for p in range(prompt_len, seq):
            logits = tiny_model.decode_step(idx[:, p : p + 1], pos)
            assert logits.shape == (batch, 256)
            torch.testing.assert_close(logits, expected[:, p], atol=1e-5, rtol=1e-5)
            pos.add_(1)  # in place, as a CUDA-graph replay loop advances it
    tiny_model.free_kv_cache()


def test_kv_cache_rejects_a_mismatched_batch(tiny_model):
    tiny_model.allocate_kv_cache(2, 8)
    with pytest.raises(ValueError):
        tiny_model.prefill(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        tiny_model.allocate_kv_cache(1, TINY.max_seq + 1)


# ---- training ----

def test_lr_multiplier_warms_up_then_decays_to_the_floor():
    f = lambda p: train.lr_multiplier(p, 0.1, 0.1)
    assert f(0.0) == 0.0 and f(0.05) == pytest.approx(0.5) and f(0.1) == pytest.approx(1.0)
    assert f(0.55) == pytest.approx(0.55) and f(1.0) == pytest.approx(0.1)
    values = [f(0.1 + 0.09 * i) for i in range(11)]
    assert all(a > b for a, b in zip(values, values[1:]))


@pytest.fixture(scope="module")
def trained(text_corpus, tmp_path_factory):
    """Two 30-step runs from the same seed: without L1 and with a strong L1."""
    out = tmp_path_factory.mktemp("runs")
    runs = {}
    for name, l1 in (("dense", 0.0), ("sparse", STRONG_L1)):
        path = str(out / f"{name}.pt")
        model, stats = train.main(["--corpus", text_corpus, "--out", path, "--l1", str(l1), *TINY_ARGS])
        runs[name] = (model, stats, path)
    return runs


def test_training_lowers_the_loss(trained):
    for model, stats, _ in trained.values():
        assert stats["steps"] == 30
        assert stats["train_log"][0]["ce"] > math.log(256) - 0.2  # untrained: about uniform over bytes
        assert stats["heldout_ce"] < 3.6  # the unigram distribution of this text is ~3.0 nats


def test_strong_l1_lowers_the_density(trained):
    dense_density = trained["dense"][1]["heldout_density_mean"]
    sparse_density = trained["sparse"][1]["heldout_density_mean"]
    assert dense_density > 0.2
    assert sparse_density < 0.1 * dense_density


def test_checkpoint_round_trip(trained, text_corpus):
    model, stats, path = trained["sparse"]
    loaded, checkpoint = load_checkpoint(path, "cpu", torch.float32)
    assert loaded.config == model.config
    assert checkpoint["stats"]["heldout_ce"] == stats["heldout_ce"]
    assert checkpoint["args"]["l1"] == STRONG_L1
    original = model.state_dict()
    assert set(loaded.state_dict()) == set(original)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name].to(torch.bfloat16).float()), name
    # The loaded model's held-out numbers match the evaluation of the original with bf16-rounded weights.
    heldout = corpus.split_heldout(corpus.load_tokens(text_corpus))[1]
    inputs, targets = corpus.heldout_windows(heldout, 8, 32)
    rounded = SparseLM(model.config)
    rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in original.items()})
    assert train.evaluate(loaded, inputs, targets, 8) == train.evaluate(rounded, inputs, targets, 8)


def test_training_stops_at_the_time_budget(text_corpus, tmp_path):
    args = [a for a in TINY_ARGS]
    args[args.index("--steps") : args.index("--steps") + 2] = []
    args[args.index("--seconds") + 1] = "0.5"
    _, stats = train.main(["--corpus", text_corpus, "--out", str(tmp_path / "t.pt"), *args])
    assert stats["steps"] >= 1 and 0.5 <= stats["train_seconds"] < 5.0


def test_the_schedule_follows_the_steps_when_given():
    # Slow first steps (a JIT compile) must not move a --steps run's schedule: the step alone decides.
    steps_run = train.parse_args(["--corpus", "c", "--out", "o", "--steps", "500"])
    assert steps_run.seconds == float("inf")
    assert train.schedule_progress(steps_run, 8, 14.0) == 8 / 500
    assert train.schedule_progress(steps_run, 8, 0.1) == 8 / 500
    timed_run = train.parse_args(["--corpus", "c", "--out", "o"])
    assert timed_run.seconds == 150.0 and train.schedule_progress(timed_run, 8, 15.0) == 0.1


# ---- benchmark ----

def test_bench_fails_loudly_without_twell(monkeypatch):
    monkeypatch.setitem(sys.modules, "twell.torch", None)  # an import of twell.torch now raises
    monkeypatch.delitem(sys.modules, "bench_model", raising=False)
    with pytest.raises(ImportError):
        importlib.import_module("bench_model")
