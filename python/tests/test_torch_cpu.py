"""twell.torch without a GPU: registration, schemas, fake tensors, torch.compile tracing on shape-only
inputs, the modules' checks and sparsify_ on a transformers Llama, the error messages."""
import pytest
import torch
from torch import nn

import twell
import twell.torch as tt
from twell.torch import SparseGatedMLP, sparsify_

BF16 = torch.bfloat16


def fake_inputs(mode, d_model=256, d_ff=512, lead=(2, 3), dtype=BF16, device="cuda"):
    with mode:
        x = torch.empty(*lead, d_model, dtype=dtype, device=device)
        wg = torch.empty(d_ff, d_model, dtype=dtype, device=device)
        wu = torch.empty(d_ff, d_model, dtype=dtype, device=device)
        wd = torch.empty(d_model, d_ff, dtype=dtype, device=device)
    return x, wg, wu, wd


def test_ops_are_registered_with_schemas():
    schema = str(torch.ops.twell.sparse_gated_ffn.default._schema)
    assert schema.startswith("twell::sparse_gated_ffn(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, str activation=")
    assert "-> Tensor" in schema
    assert "Tensor w_up" not in str(torch.ops.twell.sparse_ffn.default._schema)


def test_fake_tensors_give_shapes_and_check_arguments():
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    x, wg, wu, wd = fake_inputs(mode)
    with mode:
        assert torch.ops.twell.sparse_gated_ffn(x, wg, wu, wd).shape == (2, 3, 256)
        assert torch.ops.twell.sparse_ffn(x, wg, wd).shape == (2, 3, 256)
        with pytest.raises(ValueError, match=r"w_up: expected shape \(512, 256\), got shape \(512, 128\)"):
            torch.ops.twell.sparse_gated_ffn(x, wg, wu[:, :128], wd)
        with pytest.raises(ValueError, match="w_down: expected dtype|w_down: expected x's dtype"):
            torch.ops.twell.sparse_gated_ffn(x, wg, wu, wd.to(torch.float16))
        with pytest.raises(ValueError, match="x: expected a contiguous last dimension"):
            torch.ops.twell.sparse_gated_ffn(x.as_strided((2, 3, 256), (1, 2 * 256, 6)), wg, wu, wd)
        with pytest.raises(ValueError, match="leading dimensions that collapse"):
            torch.ops.twell.sparse_gated_ffn(torch.empty(3, 2, 256, dtype=BF16, device="cuda").transpose(0, 1), wg, wu, wd)
        with pytest.raises(ValueError, match="activation"):
            torch.ops.twell.sparse_gated_ffn(x, wg, wu, wd, "gelu")
        with pytest.raises(ValueError, match="dense_neurons"):
            torch.ops.twell.sparse_gated_ffn(x, wg, wu, wd, dense_neurons=512)


def test_torch_compile_fullgraph_traces_the_op_without_graph_breaks():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def ffn(x, wg, wu, wd):
        return torch.ops.twell.sparse_gated_ffn(x * 2, wg, wu, wd, "relu", 0.0, "sparse") + x

    mlp_in = [torch.empty(4, 7, 256, dtype=BF16, device="meta"), torch.empty(512, 256, dtype=BF16, device="meta"),
              torch.empty(512, 256, dtype=BF16, device="meta"), torch.empty(256, 512, dtype=BF16, device="meta")]
    out = torch.compile(ffn, fullgraph=True, backend=backend)(*mlp_in)
    assert out.shape == (4, 7, 256) and out.device.type == "meta"
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("twell.sparse_gated_ffn" in t for t in targets), targets


def test_cpu_tensors_get_a_clear_error():
    x = torch.randn(3, 64, dtype=BF16)
    w = torch.randn(128, 64, dtype=BF16)
    with pytest.raises(ValueError, match="x: expected a CUDA tensor .* got a tensor on cpu"):
        torch.ops.twell.sparse_gated_ffn(x, w, w, w.t().contiguous())
    m = lambda t: t.to("meta")
    with pytest.raises(ValueError, match="dtype torch.bfloat16 or torch.float16"):
        torch.ops.twell.sparse_gated_ffn(m(x.float()), m(w), m(w), m(w.t().contiguous()))
    with pytest.raises(ValueError, match="jit"):
        tt.set_context_options(jit="nevr")
    with pytest.raises(ValueError, match="device comes from the tensors"):
        tt.set_context_options(device=1)


class ReluMLP(nn.Module):
    def __init__(self, d=64, f=128, bias=False, act=None):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, f, bias=bias), nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)
        self.act_fn = act if act is not None else nn.ReLU()


class Model(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleDict({"mlp": ReluMLP(**kw)}) for _ in range(2)])


def test_sparsify_replaces_mlps_in_place_sharing_parameters():
    model = Model()
    before = {k: v for k, v in model.state_dict().items()}
    weight = model.layers[0]["mlp"].gate_proj.weight
    assert sparsify_(model, dispatch="sparse") is model
    mlps = [m for m in model.modules() if isinstance(m, SparseGatedMLP)]
    assert len(mlps) == 2
    assert mlps[0].gate_proj.weight is weight
    assert list(model.state_dict()) == list(before)
    assert mlps[0].decision_key != mlps[1].decision_key
    assert mlps[0].dispatch == "sparse"
    with pytest.raises(ValueError, match="already sparsified"):
        sparsify_(model)  # nothing left to replace


def test_sparsify_refuses_non_relu_and_bias_without_changing_the_model():
    model = Model(act=nn.GELU())
    with pytest.raises(ValueError, match="act_fn: expected ReLU"):
        sparsify_(model)
    assert not any(isinstance(m, SparseGatedMLP) for m in model.modules())
    silu = Model(act=nn.SiLU())
    with pytest.raises(ValueError, match="SiLU, which is never exactly zero"):
        sparsify_(silu)
    sparsify_(silu, threshold=0.05)
    assert all(m.activation == "silu" and m.threshold == 0.05 for m in silu.modules() if isinstance(m, SparseGatedMLP))
    with pytest.raises(ValueError, match="without bias"):
        sparsify_(Model(bias=True))


def test_sparsify_transformers_llama_with_relu():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, hidden_act="relu")
    model = transformers.LlamaForCausalLM(config)
    sparsify_(model)
    assert sum(isinstance(m, SparseGatedMLP) for m in model.modules()) == 2
    silu = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, hidden_act="silu"))
    with pytest.raises(ValueError, match="SiLU"):
        sparsify_(silu)


def test_module_checks_shapes_and_options():
    mlp = ReluMLP()
    with pytest.raises(ValueError, match="threshold"):
        SparseGatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj, activation="silu")
    with pytest.raises(ValueError, match="down_proj: expected weight shape"):
        SparseGatedMLP(mlp.gate_proj, mlp.up_proj, nn.Linear(64, 64, bias=False))
    m = SparseGatedMLP.from_mlp(mlp)
    with pytest.raises(ValueError, match="CUDA tensor"):
        m(torch.randn(2, 64).to(mlp.gate_proj.weight.dtype).bfloat16())


def test_tensor_parallel_shards_cover_d_ff():
    from twell.torch.parallel import shard_rows
    for d_ff, world in ((5632, 2), (5632, 3), (1408, 4), (100, 2)):
        parts = [shard_rows(d_ff, world, r) for r in range(world)]
        assert parts[0][0] == 0 and parts[-1][1] == d_ff
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        assert all(first % 8 == 0 for first, _ in parts)
    with pytest.raises(ValueError, match="rank"):
        shard_rows(512, 2, 2)


def test_row_strides_expanded_and_size_one_dims():
    from twell.torch.ops import _row_stride
    base = torch.empty(8, 512, dtype=BF16, device="meta")
    assert _row_stride("op", base[:, :256], 256) == 512
    assert _row_stride("op", base[:, :256].unsqueeze(1), 256) == 512  # a size-1 dim between rows is free
    assert _row_stride("op", base.as_strided((3, 1, 256), (1024, 1024, 1)), 256) == 1024
    with pytest.raises(ValueError, match="row stride of 0"):
        _row_stride("op", torch.empty(1, 256, dtype=BF16, device="meta").expand(4, 256), 256)
    assert _row_stride("op", torch.empty(1, 1, 256, dtype=BF16, device="meta"), 256) == 256


def test_operator_checks_what_the_kernels_would_refuse():
    x = torch.empty(4, 256, dtype=BF16, device="meta")
    w = torch.empty(512, 256, dtype=BF16, device="meta")
    wd = torch.empty(256, 512, dtype=BF16, device="meta")
    with pytest.raises(ValueError, match="w_up: expected a tensor, got NoneType"):
        torch.ops.twell.sparse_gated_ffn(x, w, None, wd)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="threshold"):
            torch.ops.twell.sparse_gated_ffn(x, w, w, wd, "relu", bad)
    with pytest.raises(ValueError, match="threshold"):
        torch.ops.twell.sparse_gated_ffn(x, w, w, wd, "silu", 0.0)
    x16, w16, wd16 = (t.to(torch.float16) for t in (x, w, wd))
    with pytest.raises(ValueError, match=r"threshold: expected at most 65504 with x's dtype torch.float16 .*, got 3e\+38"):
        torch.ops.twell.sparse_gated_ffn(x16, w16, w16, wd16, "silu", 3e38)
    with pytest.raises(ValueError, match="threshold: expected at most 65504"):
        torch.ops.twell.sparse_gated_ffn(x16, w16, w16, wd16, "relu", 65505.0)
    with pytest.raises(ValueError, match="multiple of 64"):
        torch.ops.twell.sparse_gated_ffn(x, w, w, wd, dense_neurons=63)


def test_module_options_are_checked_at_construction():
    mlp = ReluMLP()
    for bad in (dict(dispatch="fast"), dict(dense_neurons=63), dict(decode_max_tokens=1000), dict(max_tokens=0),
                dict(threshold=float("inf"))):
        with pytest.raises(ValueError):
            SparseGatedMLP.from_mlp(mlp, **bad) if "threshold" not in bad else SparseGatedMLP.from_mlp(mlp, threshold=bad["threshold"])
    with pytest.raises(ValueError, match="dispatch"):
        sparsify_(Model(), dispatch="fast")


def test_sparsify_keeps_a_shared_mlp_shared():
    shared = ReluMLP()
    model = nn.Module()
    model.a, model.b = shared, shared
    sparsify_(model)
    assert isinstance(model.a, SparseGatedMLP) and model.a is model.b


def test_shard_rows_checks_its_arguments():
    from twell.torch.parallel import shard_rows
    for args in ((-8, 2, 0), (512, 0, 0), (512, 2, 0.5)):
        with pytest.raises(ValueError):
            shard_rows(*args)


def test_auto_path_decides_once_per_bucket(monkeypatch):
    """SparseGatedMLP's dispatch 'auto' logic with the timing replaced (no GPU): the faster candidate
    per token bucket, decided once, refused during capture, forgotten by recalibrate()."""
    import twell.torch.modules as modules
    mlp = SparseGatedMLP.from_mlp(ReluMLP(d=64, f=128))
    timed = []

    def fake_median(fn, reps=3, before_each=None):
        assert before_each is evict  # every candidate timed with L2 overwritten before each call (v71)
        name = "twell" if len(timed) % 2 == 0 else "torch"
        timed.append(name)
        return {"twell": 1.0, "torch": 2.0}[name] if current["twell_faster"] else {"twell": 2.0, "torch": 1.0}[name]

    current = {"twell_faster": True}
    def evict():
        pass

    monkeypatch.setattr(modules, "_median_ms", fake_median)
    monkeypatch.setattr(modules, "l2_eviction", lambda device: evict)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    w = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    assert mlp._path(torch.empty(1, 64), *w) == "twell"
    assert mlp._path(torch.empty(1, 64), *w) == "twell" and len(timed) == 2  # decided once
    current["twell_faster"] = False
    assert mlp._path(torch.empty(300, 64), *w) == "torch"  # another bucket
    assert mlp._path(torch.empty(257, 64), *w) == "torch" and len(timed) == 4  # same power-of-two bucket
    assert set(mlp.path_times[((300 - 1).bit_length(), False)]) == {"twell", "torch"}
    key = mlp.decision_key
    mlp.recalibrate()
    assert not mlp.paths and mlp.decision_key != key
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="warm-up"):
        mlp._path(torch.empty(1, 64), *w)


@pytest.mark.parametrize("gated,tokens", [(True, 6), (False, 6), (True, 0)])
def test_the_backward_operator_dense_branch_matches_its_fake(gated, tokens):
    # Off CUDA, with no rows, or for a shape the training kernels refuse, twell::sparse_ffn_backward takes
    # the dense formula: its outputs must have the fake's shapes and strides (dWd contiguous, as the weight), which
    # opcheck and torch.compile check, and equal PyTorch's autograd of the same function.
    gen = torch.Generator().manual_seed(0)
    d_model, d_ff = 16, 48
    x = torch.randn(tokens, d_model, generator=gen)
    wg, wu = torch.randn(d_ff, d_model, generator=gen), torch.randn(d_ff, d_model, generator=gen) if gated else None
    wd, dy = torch.randn(d_model, d_ff, generator=gen), torch.randn(tokens, d_model, generator=gen)
    args = (x, wg, wu, wd, dy, "relu", 0.0)
    torch.library.opcheck(torch.ops.twell.sparse_ffn_backward.default, args)
    dx, dwg, dwu, dwd = torch.ops.twell.sparse_ffn_backward(*args)
    assert dwd.shape == (d_model, d_ff) and dwd.is_contiguous()  # as the weight (nn.Linear's layout)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, wg, wu, wd)]
    lx, lg, lu, ld = leaves
    h = torch.relu(lx @ lg.t()) * (lx @ lu.t() if gated else 1)
    ((h @ ld.t()) * dy).sum().backward()
    for got, ref in ((dx, lx.grad), (dwg, lg.grad), (dwd, ld.grad)) + (((dwu, lu.grad),) if gated else ()):
        torch.testing.assert_close(got, ref)
    assert gated or dwu.numel() == 0


def test_training_spec_is_one_object_per_layer_shape_and_threshold_sign_free():
    # training.spec_of caches one FfnSpec per layer shape (bench/README.md v57); -0.0 and 0.0 are one spec
    # with threshold +0.0 (the kernels key the threshold's bits), other thresholds and dtypes other specs.
    from twell.torch import training
    x = torch.empty(8, 64, dtype=torch.bfloat16, device="meta")
    wg = torch.empty(128, 64, dtype=torch.bfloat16, device="meta")
    a = training.spec_of(x, wg, wg, "relu", 0.0)
    b = training.spec_of(x, wg, wg, "relu", -0.0)
    assert a is b and str(b.threshold) == "0.0"
    assert training.spec_of(x, wg, wg, "relu", 0.5).threshold == 0.5
    assert training.spec_of(x, wg, None, "relu", 0.0).gated is False
    assert training.spec_of(x.half(), wg.half(), wg.half(), "relu", 0.0).dtype == "fp16"


def test_reorder_neurons_keeps_the_function_and_permutes_the_optimizer_state():
    # The training split's reparametrization (twell.torch.training.reorder_neurons_) on CPU: the same
    # y = (relu(x Wg^T) * (x Wu^T)) Wd^T, and AdamW's moments and the gradients moved with their neurons.
    from twell.torch import training
    torch.manual_seed(3)
    gate, up, down = nn.Linear(64, 192, bias=False), nn.Linear(64, 192, bias=False), nn.Linear(192, 64, bias=False)
    params = [gate.weight, up.weight, down.weight]
    opt = torch.optim.AdamW(params, lr=1e-2)
    x = torch.randn(32, 64)
    mlp = lambda: down(torch.relu(gate(x)) * up(x))
    mlp().square().sum().backward()
    opt.step()
    mlp().square().sum().backward()  # gradients set, as between a backward and a step
    before = mlp().detach()
    moments = {id(p): {k: v.clone() for k, v in opt.state[p].items() if v.shape == p.shape} for p in params}
    grads = [p.grad.clone() for p in params]
    order = torch.randperm(192)
    training.reorder_neurons_(order, gate.weight, up.weight, down.weight, opt)
    assert torch.allclose(mlp().detach(), before, atol=1e-5)
    for p, g, dim in zip(params, grads, (0, 0, 1)):
        assert torch.equal(p.grad, g.index_select(dim, order))
        for k, v in moments[id(p)].items():
            assert torch.equal(opt.state[p][k], v.index_select(dim, order)), k
    assert len(moments[id(gate.weight)]) == 2  # exp_avg, exp_avg_sq
    with pytest.raises(twell.InvalidArgumentError, match="order"):
        training.reorder_neurons_(torch.zeros(192, dtype=torch.long), gate.weight, up.weight, down.weight)
    with pytest.raises(twell.InvalidArgumentError, match="order"):
        training.reorder_neurons_(torch.arange(10), gate.weight, up.weight, down.weight)
    # State that is not per element (a factored second moment, say) cannot follow its neurons: refused.
    opt.state[down.weight]["factored"] = torch.ones(192)
    kept = [p.detach().clone() for p in params]
    with pytest.raises(twell.InvalidArgumentError, match="optimizer"):
        training.reorder_neurons_(order, gate.weight, up.weight, down.weight, opt)
    assert all(torch.equal(p, k) for p, k in zip(params, kept)), "a refused reorder moved some weights"


def test_hot_first_split_orders_by_activity_and_asks_the_cost_model():
    # hot_first_split on CPU: the most active neurons first (ties by index) and the training cost model's
    # choice: a layer whose activity sits on 1024 of 5632 neurons splits there; a uniform 0.5% one does not.
    from twell.torch import training
    gen = torch.Generator().manual_seed(5)
    rows, d_model, d_ff = 1000, 2048, 5632  # the paper's shape (at d_model 256 the fixed costs favour the dense path)
    x = torch.rand(rows, d_model, generator=gen) * 2 - 1
    x[:, 0] = 1
    wg = (torch.rand(d_ff, d_model, generator=gen) * 2 - 1) / 45
    sigma = (wg[:, 1:].pow(2).sum(1) / 3).sqrt()
    normal = torch.distributions.Normal(0, 1)
    p = torch.full((d_ff,), 0.002)
    hot = torch.randperm(d_ff, generator=gen)[:1024]
    p[hot] = 0.2
    wg[:, 0] = -sigma * normal.icdf(1 - p)
    order, n = training.hot_first_split(x, wg, tokens=16384)  # (fp32 on the CPU: bf16 GEMMs are slow there)
    assert set(order[:1024].tolist()) == set(hot.tolist())
    assert n == 1024
    wg[:, 0] = -sigma * float(normal.icdf(torch.tensor(1 - 0.005)))
    order, n = training.hot_first_split(x, wg, tokens=16384)
    assert n == 0
    activity = (x @ wg.t() > 0).sum(0)
    assert torch.all(activity[order][:-1] >= activity[order][1:])
    for bad in (0, None, 2.5, True):  # the training calls' rows are required (the sample's rows are not them)
        with pytest.raises(twell.InvalidArgumentError, match="hot_first_split: tokens: expected a positive int"):
            training.hot_first_split(x, wg, tokens=bad)


class _SlowContext:
    """A stand-in for twell.runtime.Context whose training plans take `seconds` to make (the JIT), counting
    them and failing for dense_neurons 64 (as a refused shape would)."""

    def __init__(self, seconds):
        import threading
        self.seconds, self.made, self.lock, self.inside, self.most_inside = seconds, [], threading.Lock(), 0, 0

    def training_plan(self, spec, capacity, dispatch="sparse", dense_neurons=0, **options):
        import time
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        time.sleep(self.seconds)
        with self.lock:
            self.inside -= 1
            self.made.append((dispatch, dense_neurons, capacity))
        if dense_neurons == 64:
            raise twell.InvalidArgumentError("twell.FfnTrainingPlan::create: dense_neurons: refused (test)")
        return ("plan", dispatch, dense_neurons, capacity)


def test_training_plans_are_made_outside_the_lock_once_per_key(monkeypatch):
    # Threads needing plans of different keys make them at once; threads needing one key wait for one
    # plan (and take its error); a larger capacity makes a new plan.
    import concurrent.futures
    from twell.torch import _plans, training
    training.clear()
    ctx = _SlowContext(0.3)
    monkeypatch.setattr(_plans, "context", lambda device: ctx)
    spec = training._spec(64, 256, True, "relu", 0.0, "bf16")
    dev = torch.device("cuda", 0)
    jobs = [("sparse", 0, 100)] * 3 + [("sparse", 128, 100), ("dense", 0, 100), ("sparse", 64, 100)] * 2
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(training._entry, dev, spec, tokens, path, split) for path, split, tokens in jobs]
        results = []
        for (path, split, _), f in zip(jobs, futures):
            if split == 64:
                with pytest.raises(twell.InvalidArgumentError, match="refused"):
                    f.result()
            else:
                results.append((path, split, f.result().plan))
    assert sorted(ctx.made) == [("dense", 0, 128), ("sparse", 0, 128), ("sparse", 64, 128), ("sparse", 128, 128)]
    assert ctx.most_inside == 4, "the four keys' plans were not made at once"
    for path, split, plan in results:
        assert plan == ("plan", path, split, 128)
    assert training._making == {}
    assert training._entry(dev, spec, 50, "sparse", 0).plan == ("plan", "sparse", 0, 128)  # kept
    assert training._entry(dev, spec, 1000, "sparse", 0).capacity == 1024  # a larger one replaces it
    assert len(ctx.made) == 5
    training.clear()


def test_prepare_checks_its_arguments(monkeypatch):
    from twell.torch import _plans, training
    training.clear()
    # Shape-only (meta) weights pass the checks of a CUDA call, then prepare refuses them; CPU ones at once.
    wg, wu, wd = (torch.empty(shape, dtype=torch.bfloat16, device="meta") for shape in ((256, 64), (256, 64), (64, 256)))
    for kwargs, match in (({"tokens": 0}, "tokens: expected an int in 1..2"), ({"tokens": 2 ** 30 + 1}, "tokens: expected"),
                          ({"tokens": 8, "dispatch": "fast"}, "dispatch: expected"),
                          ({"tokens": 8, "dense_neurons": 100}, "dense_neurons: expected a multiple of 64"),
                          ({"tokens": 8, "dtype": torch.float32}, "dtype: expected torch.bfloat16")):
        with pytest.raises(twell.InvalidArgumentError, match=match):
            training.prepare(wg, wu, wd, **kwargs)
    with pytest.raises(twell.InvalidArgumentError, match="w_down: expected shape"):
        training.prepare(wg, wu, wd.t(), tokens=8)
    with pytest.raises(twell.InvalidArgumentError, match="w_gate: expected a CUDA tensor.*got a tensor on meta"):
        training.prepare(wg, wu, wd, tokens=8)
    with pytest.raises(twell.InvalidArgumentError, match="w_gate: expected a CUDA tensor.*got a tensor on cpu"):
        training.prepare(*(torch.zeros(w.shape, dtype=w.dtype) for w in (wg, wu, wd)), tokens=8)
    with pytest.raises(twell.InvalidArgumentError, match="w_up: expected a CUDA tensor.*got a tensor on cpu"):
        training.prepare(wg, torch.zeros(wu.shape, dtype=wu.dtype), wd, tokens=8)
    # fp32 master weights: the call's dtype is given (dtype=), their layouts are what is checked.
    fp32 = [torch.empty(w.shape, dtype=torch.float32, device="meta") for w in (wg, wu, wd)]
    with pytest.raises(twell.InvalidArgumentError, match="dtype: expected the call's x dtype.*here torch.float32"):
        training.prepare(*fp32, tokens=8)
    with pytest.raises(twell.InvalidArgumentError, match="w_gate: expected a CUDA tensor.*got a tensor on meta"):
        training.prepare(*fp32, tokens=8, dtype=torch.bfloat16)  # (past every check of the call's)
    with pytest.raises(twell.InvalidArgumentError, match="w_gate: expected a CUDA tensor"):
        training.prepare(wg, wu, wd.t().contiguous().t(), tokens=8)  # (in_out: the call copies it to rows; accepted)
    with pytest.raises(twell.InvalidArgumentError, match="w_down: expected contiguous rows .* or contiguous columns"):
        training.prepare(wg, wu, torch.empty(256, 128, dtype=torch.bfloat16, device="meta").t()[::2], tokens=8)  # strides (2, 128)
    gapped = torch.empty(64, 512, dtype=torch.float32, device="meta")[:, ::2]  # its cast is contiguous: accepted
    with pytest.raises(twell.InvalidArgumentError, match="w_gate: expected a CUDA tensor"):
        training.prepare(fp32[0], fp32[1], gapped, tokens=8, dtype=torch.bfloat16)
    with pytest.raises(twell.InvalidArgumentError, match="w_up: expected x's dtype"):  # mixed, no dtype: as the call
        training.prepare(wg, fp32[1], wd, tokens=8)
    with pytest.raises(twell.InvalidArgumentError, match="dtype: expected torch.bfloat16 or torch.float16"):
        training.prepare(wg, wu, wd, tokens=8, dtype=[1])
    assert training._training_plans == {} and training._making == {}


def test_training_plan_refusals_of_a_size_and_releases_keep_other_splits(monkeypatch):
    # A plan refused for its rows alone is not remembered as the shape's refusal; clear() forgets a plan being
    # made; an auto decision drops only the plans no decision of their own split chose.
    import threading
    from twell.torch import _plans, training
    training.clear()

    class Sized(_SlowContext):
        def training_plan(self, spec, capacity, dispatch="sparse", dense_neurons=0, **options):
            if capacity > 1024:
                raise twell.InvalidArgumentError("twell.FfnTrainingPlan::create: max_tokens: too many (test)")
            return super().training_plan(spec, capacity, dispatch, dense_neurons, **options)
    ctx = Sized(0.2)
    monkeypatch.setattr(_plans, "context", lambda device: ctx)
    spec = training._spec(64, 256, True, "relu", 0.0, "bf16")
    dev = torch.device("cuda", 0)
    assert training.trainable(dev, spec, 5000) is False and training._refused == {}
    assert training.trainable(dev, spec, 100) is True
    # clear() while a plan is being made: the maker still returns it, the cache stays empty.
    got = []
    maker = threading.Thread(target=lambda: got.append(training._entry(dev, spec, 10, "sparse", 128)))
    maker.start()
    import time
    time.sleep(0.05)
    training.clear()
    maker.join()
    assert got[0].plan == ("plan", "sparse", 128, 64) and training._training_plans == {} and training._making == {}
    # Plans of splits 128 and 256; split 256's bucket chose the TwELL path; split 128's decides twell_dense.
    for split in (128, 256):
        training._entry(dev, spec, 10, "sparse", split)
    training._entry(dev, spec, 10, "dense", 0)
    shape = (0, 64, 256, True, "relu", 0.0, torch.bfloat16)
    training._paths[(1,) + shape + (256, 4)] = "sparse"
    training._paths[(2,) + shape + (128, 4)] = "twell_dense"
    training._release_if_unused((2,) + shape + (128, 4), (0, spec))
    assert sorted(k[2:] for k in training._training_plans) == [("dense", 0), ("sparse", 256)]
    training.clear()
