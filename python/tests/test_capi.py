"""The C API through ctypes, without a GPU: loading, versions, status codes and error messages."""
import ctypes
import math

import pytest

import twell
from twell import _capi


def test_library_loads_and_versions_match():
    lib = _capi.lib()
    assert lib.twell_c_api_version() == _capi.C_API_VERSION
    assert twell.version() == twell.__version__
    assert _capi.library_path().name == "libtwell_runtime.so"


def test_status_strings_name_each_code():
    lib = _capi.lib()
    names = [lib.twell_status_string(i).decode() for i in range(11)]
    assert names[0] == "TWELL_SUCCESS" and names[1] == "TWELL_ERROR_INVALID_ARGUMENT" and names[10] == "TWELL_ERROR_INTERNAL"
    assert len(set(names)) == 11
    assert lib.twell_status_string(99).decode() == "TWELL_ERROR_UNKNOWN_STATUS"


def test_compile_only_context_reports_no_gpu_and_plans_describe_kernels():
    ctx = twell.Context(-1)
    assert not ctx.has_gpu and ctx.sm_count == 0 and ctx.target == "sm_90a"
    assert "compile only" in ctx.no_gpu_reason
    if not twell.jit_available():
        pytest.skip("SKIPPED: libtwell_jit.so not found beside libtwell_runtime.so")
    plan = ctx.plan(twell.FfnSpec(512, 1408), 256)
    d = plan.describe()
    assert d["spec"] == {"d_model": 512, "d_ff": 1408, "gated": True, "activation": "relu", "threshold": 0.0,
                         "dtype": "bf16", "down_layout": "out_in"}
    assert d["runnable"] is False and d["max_tokens"] == 256
    kinds = [k["kind"] for k in d["kernels"]]
    assert "gate_twell" in kinds and "gated_down" in kinds
    assert d["config_source"] == "heuristic"  # no GPU: the tuning database is not consulted
    # The tuning fields cross the C API (struct_size matches the library's) and are checked by type.
    opts = twell.PlanOptions(use_tuning=False, tuning_workload="density:0.5%", tuning_dir="/nonexistent/tuning")
    assert ctx.plan(twell.FfnSpec(512, 1408), 256, opts).describe()["config_source"] == "heuristic"
    with pytest.raises(twell.InvalidArgumentError, match="use_tuning"):
        twell.PlanOptions(use_tuning=1)
    with pytest.raises(twell.InvalidArgumentError, match="tuning_dir"):
        twell.PlanOptions(tuning_dir=5)
    with pytest.raises(twell.NoDeviceError, match="GPU"):
        plan.run(0, x=16, w_gate=16, w_up=16, w_down=16, y=32, tokens=1)


def test_invalid_spec_names_the_field():
    ctx = twell.Context(-1)
    with pytest.raises(twell.InvalidArgumentError, match="d_ff"):
        ctx.plan(twell.FfnSpec(512, 0), 256)
    with pytest.raises(ValueError, match="threshold"):
        ctx.plan(twell.FfnSpec(512, 1408, activation="silu", threshold=0.0), 256)
    # Above the dtype's largest finite value (issue 16: an fp16 SiLU threshold of 3e38 was accepted).
    with pytest.raises(twell.InvalidArgumentError, match="threshold: expected at most 65504 with dtype f16"):
        ctx.plan(twell.FfnSpec(512, 1408, activation="silu", threshold=3e38, dtype="fp16"), 256)
    with pytest.raises(twell.InvalidArgumentError, match="threshold: expected at most 3.38953e\\+38 with dtype bf16"):
        ctx.plan(twell.FfnSpec(512, 1408, threshold=3.4e38), 256)
    with pytest.raises(ValueError, match="dispatch"):
        ctx.plan(twell.FfnSpec(512, 1408), 256, twell.PlanOptions(dispatch="fastest"))
    with pytest.raises(ValueError, match="dense_neurons"):
        ctx.plan(twell.FfnSpec(512, 1408), 256, twell.PlanOptions(dense_neurons=100))
    with pytest.raises(ValueError, match="decode_max_tokens"):
        ctx.plan(twell.FfnSpec(512, 1408), 256, twell.PlanOptions(decode_max_tokens=65))
    # The fused decode kernel's cut-off crosses the C API and is checked by the library (0..32).
    with pytest.raises(twell.InvalidArgumentError, match="decode_fused_max_tokens: expected 0..32"):
        ctx.plan(twell.FfnSpec(512, 1408), 256, twell.PlanOptions(decode_fused_max_tokens=33))
    with pytest.raises(twell.InvalidArgumentError, match="decode_fused_max_tokens"):
        twell.PlanOptions(decode_fused_max_tokens=-1)
    # The context keeps working after errors.
    assert ctx.plan(twell.FfnSpec(256, 512), 64).describe()["spec"]["d_ff"] == 512


def test_negative_zero_threshold_is_zero():
    """Threshold -0.0 is 0.0 (issue 16: it compiled a second kernel set for the same layer): the second plan
    finds the first one's kernels in memory, under the same names."""
    ctx = twell.Context(-1, disk_cache=False)
    zero = ctx.plan(twell.FfnSpec(256, 512), 64).describe()
    negative_zero = ctx.plan(twell.FfnSpec(256, 512, threshold=-0.0), 64).describe()
    assert math.copysign(1.0, negative_zero["spec"]["threshold"]) == 1.0
    gates = [k for k in negative_zero["kernels"] if k["kind"] in ("gate_twell", "gated_down")]
    assert len(gates) >= 2 and all(k["cache"] == "memory" for k in gates), gates
    assert [k["name"] for k in zero["kernels"]] == [k["name"] for k in negative_zero["kernels"]]


def test_c_level_argument_checks():
    lib = _capi.lib()
    handle = ctypes.c_void_p()
    # NULL output pointer, NULL handle, a struct of another size, an enum out of range.
    assert lib.twell_context_create(None, None) == 1
    assert "context" in lib.twell_last_error().decode()
    assert lib.twell_plan_run(None, None, None, 1, 0) == 1
    assert "plan" in lib.twell_last_error().decode()
    opts = _capi.ContextOptions()
    lib.twell_context_options_init(ctypes.byref(opts))
    opts.struct_size = 8
    assert lib.twell_context_create(ctypes.byref(opts), ctypes.byref(handle)) == 1
    assert "struct_size" in lib.twell_last_error().decode() and not handle.value
    lib.twell_context_options_init(ctypes.byref(opts))
    opts.device, opts.jit = -1, 7
    assert lib.twell_context_create(ctypes.byref(opts), ctypes.byref(handle)) == 1
    assert "options->jit" in lib.twell_last_error().decode()
    spec = _capi.spec_struct(512, 1408)
    spec.dtype = 5
    opts.jit = 0
    assert lib.twell_context_create(ctypes.byref(opts), ctypes.byref(handle)) == 0
    plan = ctypes.c_void_p()
    assert lib.twell_plan_create(handle, ctypes.byref(spec), 64, None, ctypes.byref(plan)) == 1
    assert "spec->dtype" in lib.twell_last_error().decode() and not plan.value
    assert lib.twell_context_destroy(handle) == 0
    assert lib.twell_context_destroy(None) == 0 and lib.twell_plan_destroy(None) == 0


def test_choose_dense_neurons_checks_and_chooses():
    spec = twell.FfnSpec(2048, 5632)
    hot = [1000] * 512 + [1] * (5632 - 512)
    n = twell.choose_dense_neurons(spec, 16384, hot, 1000)
    assert n % 256 == 0 and 256 <= n <= 1024
    assert twell.choose_dense_neurons(spec, 16384, [0] * 5632, 1000) == 0
    with pytest.raises(ValueError, match="sorted"):
        twell.choose_dense_neurons(spec, 16384, [0] * 5631 + [5], 1000)


def test_bad_target_and_missing_bundle():
    with pytest.raises(ValueError, match="target"):
        twell.Context(-1, target="hopper")
    with pytest.raises(twell.NotFoundError):
        twell.Context(-1).load_bundle("/nonexistent/bundle")


def test_python_arguments_are_checked_before_ctypes():
    ctx = twell.Context(-1)
    with pytest.raises(ValueError, match="max_tokens: expected 1.."):
        ctx.plan(twell.FfnSpec(512, 1408), 2 ** 64 + 64)
    with pytest.raises(ValueError, match="max_tokens: expected an int"):
        ctx.plan(twell.FfnSpec(512, 1408), "64")
    with pytest.raises(ValueError, match="dense_neurons"):
        twell.PlanOptions(dense_neurons=2 ** 64)
    with pytest.raises(ValueError, match="d_model"):
        twell.FfnSpec(2 ** 70, 1408)
    with pytest.raises(ValueError, match="gated"):
        twell.FfnSpec(512, 1408, gated="no")
    with pytest.raises(ValueError, match="device"):
        twell.Context(device="0")
    with pytest.raises(ValueError, match="bundles"):
        twell.Context(-1, bundles="/tmp/x")
    for bad in ("sm_90aa", "sm_0", 90):
        with pytest.raises(ValueError, match="target"):
            twell.Context(-1, target=bad)
    import pathlib
    assert twell.Context(-1, cache_dir=pathlib.Path("/tmp/twell-test-cache")).target == "sm_90a"
    with pytest.raises(ValueError, match="count"):
        _capi.check(_capi.lib().twell_choose_dense_neurons(ctypes.byref(_capi.spec_struct(512, 1408)), 64, None, -5, 1,
                                                           ctypes.byref(ctypes.c_int64())))


def test_tune_needs_a_gpu_and_names_bad_arguments():
    ctx = twell.Context(-1)
    spec = twell.FfnSpec(512, 1408)
    with pytest.raises(twell.NoDeviceError, match="tune: needs a GPU"):
        ctx.tune(spec, tokens=[1, 64], density=0.01, write=False)
    with pytest.raises(twell.InvalidArgumentError, match="tokens"):
        ctx.tune(spec, tokens=[0])
    with pytest.raises(twell.InvalidArgumentError, match="density .*weights|got both"):
        ctx.tune(spec, density=0.01, weights="x.safetensors")
    with pytest.raises(twell.InvalidArgumentError, match="reps"):
        ctx.tune(spec, reps=0)
    for bad in ({"budget_s": float("nan")}, {"budget_s": "abc"}, {"density": float("inf")}, {"database": 5},
                {"tokens": "16"}, {"layer": 3}):
        with pytest.raises(twell.InvalidArgumentError, match=next(iter(bad))):
            ctx.tune(spec, **bad)
    # The C API refuses unknown request keys by name.
    out = ctypes.c_char_p()
    status = _capi.lib().twell_context_tune(ctx._handle, ctypes.byref(spec._struct()), b'{"tokenz": [1]}', ctypes.byref(out))
    assert status == 1 and "tokenz" in _capi.lib().twell_last_error().decode()
    # Strict JSON types: a float is not truncated to a count, a bool is not a number.
    for request, key in ((b'{"tokens": [1.9]}', "tokens"), (b'{"reps": true}', "reps"), (b'{"reps": 4294967301}', "reps"),
                         (b'{"layer": 3}', "layer"), (b'{"density": 0.1, "weights": ["a"]}', "density")):
        status = _capi.lib().twell_context_tune(ctx._handle, ctypes.byref(spec._struct()), request, ctypes.byref(out))
        assert status == 1 and key in _capi.lib().twell_last_error().decode(), request


def test_training_plan_without_a_gpu_describes_and_refuses_by_name():
    """twell_training_* (C API v3): a compile-only context makes the plan (its forward's and both training
    kernels), a state needs a GPU, and bad arguments are named at the C and the Python level."""
    ctx = twell.Context(-1)
    if not twell.jit_available():
        pytest.skip("SKIPPED: libtwell_jit.so not found beside libtwell_runtime.so")
    plan = ctx.training_plan(twell.FfnSpec(256, 1024), 128)
    d = plan.describe()
    assert d["runnable"] is False and d["max_tokens"] == 128 and d["layout"]["tile_n"] == 256
    kinds = [k["kind"] for k in d["kernels"]]
    assert {"gate_twell", "gated_down", "train_row_backward", "train_weight_grad"} <= set(kinds)
    with pytest.raises(twell.NoDeviceError, match="make_state"):
        plan.make_state()
    with pytest.raises(twell.InvalidArgumentError, match="backup_capacity"):
        ctx.training_plan(twell.FfnSpec(256, 1024), 128, backup_capacity=-3)
    with pytest.raises(twell.InvalidArgumentError, match="gradients_in_dtype"):
        ctx.training_plan(twell.FfnSpec(256, 1024), 128, gradients_in_dtype=2)
    with pytest.raises(twell.InvalidArgumentError, match="keep_u"):
        ctx.training_plan(twell.FfnSpec(256, 1024), 128, keep_u=1)
    with pytest.raises(twell.InvalidArgumentError, match="dw_down_as_weight"):
        ctx.training_plan(twell.FfnSpec(256, 1024), 128, dw_down_as_weight=1)
    with pytest.raises(twell.InvalidArgumentError, match="options.dw_down_as_weight"):  # out_in: a 16-bit transpose
        ctx.training_plan(twell.FfnSpec(256, 1024), 128, dw_down_as_weight=True)
    d = ctx.training_plan(twell.FfnSpec(256, 1024), 128, gradients_in_dtype=True, dw_down_as_weight=True).describe()
    assert d["gradients_in_dtype"] is True and d["dw_down_as_weight"] is True and d["keep_u"] is True
    with pytest.raises(twell.InvalidArgumentError, match="spec.consumer"):
        ctx.training_plan(twell.FfnSpec(256, 1024, consumer="token_block"), 128)
    # keep_u (the default) keeps u per TwELL word: 8 bytes per word against 4 (tile_n 256, slots 31, d_ff 1024).
    words = 1024 // 256 * 32
    assert d["state_bytes_per_row"] == 8 * words
    assert ctx.training_plan(twell.FfnSpec(256, 1024), 128, keep_u=False).describe()["state_bytes_per_row"] == 4 * words
    lib = _capi.lib()
    out = ctypes.c_void_p()
    spec = twell.FfnSpec(256, 1024)._struct()
    for flags in (32, 8 | 16):  # an unknown bit; both dispatch flags
        assert lib.twell_training_plan_create(ctx._handle, ctypes.byref(spec), 128, -1, flags, ctypes.byref(out)) == 1
        assert "flags" in lib.twell_last_error().decode()
    # v6: the dispatch (the dense path's kernels made and reported beside the TwELL ones), recalibrate.
    for dispatch in ("dense", "auto"):
        dp = ctx.training_plan(twell.FfnSpec(256, 1024), 128, dispatch=dispatch)
        dd = dp.describe()
        assert dd["dispatch"] == dispatch and dd["decisions"] == []
        assert dd["dense_state_bytes_per_row"] == 2 * 2 * 1024  # g and u, 2 bytes per neuron each
        assert {"train_dense_forward", "train_dense_backward", "train_row_backward"} <= {k["kind"] for k in dd["kernels"]}
        dp.recalibrate()
    assert d["dispatch"] == "sparse" and d["dense_neurons"] == 0
    # v7: the split (the dense path's kernels made for its dense neurons); dense_neurons checked by name.
    sd = ctx.training_plan(twell.FfnSpec(256, 1024), 128, dense_neurons=256).describe()
    assert sd["dense_neurons"] == 256 and "train_dense_backward" in {k["kind"] for k in sd["kernels"]}
    for bad in (100, -64, 1024, 64.0, True):
        with pytest.raises(twell.InvalidArgumentError, match="dense_neurons"):
            ctx.training_plan(twell.FfnSpec(256, 1024), 128, dense_neurons=bad)
    for bad in ("fast", "Dense", None, ["dense"]):
        with pytest.raises(twell.InvalidArgumentError, match="dispatch"):
            ctx.training_plan(twell.FfnSpec(256, 1024), 128, dispatch=bad)
    assert lib.twell_training_plan_create(ctx._handle, ctypes.byref(spec), 128, 2 ** 33, 0, ctypes.byref(out)) == 1
    assert "backup_capacity" in lib.twell_last_error().decode()
    assert lib.twell_training_forward(None, None, None, 1, None, None) == 1
    assert "plan" in lib.twell_last_error().decode()
    assert lib.twell_training_forward_keyed(None, None, None, 1, None, None, 7) == 1
    assert "twell_training_forward_keyed" in lib.twell_last_error().decode()
    assert lib.twell_training_forward(plan._handle, None, None, 1, None, None) == 1
    assert "state" in lib.twell_last_error().decode()
    assert lib.twell_training_backward(plan._handle, None, None, None, 0, 1, None, None, 0.0, 0, None) == 1
    assert "gradients" in lib.twell_last_error().decode()
    assert lib.twell_training_plan_destroy(None) == 0 and lib.twell_training_state_destroy(None) == 0
