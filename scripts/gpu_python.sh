#!/usr/bin/env bash
# The Python side on the GPU machine (device tool): .carry/lib holds the libraries, .carry/data the
# real data and the corpus (scripts/pack_carry.sh python); TWELL_LIB_DIR / TWELL_DATA_DIR override them
# (e.g. .carry/build/lib after the full scripts/pack_carry.sh). Steps by $TWELL_STEPS (default all):
#   tests   pytest python/tests (GPU and CPU)           bench  bench/torch_ffn_bench.py
#   train_mild / train_strong   bench/sparse_lm/train.py at $TWELL_L1_MILD / $TWELL_L1_STRONG
#   model   bench/sparse_lm/bench_model.py on the strong checkpoint
#   tp      bench/sparse_lm/bench_tp.py on the strong checkpoint through scripts/tp_launch.sh, tensor-parallel
#           degree $TWELL_TP_DEGREE (default 1), extra arguments $TWELL_TP_ARGS (not in the default steps)
#   train_bench   bench/torch_train_bench.py: one layer's training step, twell vs PyTorch autograd
#   train_pair    bench/sparse_lm/train.py --steps $TWELL_TRAIN_STEPS (500) dense, then --ffn twell
#                 --twell-dispatch $TWELL_TRAIN_DISPATCH (sparse), seed $TWELL_SEED (0): bench/README.md v46
#   (train_bench and train_pair are not in the default steps)
# Logs and JSON go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export TWELL_LIB_DIR=${TWELL_LIB_DIR:-$PWD/.carry/lib} PYTHONPATH=$PWD/python TWELL_DATA_DIR=${TWELL_DATA_DIR:-$PWD/.carry/data}
export TWELL_CACHE_DIR=${TWELL_CACHE_DIR:-/tmp/twell-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" build/lm
steps=${TWELL_STEPS:-train_strong model bench tests train_mild}
secs=${TWELL_TRAIN_SECONDS:-150}
python3 -c "import torch, sys; print('torch', torch.__version__, torch.cuda.get_device_name(), 'python', sys.version.split()[0])"
python3 -c "import transformers; print('transformers', transformers.__version__)" 2>/dev/null || echo "transformers: absent"
status=0
for step in $steps; do
  t0=$(date +%s)
  case $step in
    tests) timeout ${TWELL_TEST_TIMEOUT:-300} python3 -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=120 python/tests > "$OUT/pytest.txt" 2>&1; status=$((status | $?)); tail -n 30 "$OUT/pytest.txt" ;;
    bench) timeout 240 python3 bench/torch_ffn_bench.py --json "$OUT/torch_ffn_bench.json" > "$OUT/torch_ffn_bench.txt" 2>&1; tail -n 20 "$OUT/torch_ffn_bench.txt" ;;
    train_mild) timeout $((secs + 120)) python3 bench/sparse_lm/train.py --corpus .carry/data/gcide.dict.dz --batch 16 --seq 2048 \
        --l1 ${TWELL_L1_MILD:-3e-6} --l1-warmup-frac 0.1 --seconds $secs --out build/lm/mild.pt > "$OUT/train_mild.jsonl" 2>&1; tail -4 "$OUT/train_mild.jsonl" ;;
    train_strong) timeout $((secs + 120)) python3 bench/sparse_lm/train.py --corpus .carry/data/gcide.dict.dz --batch 16 --seq 2048 \
        --l1 ${TWELL_L1_STRONG:-3e-5} --l1-warmup-frac 0.1 --seconds $secs --out build/lm/strong.pt > "$OUT/train_strong.jsonl" 2>&1; tail -4 "$OUT/train_strong.jsonl" ;;
    model) timeout 400 python3 bench/sparse_lm/bench_model.py --ckpt build/lm/strong.pt --corpus .carry/data/gcide.dict.dz \
        --json "$OUT/bench_model.json" ${TWELL_MODEL_ARGS:-} > "$OUT/bench_model.txt" 2>&1; tail -n 30 "$OUT/bench_model.txt" ;;
    train_bench) timeout 400 python3 bench/torch_train_bench.py --json "$OUT/torch_train_bench.json" > "$OUT/torch_train_bench.txt" 2>&1
        status=$((status | $?)); grep '|' "$OUT/torch_train_bench.txt" ;;
    train_pair) for ffn in torch twell; do
        timeout 300 python3 bench/sparse_lm/train.py --corpus .carry/data/gcide.dict.dz --batch 16 --seq 2048 --l1 3e-4 \
          --l1-warmup-frac 0.1 --steps ${TWELL_TRAIN_STEPS:-500} --seed ${TWELL_SEED:-0} --ffn $ffn \
          --twell-dispatch ${TWELL_TRAIN_DISPATCH:-sparse} --out build/lm/pair_$ffn.pt > "$OUT/train_pair_$ffn.jsonl" 2>&1
        status=$((status | $?)); tail -1 "$OUT/train_pair_$ffn.jsonl"; done ;;
    tp) deg=${TWELL_TP_DEGREE:-1}; timeout 580 scripts/tp_launch.sh $deg bench/sparse_lm/bench_tp.py --ckpt build/lm/strong.pt \
        --corpus .carry/data/gcide.dict.dz --json "$OUT/bench_tp$deg.json" ${TWELL_TP_ARGS:-} > "$OUT/bench_tp$deg.txt" 2>&1
        status=$((status | $?)); tail -n 30 "$OUT/bench_tp$deg.txt" ;;
  esac
  echo "== step $step: $(( $(date +%s) - t0 )) s"
done
exit $status
