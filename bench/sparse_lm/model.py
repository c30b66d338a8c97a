"""SparseLM: a byte-level Llama-style decoder whose FFN is ReLU-gated, so that an L1 penalty on the FFN
hidden activations makes them sparse (the recipe of arXiv 2603.23198; ../shared/design/TRAINING.md).

Module names follow Hugging Face Llama (`embed_tokens`, `layers[i].self_attn`, `.mlp.gate_proj`, ...) so
that tools written for Llama/Qwen MLPs, `twell.torch.sparsify_` first, find the FFNs without adapters.
The LM head is tied to the embedding (256 x d_model: a separate head would buy nothing at this vocabulary).
"""

import math
from collections import namedtuple
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from corpus import VOCAB_SIZE

ROPE_BASE = 10000.0
NORM_EPS = 1e-5
INIT_STD = 0.02


@dataclass
class SparseLMConfig:
    d_model: int = 2048
    d_ff: int = 5632  # the FFN shape of all four model sizes of the paper
    n_layers: int = 4
    n_heads: int = 16
    max_seq: int = 2048  # RoPE table length: the longest prompt + decoded tokens

    def __post_init__(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model {self.d_model} must split into {self.n_heads} heads of even size")


# Per-layer FFN statistics of one forward: l1 [n_layers] is the mean over tokens of sum_j |h_j| (the L1
# term before averaging over layers), density [n_layers] the fraction of relu(gate) entries that are > 0.
ActivationStats = namedtuple("ActivationStats", ["l1", "density"])

# Preallocated keys and values, [n_layers, batch, n_heads, max_len, head_dim] each: static addresses, so a
# decode step can be captured in a CUDA graph and replayed.
KVCache = namedtuple("KVCache", ["keys", "values"])


class GatedMLP(nn.Module):
    """y = down_proj(relu(gate_proj(x)) * up_proj(x)), weights in nn.Linear layout: gate_proj and up_proj
    [d_ff, d_model], down_proj [d_model, d_ff]. The attribute names and the act_fn member are the Llama/Qwen
    MLP's, which `twell.torch.sparsify_` recognizes and replaces."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
        self.act_fn = nn.ReLU()
        # "torch": PyTorch's autograd; "twell": forward_with_stats trains through twell.torch.sparse_ffn_train
        # (train.py --ffn twell), dispatch "auto" keyed by `twell_key` (one decision per layer and bucket).
        self.backend = "torch"
        self.twell_key = 0
        self.twell_dispatch = "auto"
        # The training split (train.py --twell-split): the first twell_dense_neurons neurons, kept most active
        # first by train.py's reordering, on twell's dense kernels; `capture` keeps a sample of this call's x.
        self.twell_dense_neurons = 0
        self.capture = False
        self.captured = None

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def forward_with_stats(self, x):
        """The same output plus (l1, density) of this call, from the one pass that training needs anyway:
        the L1 term must see h inside the autograd graph, so a second pass or a hook would cost a copy."""
        if self.backend == "twell" and x.is_cuda and torch.is_grad_enabled():
            return self._forward_twell(x)
        a = self.act_fn(self.gate_proj(x))
        h = a * self.up_proj(x)
        # fp32 accumulation: under autocast h is bf16, and a bf16 sum over d_ff rounds the penalty.
        l1 = h.abs().sum(-1, dtype=torch.float32).mean()
        density = torch.count_nonzero(a.detach()) / a.numel()  # relu output: nonzero <=> > 0
        return self.down_proj(h), l1, density

    def _forward_twell(self, x):
        """The same (y, l1) through twell's training kernels, on the autocast dtype's copies of x and the
        weights (as autocast's F.linear casts them; the casts pass the gradients on to the fp32 weights).
        The density is not measured here (NaN): the forward holds TwELL words, not the dense activations."""
        import twell.torch as tt

        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype
        with torch.autocast("cuda", enabled=False):
            weights = [lin.weight.to(dtype) for lin in (self.gate_proj, self.up_proj, self.down_proj)]
            if self.capture:
                self.captured = x.detach().reshape(-1, x.shape[-1])[:8192].to(dtype)
            y, l1 = tt.sparse_ffn_train(x.to(dtype), *weights, dispatch=self.twell_dispatch,
                                      decision_key=self.twell_key, dense_neurons=self.twell_dense_neurons)
        return y, l1, torch.full((), float("nan"), device=x.device)


def rope_tables(head_dim, max_seq):
    """cos and sin of the rotary angles, [max_seq, head_dim / 2] in fp32 (Llama's half-split convention)."""
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(max_seq, dtype=torch.float64)[:, None] * inv_freq[None]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """Rotates x [..., T, head_dim] by the angles of its positions; cos/sin [T, head_dim / 2]."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Multi-head causal self-attention with RoPE; one fused QKV projection (one GEMM instead of three)."""

    def __init__(self, config):
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.qkv_proj = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.o_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x, cos, sin, cache=None, pos=None, mask=None):
        """x [B, T, d_model]. Without `pos`: the sequence starts at position 0 (training, prefill; keys and
        values also written to cache[:, :, :T] when a layer cache (keys, values) is given). With `pos` (a
        0-dim int64 tensor, T = 1): the new key and value go to the cache at pos, and the query attends
        over the whole cache under `mask` [1, 1, 1, max_len] (True = attend)."""
        batch, seq, _ = x.shape
        q, k, v = self.qkv_proj(x).view(batch, seq, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if pos is None:
            if cache is not None:
                cache[0][:, :, :seq].copy_(k)
                cache[1][:, :, :seq].copy_(v)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # index_copy_ with a device index: no host synchronization, the same kernels at every
            # position, so one captured step serves all positions.
            cache[0].index_copy_(2, pos.view(1), k)
            cache[1].index_copy_(2, pos.view(1), v)
            out = F.scaled_dot_product_attention(q, cache[0], cache[1], attn_mask=mask)
        # n_heads * head_dim rather than d_model: a head-sharded copy (tp_model.py) holds fewer heads.
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.d_model, eps=NORM_EPS)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.d_model, eps=NORM_EPS)
        self.mlp = GatedMLP(config.d_model, config.d_ff)

    def forward(self, x, cos, sin, cache=None, pos=None, mask=None, stats=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, pos, mask)
        mlp_in = self.post_attention_layernorm(x)
        if stats is None:
            return x + self.mlp(mlp_in)
        y, l1, density = self.mlp.forward_with_stats(mlp_in)
        stats.append((l1, density))
        return x + y


class SparseLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(VOCAB_SIZE, config.d_model)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=NORM_EPS)
        cos, sin = rope_tables(config.d_model // config.n_heads, config.max_seq)
        # Not persistent: derived from the config, so checkpoints hold weights only.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.kv_cache = None
        self.kv_positions = None
        self.reset_parameters()

    def reset_parameters(self):
        # GPT-2's scheme: N(0, 0.02), the projections that write into the residual stream scaled by
        # 1/sqrt(2 n_layers) so that the stream's variance does not grow with depth.
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
                nn.init.normal_(p, 0.0, std)

    def _decoder(self, idx, cache=None, pos=None, stats=None):
        """Embedding, layers and final norm: the hidden states [B, T, d_model] the LM head reads."""
        if pos is None:
            seq = idx.shape[1]
            if seq > self.config.max_seq:
                raise ValueError(f"sequence of {seq} tokens exceeds max_seq {self.config.max_seq}")
            cos, sin, mask = self.rope_cos[:seq], self.rope_sin[:seq], None
        else:
            cos, sin = self.rope_cos.index_select(0, pos.view(1)), self.rope_sin.index_select(0, pos.view(1))
            mask = (self.kv_positions <= pos).view(1, 1, 1, -1)
        x = self.embed_tokens(idx)
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache.keys[i], cache.values[i])
            x = layer(x, cos, sin, layer_cache, pos, mask, stats)
        return self.norm(x)

    def lm_head(self, hidden):
        return F.linear(hidden, self.embed_tokens.weight)

    def forward(self, idx):
        """idx [B, T] int64 bytes -> logits [B, T, 256] of the next byte."""
        return self.lm_head(self._decoder(idx))

    def forward_with_stats(self, idx):
        """(logits, ActivationStats) of one pass; the model's MLPs must be GatedMLP (not sparsified)."""
        stats = []
        logits = self.lm_head(self._decoder(idx, stats=stats))
        l1, density = (torch.stack(column) for column in zip(*stats))
        return logits, ActivationStats(l1, density)

    def hidden(self, idx):
        """The decoder forward without the LM head (the prefill benchmark's unit): [B, T, d_model]."""
        return self._decoder(idx)

    def allocate_kv_cache(self, batch, max_len, dtype=None, device=None):
        """Preallocates the cache for `batch` sequences of up to `max_len` positions (<= max_seq), by
        default in the embedding's dtype and device; replaces any earlier cache."""
        if max_len > self.config.max_seq:
            raise ValueError(f"max_len {max_len} exceeds max_seq {self.config.max_seq} (RoPE table)")
        weight = self.embed_tokens.weight
        dtype = dtype or weight.dtype
        device = device or weight.device
        attention = self.layers[0].self_attn  # its heads: all of them, or this rank's in a head-sharded copy
        shape = (self.config.n_layers, batch, attention.n_heads, max_len, attention.head_dim)
        self.kv_cache = KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        self.kv_positions = torch.arange(max_len, device=device)
        return self.kv_cache

    def free_kv_cache(self):
        self.kv_cache = None
        self.kv_positions = None

    def _check_cache(self, batch, seq):
        if self.kv_cache is None:
            raise RuntimeError("allocate_kv_cache first")
        cache_batch, max_len = self.kv_cache.keys.shape[1], self.kv_cache.keys.shape[3]
        if batch != cache_batch or seq > max_len:
            raise ValueError(f"input [{batch}, {seq}] does not fit a cache of batch {cache_batch}, {max_len} positions")

    def prefill(self, idx):
        """Runs the prompt idx [B, T] from position 0, writing its keys and values to cache positions
        [0, T); returns logits [B, T, 256]. The next decode_step takes pos = T."""
        self._check_cache(*idx.shape)
        return self.lm_head(self._decoder(idx, cache=self.kv_cache))

    def decode_step(self, tokens, pos):
        """One token per sequence: tokens [B, 1] int64 at position `pos` (0-dim int64 tensor on the model's
        device, read only on the device) -> logits [B, 256]. Writes the keys and values at pos and attends
        over cache positions <= pos. No host synchronization and no shape that depends on pos, so the step
        is CUDA-graph capturable (after a warm-up) and replayable with pos advanced in place."""
        self._check_cache(tokens.shape[0], 1)
        return self.lm_head(self._decoder(tokens, cache=self.kv_cache, pos=pos))[:, -1]


def save_checkpoint(path, model, stats=None, args=None):
    """Writes config, the weights in bf16 (the benchmark's dtype; half the bytes to carry) and run info."""
    state = {name: t.detach().to("cpu", torch.bfloat16) for name, t in model.state_dict().items()}
    torch.save({"config": asdict(model.config), "state_dict": state, "stats": stats or {}, "args": args or {}}, path)


def load_checkpoint(path, device="cpu", dtype=torch.bfloat16):
    """Returns (model in eval mode on device/dtype, the checkpoint dict)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model = SparseLM(SparseLMConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["state_dict"])
    return model.to(device=device, dtype=dtype).eval(), checkpoint
