#!/bin/sh
# The Python GPU tests (test_torch_gpu.py, test_tensor_parallel.py). Without a GPU pytest skips each
# test loudly (-rs lists the reasons) and this script exits 77, which ctest reports as Skipped.
python="$1"; tests="$2"
"$python" -m pytest -q -rs -p no:cacheprovider "$tests/test_torch_gpu.py" "$tests/test_tensor_parallel.py"
rc=$?
[ $rc -ne 0 ] && exit $rc
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "python_gpu: SKIPPED: no CUDA GPU visible to PyTorch; nothing above ran on a GPU"
  exit 77
fi
