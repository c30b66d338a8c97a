#!/usr/bin/env bash
# Tensor-parallel launcher: N processes on this host through torch.distributed.run (torchrun
# --standalone), one per GPU, each running SCRIPT ARGS... through scripts/tp_rank.py.
#
#   scripts/tp_launch.sh N SCRIPT [ARGS...]
#
# - Exports NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (NVLink
#   multicast off; values inherited from the caller are overridden), and every rank checks them again
#   in its own process before anything else (tp_rank.py: exit 1 naming the variable otherwise).
# - TWELL_TP_BACKEND: nccl when PyTorch sees at least N CUDA GPUs (one per rank), else gloo (CPU
#   tensors, or ranks sharing one GPU: a functional check, no measurement). Set it to force one.
#   With gloo, GLOO_SOCKET_IFNAME defaults to lo (single host; the host name may not resolve).
# - TWELL_PYTHON: the interpreter (default python3).
set -euo pipefail
die() { echo "tp_launch: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: scripts/tp_launch.sh N SCRIPT [ARGS...]"
n=$1; shift
script=$1; shift
[[ $n =~ ^[1-9][0-9]*$ ]] || die "N: expected a positive integer, got '$n'"
[ -f "$script" ] || die "$script: no such file"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${TWELL_PYTHON:-python3}

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

gpus=$("$python" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)') \
  || die "$python cannot import torch"
if [ -z "${TWELL_TP_BACKEND:-}" ]; then
  if [ "$gpus" -ge "$n" ]; then TWELL_TP_BACKEND=nccl; else TWELL_TP_BACKEND=gloo; fi
fi
case $TWELL_TP_BACKEND in
  nccl) [ "$gpus" -ge "$n" ] || die "TWELL_TP_BACKEND=nccl needs $n CUDA GPUs (one per rank); PyTorch sees $gpus" ;;
  gloo) export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} ;;
  *) die "TWELL_TP_BACKEND: expected nccl or gloo, got '$TWELL_TP_BACKEND'" ;;
esac
export TWELL_TP_BACKEND

echo "tp_launch: $n processes, backend $TWELL_TP_BACKEND ($gpus CUDA GPUs visible);" \
     "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1" >&2
exec "$python" -m torch.distributed.run --standalone --nproc-per-node "$n" "$root/scripts/tp_rank.py" "$script" "$@"
