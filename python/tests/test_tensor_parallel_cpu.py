"""Tensor parallelism without a GPU: scripts/tp_launch.sh starting gloo ranks on the CPU, the per-rank
launch check (NVLink multicast off), and bench/sparse_lm/tp_model.py's Megatron-style sharding of the
whole model (attention by heads, the dense MLP by d_ff) against the single-process model. The twell
variant of the same run needs a GPU (twell's kernels) and skips loudly without one."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import twell
from conftest import gpu_reason

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "scripts" / "tp_launch.sh"
RANK_WRAPPER = ROOT / "scripts" / "tp_rank.py"
WORKER = pathlib.Path(__file__).resolve().parent / "tp_worker.py"
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TIMEOUT = 300

sys.path.insert(0, str(ROOT / "bench" / "sparse_lm"))
import tp_model  # noqa: E402
from model import Attention, GatedMLP, SparseLMConfig, rope_tables  # noqa: E402


def child_env(**overrides):
    """This environment for a child: this interpreter, this twell package on PYTHONPATH, no NVLS
    variables inherited (each test sets what it means to), `overrides` (None removes)."""
    env = {k: v for k, v in os.environ.items() if k not in NVLS_OFF and k not in ("TWELL_TP_BACKEND", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    package_root = str(pathlib.Path(twell.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["TWELL_PYTHON"] = sys.executable
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def launch(n, *args, **env):
    return subprocess.run(["bash", str(LAUNCH), str(n), *map(str, args)], env=child_env(**env),
                          capture_output=True, text=True, timeout=TIMEOUT)


def read_json(path):
    return json.loads(path.read_text())


# ---- the sharding math, in one process ---------------------------------------------------------------

def test_shards_of_the_dense_mlp_sum_to_the_full_mlp():
    torch.manual_seed(0)
    mlp = GatedMLP(64, 176).double()
    x = torch.randn(5, 64, dtype=torch.double)
    from twell.torch.parallel import shard_rows
    for world in (1, 2, 3):
        slices = [shard_rows(176, world, r) for r in range(world)]
        assert slices[0][0] == 0 and slices[-1][1] == 176
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))  # a partition of the neurons
        partials = []
        for first, last in slices:
            shard = tp_model.ColumnRowParallelMLP(mlp, first=first, last=last)
            assert shard.gate_proj.weight.shape == (last - first, 64) and shard.down_proj.weight.shape == (64, last - first)
            partials.append(shard.down_proj(shard.act_fn(shard.gate_proj(x)) * shard.up_proj(x)))  # before the all-reduce
        torch.testing.assert_close(sum(partials), mlp(x), rtol=1e-12, atol=1e-12)


def test_head_shards_of_attention_sum_to_the_full_attention():
    torch.manual_seed(0)
    config = SparseLMConfig(d_model=64, d_ff=176, n_layers=1, n_heads=4, max_seq=16)
    attention = Attention(config).double()
    x = torch.randn(2, 7, 64, dtype=torch.double)
    cos, sin = rope_tables(16, 16)
    cos, sin = cos[:7], sin[:7]
    for world in (1, 2, 4):
        partials = []
        for rank in range(world):
            first, last = tp_model.heads_of(4, world, rank)
            shard = tp_model.HeadParallelAttention(attention, first=first, last=last)
            assert shard.n_heads == last - first and shard.qkv_proj.weight.shape == (3 * 16 * (last - first), 64)
            partials.append(Attention.forward(shard, x, cos, sin))  # the partial sum, before the all-reduce
        torch.testing.assert_close(sum(partials), attention(x, cos, sin), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="4 heads do not split evenly over 3 ranks"):
        tp_model.heads_of(4, 3, 0)


# ---- the launcher and the per-rank check ---------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2])
def test_launcher_runs_gloo_ranks_on_the_cpu_and_the_tp_model_matches(tmp_path, world):
    # An inherited NCCL_NVLS_ENABLE=1 must be overridden; CUDA hidden so that this is the CPU path anywhere.
    proc = launch(world, WORKER, "--out", tmp_path, CUDA_VISIBLE_DEVICES="", NCCL_NVLS_ENABLE="1")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"tp_launch: {world} processes, backend gloo" in proc.stderr
    for rank in range(world):
        assert f"tp_rank {rank}/{world}: checked NVLink multicast off" in proc.stderr
        seen = read_json(tmp_path / f"env_rank{rank}.json")
        assert seen["env"] == {**NVLS_OFF, "TWELL_TP_BACKEND": "gloo"}
        assert (seen["world"], seen["device"], seen["backend"]) == (world, "cpu", "gloo")
    r = read_json(tmp_path / "results.json")
    assert r["shards"] == {"heads": [4 // world] * 2, "kv_heads": 4 // world, "d_ff": [1408 // world] * 2}
    checks = r["checks"]
    for name in ("dense", "dense_fp32_reduce"):
        for kind in ("mlp", "logits", "decode"):
            entries = checks[name][kind] if kind == "mlp" else [checks[name][kind]]
            for entry in entries:
                assert entry["ok"], (name, kind, entry)
                if world == 1:  # one rank: the same GEMMs as the single-process model, bit for bit
                    assert entry["tp_vs_single"] == 0.0, (name, kind, entry)
                else:  # a different bf16 rounding, but some: the comparison is not vacuous
                    assert 0.0 < entry["tp_vs_single"] <= entry["tolerance"], (name, kind, entry)
    if world == 2:
        # The negative controls: a duplicated/missing neuron or head is far outside the tolerance.
        broken = checks["broken"]
        assert not any(e["ok"] for e in broken["mlp"]) and not broken["logits"]["ok"] and not broken["decode"]["ok"]
        assert min(e["tp_vs_single"] / e["tolerance"] for e in broken["mlp"]) > 10
        wrong_heads = checks["broken_attention"]
        assert all(e["ok"] for e in wrong_heads["mlp"])  # the MLP checks take the single model's inputs
        assert not wrong_heads["logits"]["ok"] and not wrong_heads["decode"]["ok"]
        assert not r["ok"]
    assert "twell" not in checks


def test_launcher_twell_path_two_ranks(tmp_path):
    reason = gpu_reason()
    if reason:
        pytest.skip(f"SKIPPED: the twell variant of the tensor-parallel model needs a GPU (twell's kernels); {reason}")
    proc = launch(2, WORKER, "--out", tmp_path, "--twell")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    checks = read_json(tmp_path / "results.json")["checks"]
    for kind in ("mlp", "logits", "decode"):
        for entry in checks["twell"][kind] if kind == "mlp" else [checks["twell"][kind]]:
            assert entry["ok"], (kind, entry)


def _rank_env(**overrides):
    return child_env(**{**NVLS_OFF, "TWELL_TP_BACKEND": "gloo", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", **overrides})


def test_a_rank_runs_its_script_when_the_environment_is_right(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import json, pathlib, sys\npathlib.Path(sys.argv[1]).write_text(json.dumps(sys.argv))\n")
    marker = tmp_path / "ran.json"
    proc = subprocess.run([sys.executable, str(RANK_WRAPPER), str(script), str(marker), "--flag", "a b"],
                          env=_rank_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert read_json(marker) == [str(script), str(marker), "--flag", "a b"]
    assert "tp_rank 1/2: checked NVLink multicast off" in proc.stderr


@pytest.mark.parametrize("overrides, message", [
    ({"NCCL_NVLS_ENABLE": None}, "NCCL_NVLS_ENABLE is unset (expected 0)"),
    ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": None}, "TORCH_SYMM_MEM_DISABLE_MULTICAST is unset (expected 1)"),
    ({"NVSHMEM_DISABLE_NVLS": None}, "NVSHMEM_DISABLE_NVLS is unset (expected 1)"),
    ({"NVSHMEM_DISABLE_NVLS": "0"}, "NVSHMEM_DISABLE_NVLS='0' (expected '1')"),
    ({"NCCL_NVLS_ENABLE": "1"}, "NCCL_NVLS_ENABLE='1' (expected '0')"),
    ({"TWELL_TP_BACKEND": None}, "TWELL_TP_BACKEND=None (expected one of nccl, gloo"),
    ({"RANK": None}, "RANK is unset (this process was not started by torch.distributed.run)"),
])
def test_a_rank_refuses_to_start_without_nvlink_multicast_off(tmp_path, overrides, message):
    script = tmp_path / "script.py"
    marker = tmp_path / "ran"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    proc = subprocess.run([sys.executable, str(RANK_WRAPPER), str(script)], env=_rank_env(**overrides),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "launch check FAILED" in proc.stderr and message in proc.stderr, proc.stderr
    assert "scripts/tp_launch.sh" in proc.stderr
    assert not marker.exists()  # the script never started
    # The benchmark repeats the same check in its own process (tp_model.init_distributed).
    with pytest.raises(SystemExit, match="launch check FAILED"):
        tp_model.check_launch_env({k: v for k, v in _rank_env(**overrides).items()})


@pytest.mark.parametrize("args, env, message", [
    ([], {}, "usage: scripts/tp_launch.sh N SCRIPT"),
    (["0", "x.py"], {}, "N: expected a positive integer, got '0'"),
    (["2", "no/such/script.py"], {}, "no/such/script.py: no such file"),
    (["2", str(WORKER)], {"TWELL_TP_BACKEND": "mpi"}, "TWELL_TP_BACKEND: expected nccl or gloo, got 'mpi'"),
    (["2", str(WORKER)], {"TWELL_TP_BACKEND": "nccl", "CUDA_VISIBLE_DEVICES": ""}, "TWELL_TP_BACKEND=nccl needs 2 CUDA GPUs (one per rank); PyTorch sees 0"),
])
def test_launcher_argument_errors(args, env, message):
    proc = subprocess.run(["bash", str(LAUNCH), *args], env=child_env(**env), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
