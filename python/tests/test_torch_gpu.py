"""twell.torch on a GPU against PyTorch dense (F.linear through cuBLAS): random and real inputs,
gradients, opcheck, torch.compile, CUDA graphs, a transformers Llama, the split's calibration.
Skipped loudly without a GPU (conftest.cuda)."""
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import twell
import twell.torch as tt
from twell.torch import SparseGatedMLP, ops, sparsify_

from conftest import data_file


def fp32_reference(x, wg, wu, wd, activation="relu", threshold=0.0):
    """The FFN in fp32 from the same 16-bit operands, with the activity decided on g rounded to the
    dtype (twell/spec.h): the yardstick both twell and PyTorch dense are measured against."""
    g16 = F.linear(x, wg)
    _, active = ops.activation_and_mask(g16, activation, threshold)
    g = g16.float()
    a = (F.relu(g) if activation == "relu" else F.silu(g)) * active
    h = a * F.linear(x.float(), wu.float()) if wu is not None else a
    return F.linear(h, wd.float())


def assert_as_close_as_dense(y, x, wg, wu, wd, activation="relu", threshold=0.0):
    """twell's error against the fp32 reference is at most twice PyTorch dense's (plus a little)."""
    ref = fp32_reference(x, wg, wu, wd, activation, threshold)
    dense = ops.dense_reference(x, wg, wu, wd, activation, threshold)
    assert y.shape == dense.shape and y.dtype == dense.dtype and torch.isfinite(y).all()
    err, err_dense = (y.float() - ref).abs().max().item(), (dense.float() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= 2 * err_dense + 1e-3 * scale, f"twell max error {err}, dense {err_dense}, |y| max {scale}"


THRESHOLD = 1.6449  # P(g > t) = 5% for g ~ N(0, 1): one value for every random layer (each threshold is its own
                    # set of kernels: fewer distinct specs, fewer JIT compiles on a fresh machine)


def layer(d_model, d_ff, device, dtype=torch.bfloat16, density=0.05, seed=0, gated=True):
    """Random weights and inputs; a gate threshold giving about `density` active neurons."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    wg = (torch.randn(d_ff, d_model, generator=gen) / d_model ** 0.5).to(device, dtype)
    wu = (torch.randn(d_ff, d_model, generator=gen) / d_model ** 0.5).to(device, dtype) if gated else None
    wd = (torch.randn(d_model, d_ff, generator=gen) / d_ff ** 0.5).to(device, dtype)
    # g ~ N(0, |x|^2 / d_model) = N(0, 1): P(g > t) = density at t = Phi^-1(1 - density).
    threshold = THRESHOLD if density == 0.05 else float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - density)))
    return wg, wu, wd, threshold


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dispatch", ["sparse", "dense", "auto"])
def test_gated_matches_dense_on_random_inputs(cuda, dtype, dispatch):
    wg, wu, wd, thr = layer(512, 1408, cuda, dtype)
    x = torch.randn(3, 333, 512, device=cuda, dtype=dtype)
    y = torch.full_like(x, float("nan"))  # poisoned: the op must write every element
    y = tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr, dispatch)
    assert_as_close_as_dense(y, x, wg, wu, wd, "relu", thr)


def test_stream_handle_is_the_current_stream(cuda):
    # ops.stream_handle (the operators' and training's stream, bench/README.md v57) against torch's Stream object.
    dev = torch.device("cuda")
    assert ops.stream_handle(dev) == torch.cuda.current_stream(dev).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert ops.stream_handle(dev) == side.cuda_stream != torch.cuda.default_stream(dev).cuda_stream
    assert ops.stream_handle(dev) == torch.cuda.current_stream(dev).cuda_stream


def test_relu_threshold_zero_and_silu_and_non_gated(cuda):
    wg, wu, wd, thr = layer(512, 1408, cuda)
    x = torch.randn(100, 512, device=cuda, dtype=torch.bfloat16)
    assert_as_close_as_dense(tt.sparse_gated_ffn(x, wg, wu, wd, "relu", 0.0, "sparse"), x, wg, wu, wd)
    assert_as_close_as_dense(tt.sparse_gated_ffn(x, wg, wu, wd, "silu", 0.3, "sparse"), x, wg, wu, wd, "silu", 0.3)
    assert_as_close_as_dense(tt.sparse_ffn(x, wg, wd, "relu", thr, "sparse"), x, wg, None, wd, "relu", thr)


def test_strided_rows_decode_sizes_and_chunks(cuda):
    wg, wu, wd, thr = layer(512, 1408, cuda)
    big = torch.randn(70, 1024, device=cuda, dtype=torch.bfloat16)
    x = big[:, 256:768]  # row stride 1024
    assert_as_close_as_dense(tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr), x, wg, wu, wd, "relu", thr)
    for tokens in (1, 2, 7, 64, 65):  # the decode kernels' sizes and the first above them
        xt = torch.randn(tokens, 512, device=cuda, dtype=torch.bfloat16)
        assert_as_close_as_dense(tt.sparse_gated_ffn(xt, wg, wu, wd, "relu", thr, "sparse"), xt, wg, wu, wd, "relu", thr)
    xs = torch.randn(1000, 512, device=cuda, dtype=torch.bfloat16)  # 4 chunks of 256 rows
    y = tt.sparse_gated_ffn(xs, wg, wu, wd, "relu", thr, "sparse", max_tokens=256)
    assert_as_close_as_dense(y, xs, wg, wu, wd, "relu", thr)
    assert tt.sparse_gated_ffn(xs[:0], wg, wu, wd).shape == (0, 512)


def test_in_out_down_layout_at_every_size(cuda):
    # w_down with contiguous columns (ops.down_layout_of: twell's in_out) through every path: the fused decode
    # kernel (1-32 rows), the four decode kernels (33-64), the large-M kernels, dense and auto; y against the
    # fp32 reference and bit-equal to the out_in call's where both take the same kernels' order (dense: cuBLAS
    # reads the transposed operand, so only close).
    wg, wu, wd, _ = layer(512, 1408, cuda)
    wd_cols = wd.t().contiguous().t()
    assert wd_cols.stride() == (1, 512) and torch.equal(wd_cols, wd)
    assert ops.down_layout_of(wd_cols) == ("in_out", 512) and ops.down_layout_of(wd) == ("out_in", 1408)
    for tokens in (1, 5, 16, 32, 33, 64, 300):
        x = torch.randn(tokens, 512, device=cuda, dtype=torch.bfloat16)
        for dispatch in ("sparse", "dense", "auto"):
            y = tt.sparse_gated_ffn(x, wg, wu, wd_cols, "relu", 0.0, dispatch)
            assert_as_close_as_dense(y, x, wg, wu, wd, "relu", 0.0)
    # A column stride above d_model (a slice of a wider [d_ff, 1024] matrix, transposed).
    wide = torch.randn(1408, 1024, device=cuda, dtype=torch.bfloat16) / 1408 ** 0.5
    wd_strided = wide[:, :512].t()
    assert ops.down_layout_of(wd_strided) == ("in_out", 1024)
    x = torch.randn(9, 512, device=cuda, dtype=torch.bfloat16)
    assert_as_close_as_dense(tt.sparse_gated_ffn(x, wg, wu, wd_strided, "relu", 0.0, "sparse"), x, wg, wu, wd_strided)
    # Neither rows nor columns contiguous: refused by name.
    with pytest.raises(ValueError, match="w_down: expected contiguous rows .* or contiguous columns"):
        tt.sparse_gated_ffn(x, wg, wu, wide.t()[::2])  # [512, 1408], strides (2, 1024)


def test_module_set_down_layout_keeps_the_function_and_trains(cuda):
    wg, wu, wd, _ = layer(512, 1408, cuda)
    mlp = _mlp(wg, wu, wd, dispatch="sparse")
    x = torch.randn(4, 512, device=cuda, dtype=torch.bfloat16)
    with torch.no_grad():
        y_rows = mlp(x)
    param = mlp.down_proj.weight
    assert mlp.set_down_layout_("in_out") is mlp and mlp.down_proj.weight is param
    assert param.stride() == (1, 512) and torch.equal(param, wd)
    with torch.no_grad():
        y_cols = mlp(x)
    assert_as_close_as_dense(y_cols, x, wg, wu, wd)
    assert (y_cols.float() - y_rows.float()).abs().max().item() <= 1e-2 * y_rows.float().abs().max().item()
    assert set(mlp.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    # Training with an in_out weight: the gradient of the same function as out_in's.
    xt = torch.randn(64, 512, device=cuda, dtype=torch.bfloat16)
    grads = []
    for layout in ("in_out", "out_in"):
        mlp.set_down_layout_(layout)
        mlp.zero_grad()
        mlp(xt).float().square().sum().backward()
        grads.append(mlp.down_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=2e-2, atol=2e-2 * grads[1].abs().max().item())
    assert param.stride() == (1408, 1)
    with pytest.raises(ValueError, match="set_down_layout_: layout: expected 'in_out' or 'out_in', got 'rows'"):
        mlp.set_down_layout_("rows")
    with pytest.raises(ValueError, match="down_layout: expected None, 'in_out' or 'out_in'"):
        _mlp(wg, wu, wd, down_layout="columns")
    assert _mlp(wg, wu, wd, down_layout="in_out").down_proj.weight.stride() == (1, 512)


def test_gpu_argument_errors_keep_the_process_working(cuda):
    wg, wu, wd, thr = layer(512, 1408, cuda)
    x = torch.randn(8, 512, device=cuda, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w_up: expected shape"):
        tt.sparse_gated_ffn(x, wg, wu[:256], wd)
    with pytest.raises(ValueError, match="w_down: expected x's device|w_down: expected shape"):
        tt.sparse_gated_ffn(x, wg, wu, wd.cpu())
    with pytest.raises(ValueError, match="contiguous"):
        tt.sparse_gated_ffn(x, wg.t().contiguous().t(), wu, wd)
    assert_as_close_as_dense(tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr), x, wg, wu, wd, "relu", thr)


def test_real_paper_layer(cuda):
    from safetensors.torch import load_file
    a = load_file(data_file("paper_l1_gate_a.safetensors"))
    b = load_file(data_file("paper_l1_gate_b.safetensors"))
    x = load_file(data_file("paper_l1_x.safetensors"))["layers.1.x"].to(cuda)
    wg = torch.cat([a["layers.1.gate.weight.rows0"], b["layers.1.gate.weight.rows1"]]).to(cuda)
    gen = torch.Generator(device="cpu").manual_seed(1)  # only the gate was stored: random up/down
    wu = (torch.randn(wg.shape, generator=gen) * 0.02).to(cuda, torch.bfloat16)
    wd = (torch.randn(wg.shape[1], wg.shape[0], generator=gen) * 0.02).to(cuda, torch.bfloat16)
    for dispatch in ("sparse", "auto"):
        assert_as_close_as_dense(tt.sparse_gated_ffn(x, wg, wu, wd, dispatch=dispatch), x, wg, wu, wd)


def test_real_tiny_layers(cuda):
    from safetensors.torch import load_file
    t = load_file(data_file("tiny_l01.safetensors"))
    for li in (0, 1):
        p = f"layers.{li}."
        x, wg, wu, wd = (t[p + n].to(cuda) for n in ("x", "gate.weight", "up.weight", "down.weight"))
        assert_as_close_as_dense(tt.sparse_gated_ffn(x, wg, wu, wd, dispatch="sparse"), x, wg, wu, wd)


@pytest.mark.parametrize("gated", [True, False])
def test_gradients_match_dense_autograd(cuda, gated):
    dtype = torch.float16 if gated else torch.bfloat16
    wg, wu, wd, thr = layer(512, 1408, cuda, dtype, gated=gated)
    x = torch.randn(4, 50, 512, device=cuda, dtype=dtype)
    params = [p.clone().requires_grad_() for p in (x, wg, wu, wd) if p is not None]
    dense_params = [p.detach().clone().requires_grad_() for p in params]
    dy = torch.randn(4, 50, 512, device=cuda, dtype=dtype)
    if gated:
        y = tt.sparse_gated_ffn(*params, "relu", thr, "sparse")
        y_ref = ops.dense_reference(*dense_params, "relu", thr)
    else:
        y = tt.sparse_ffn(*params, "relu", thr, "sparse")
        y_ref = ops.dense_reference(dense_params[0], dense_params[1], None, dense_params[2], "relu", thr)
    (y.float() * dy.float()).sum().backward()
    (y_ref.float() * dy.float()).sum().backward()
    for p, q in zip(params, dense_params):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-2 * q.grad.abs().max().item())


def test_opcheck(cuda):
    wg, wu, wd, thr = layer(512, 1408, cuda)
    x = torch.randn(2, 9, 512, device=cuda, dtype=torch.bfloat16, requires_grad=True)
    args = (x, wg.requires_grad_(), wu.requires_grad_(), wd.requires_grad_(), "relu", thr, "sparse")
    torch.library.opcheck(torch.ops.twell.sparse_gated_ffn.default, args)
    torch.library.opcheck(torch.ops.twell.sparse_ffn.default, (x, wg, wd, "relu", thr, "sparse"))


def test_compile_fullgraph(cuda):
    wg, wu, wd, thr = layer(512, 1408, cuda)
    mlp = SparseGatedMLP(nn.Linear(512, 1408, bias=False), nn.Linear(512, 1408, bias=False),
                         nn.Linear(1408, 512, bias=False), threshold=thr, dispatch="sparse").to(cuda, torch.bfloat16)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(wg); mlp.up_proj.weight.copy_(wu); mlp.down_proj.weight.copy_(wd)
    fn = torch.compile(lambda t: mlp(t) * 2, fullgraph=True)
    x = torch.randn(5, 64, 512, device=cuda, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), mlp(x) * 2, rtol=0, atol=0)


def test_cuda_graph_replay_and_inference_mode(cuda):
    wg, wu, wd, thr = layer(512, 1408, cuda)
    static_x = torch.randn(8, 512, device=cuda, dtype=torch.bfloat16)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up: dispatch "auto" times its paths on the first call
                tt.sparse_gated_ffn(static_x, wg, wu, wd, "relu", thr, "auto", decision_key=77)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = tt.sparse_gated_ffn(static_x, wg, wu, wd, "relu", thr, "auto", decision_key=77)
        for seed in range(3):
            static_x.copy_(torch.randn(8, 512, device=cuda, dtype=torch.bfloat16, generator=torch.Generator(cuda).manual_seed(seed)))
            static_y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert_as_close_as_dense(static_y.clone(), static_x, wg, wu, wd, "relu", thr)
        # A call that was never warmed up fails clearly during capture, and the process goes on.
        with pytest.raises(RuntimeError, match="warm-up"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                tt.sparse_gated_ffn(static_x, wg, wu, wd, "relu", thr, "auto", decision_key=78)
    y = tt.sparse_gated_ffn(static_x, wg, wu, wd, "relu", thr)
    assert_as_close_as_dense(y, static_x, wg, wu, wd, "relu", thr)


def test_transformers_llama_relu_same_logits(cuda):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1408, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=4, hidden_act="relu")
    model = transformers.LlamaForCausalLM(config).to(cuda, torch.bfloat16).eval()
    ids = torch.randint(0, 256, (2, 100), device=cuda)
    with torch.no_grad():
        dense = model(ids).logits.float()
        sparsify_(model)
        assert sum(isinstance(m, SparseGatedMLP) for m in model.modules()) == 3
        sparse = model(ids).logits.float()
    err = (sparse - dense).abs().max().item()
    assert err <= 0.05 * dense.abs().max().item(), err
    assert (sparse.argmax(-1) == dense.argmax(-1)).float().mean().item() > 0.98


def test_calibrate_split_keeps_the_function(cuda):
    wg, wu, wd, thr = layer(512, 2048, cuda)
    hot = torch.randn(512, device=cuda, dtype=torch.bfloat16)
    wg[:300] = (wg[:300].float() + hot.float() * 0.2).to(torch.bfloat16)  # a few hundred hot neurons
    mlp = SparseGatedMLP(nn.Linear(512, 2048, bias=False), nn.Linear(512, 2048, bias=False),
                         nn.Linear(2048, 512, bias=False), threshold=thr, dispatch="sparse").to(cuda, torch.bfloat16)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(wg); mlp.up_proj.weight.copy_(wu); mlp.down_proj.weight.copy_(wd)
    x = torch.randn(4096, 512, device=cuda, dtype=torch.bfloat16) + hot
    activity, rows = mlp.neuron_activity(x)
    g = F.linear(x, wg)
    assert rows == 4096 and torch.equal(activity, (F.relu(g).float() > thr).sum(0).cpu())
    before = mlp(x)
    n = mlp.calibrate_split(x)
    assert n % 64 == 0 and 0 <= n < 2048 and mlp.dense_neurons == n
    after = mlp(x)
    torch.testing.assert_close(after.float(), before.float(), rtol=2e-2, atol=2e-2 * before.abs().max().item())


def _mlp(wg, wu, wd, **options):
    d_ff, d_model = wg.shape
    mlp = SparseGatedMLP(nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_model, d_ff, bias=False),
                         nn.Linear(d_ff, d_model, bias=False), **options).to(wg.device, wg.dtype)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(wg); mlp.up_proj.weight.copy_(wu); mlp.down_proj.weight.copy_(wd)
    return mlp


def test_module_eager_path_equals_the_operator_and_auto_chooses_per_bucket(cuda):
    wg, wu, wd, thr = layer(512, 1408, cuda)
    x = torch.randn(3, 100, 512, device=cuda, dtype=torch.bfloat16)
    sparse = _mlp(wg, wu, wd, threshold=thr, dispatch="sparse")
    with torch.inference_mode():
        fast = sparse(x)  # forward_eager, no dispatcher
    with torch.no_grad():
        op = tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr, "sparse", decision_key=sparse.decision_key)
    assert torch.equal(fast, op)
    auto = _mlp(wg, wu, wd, threshold=thr)
    with torch.inference_mode():
        for tokens in (1, 300):
            xt = torch.randn(tokens, 512, device=cuda, dtype=torch.bfloat16)
            assert_as_close_as_dense(auto(xt), xt, wg, wu, wd, "relu", thr)
    assert len(auto.paths) == 2 and set(auto.paths.values()) <= {"twell", "torch"}
    assert all(set(t) == {"twell", "torch"} and min(t.values()) > 0 for t in auto.path_times.values())
    # Captured after its warm-up; an unseen bucket during capture is refused clearly.
    static_x = torch.randn(300, 512, device=cuda, dtype=torch.bfloat16)
    with torch.inference_mode():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = auto(static_x)
        graph.replay()
        torch.cuda.synchronize()
        assert_as_close_as_dense(static_y.clone(), static_x, wg, wu, wd, "relu", thr)
        with pytest.raises(RuntimeError, match="warm-up"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                auto(torch.randn(5000, 512, device=cuda, dtype=torch.bfloat16))
    # With autograd the operator (and its backward) runs.
    xg = x.clone().requires_grad_()
    sparse(xg).float().sum().backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()


def test_per_call_overhead_is_reported(cuda, capsys):
    """Not a timed assertion: prints the host time of one eager decode-sized call and its CUDA-graph
    replay (README, "PyTorch": per-call overhead)."""
    wg, wu, wd, thr = layer(512, 1408, cuda)
    x = torch.randn(1, 512, device=cuda, dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(5):
            tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr, "sparse")
        torch.cuda.synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            tt.sparse_gated_ffn(x, wg, wu, wd, "relu", thr, "sparse")
        host_us = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        mlp = _mlp(wg, wu, wd, threshold=thr, dispatch="sparse")
        for _ in range(5):
            mlp(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            mlp(x)
        module_us = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
    with capsys.disabled():
        print(f"\n[overhead] one eager call at 1 token, host time: torch.ops.twell.sparse_gated_ffn {host_us:.1f} us, "
              f"SparseGatedMLP under inference_mode (no dispatcher) {module_us:.1f} us")
    assert host_us > 0 and module_us > 0
