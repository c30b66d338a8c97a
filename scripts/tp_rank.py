"""One rank of scripts/tp_launch.sh: checks, inside this process, the environment the launcher
exported, then runs the given script as `python script args` would (as __main__, its folder first on
sys.path).

Checked (a failure exits 1 naming every problem, before torch is imported or any communicator exists):
NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1:
issue 18; on the shared multi-GPU hosts a program using multicast can put the GPUs out of service for
everyone), TWELL_TP_BACKEND
(nccl or gloo, chosen by the launcher), and RANK / LOCAL_RANK / WORLD_SIZE (set by
torch.distributed.run). Scripts import this file to repeat the check themselves (tp_model.py does), so
that one started by a bare torchrun fails the same way.

    python -m torch.distributed.run --standalone --nproc-per-node N scripts/tp_rank.py SCRIPT [ARGS...]
"""
import os
import runpy
import sys

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BACKENDS = ("nccl", "gloo")
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def launch_env_problems(environ=None):
    """The list of what is wrong with `environ` (default os.environ): empty when the check passes."""
    environ = os.environ if environ is None else environ
    problems = []
    for name, want in NVLS_OFF.items():
        got = environ.get(name)
        if got is None:
            problems.append(f"{name} is unset (expected {want})")
        elif got != want:
            problems.append(f"{name}={got!r} (expected {want!r})")
    backend = environ.get("TWELL_TP_BACKEND")
    if backend not in BACKENDS:
        problems.append(f"TWELL_TP_BACKEND={backend!r} (expected one of {', '.join(BACKENDS)}; the launcher sets it)")
    for name in RANK_VARIABLES:
        if name not in environ:
            problems.append(f"{name} is unset (this process was not started by torch.distributed.run)")
    return problems


def check_launch_env(environ=None):
    """Raises SystemExit (exit status 1, the message on stderr) unless the launch environment is right."""
    environ = os.environ if environ is None else environ
    problems = launch_env_problems(environ)
    if problems:
        who = f"tp_rank {environ.get('RANK', '?')}/{environ.get('WORLD_SIZE', '?')}"
        wanted = " ".join(f"{k}={v}" for k, v in NVLS_OFF.items())
        raise SystemExit(f"{who}: launch check FAILED: {'; '.join(problems)}. Every process must run with NVLink "
                         f"multicast off ({wanted}): start it with scripts/tp_launch.sh N SCRIPT [ARGS...]")


def main():
    if len(sys.argv) < 2:
        raise SystemExit("usage: tp_rank.py SCRIPT [ARGS...] (started by scripts/tp_launch.sh)")
    check_launch_env()
    env = os.environ
    print(f"tp_rank {env['RANK']}/{env['WORLD_SIZE']}: checked NVLink multicast off "
          f"({' '.join(f'{k}={env[k]}' for k in NVLS_OFF)}), backend {env['TWELL_TP_BACKEND']}",
          file=sys.stderr, flush=True)
    script = sys.argv[1]
    if not os.path.isfile(script):
        raise SystemExit(f"tp_rank: {script}: no such file")
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script` would
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
