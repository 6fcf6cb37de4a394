#!/usr/bin/env bash
# The GPU checks in one run (about 10 minutes on one GPU): both CIFAR programs at 2 towers / 2
# replicas, both MNIST programs with their evaluators, the parity harness, and the CIFAR benchmark
# (the legacy program as the original runs it against the modern one, 2 towers on the GPUs there
# are, global batch 64 and 256, beside a matmul peak measured in the same run).  Prints a summary
# and writes every log to $OUT (default reports/gpu_check).
#
#   tools/gpu_check.sh                    # from the repository root, after pip install -e '.[gpu]'
#   OUT=/tmp/gpu tools/gpu_check.sh
#
# Without a GPU it runs the same checks on the CPU, smaller (6 CIFAR steps, 200 MNIST steps, one
# benchmark batch of 16), so that the script itself is known to work before a GPU is at hand.
# On one GPU the two towers / replicas share it: the modern side splits it into two logical GPUs of
# $REPLICA_GPU_MEMORY_MB each, set here to just under half the GPU's memory unless given.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/reports/gpu_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)  # the programs write data/, models/, logs/ under their working folder
trap 'rm -rf "$WORK"' EXIT
for package in legacy modern compare records examples; do ln -s "$ROOT/$package" "$WORK/$package"; done
cd "$WORK"

GPUS=$(python -c "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))" 2>/dev/null || echo 0)
if [ "$GPUS" -gt 0 ]; then
    MODE="GPU ($GPUS: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
    CIFAR_STEPS=60; MNIST_STEPS=1000; BATCHES="64 256"; BENCH_STEPS=20
    if [ -z "${REPLICA_GPU_MEMORY_MB:-}" ] && [ "$GPUS" -lt 2 ]; then
        total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
        [ -n "$total" ] && export REPLICA_GPU_MEMORY_MB=$(( total / 2 - 2048 ))
    fi
else
    MODE="CPU fallback (no GPU found)"
    CIFAR_STEPS=6; MNIST_STEPS=200; BATCHES="16"; BENCH_STEPS=3
fi
echo "gpu_check: $MODE; logs in $OUT"

SUMMARY=()
run() {  # run NAME TIMEOUT COMMAND...: log to $OUT/NAME.log, one summary line
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "[$(date +%T)] $name: $*"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$? seconds=$(( SECONDS - start ))
    local verdict=ok
    [ $rc -ne 0 ] && verdict="FAILED (exit $rc)"
    # A loss or an accuracy that is not a number fails the run, whatever the exit code.
    if grep -Eiq '(loss[ =:,]+|accuracy[ =]+)nan' "$OUT/$name.log"; then verdict="FAILED (NaN)"; fi
    local placed last
    placed=$(grep -E 'placed on|split into|towers on|no GPUs for' "$OUT/$name.log" | head -1)
    last=$(grep -v -E '^(W|I|E)[0-9]{4} |^WARNING: All log' "$OUT/$name.log" | tail -1)
    SUMMARY+=("$(printf '%-18s %-16s %5ss  %s' "$name" "$verdict" "$seconds" "${placed:+[$placed] }$last")")
}

run legacy_cifar      900 python legacy/cifar_resnet.py --towers 2 --max_steps "$CIFAR_STEPS" --valid_every "$CIFAR_STEPS"
run modern_cifar      900 python modern/cifar_resnet.py --towers 2 --max_steps "$CIFAR_STEPS" --valid_every "$CIFAR_STEPS"
run legacy_mnist      600 python legacy/mnist_multi_gpu.py --towers 2 --max_steps "$MNIST_STEPS"
run legacy_mnist_eval 300 python legacy/mnist_eval.py
run modern_mnist      600 python modern/mnist_multi_gpu.py --towers 2 --max_steps "$MNIST_STEPS"
run modern_mnist_eval 300 python modern/mnist_eval.py
run parity           1200 python compare/run.py --quick --report "$OUT/parity.json"
# shellcheck disable=SC2086  # BATCHES is a list of numbers
run bench            1800 python benchmarks/bench.py --model cifar --replicas 2 --batch $BATCHES \
    --variants legacy-feed modern --warmup 5 --steps "$BENCH_STEPS" --repeats 2 --json "$OUT/bench.json"

{
    echo
    echo "gpu_check summary: $MODE"
    printf '%s\n' "${SUMMARY[@]}"
    echo
    echo "parity:"; grep -E '^[0-9]+ PASS' "$OUT/parity.log" || echo "  (no summary line: see $OUT/parity.log)"
    grep -E 'FAIL' "$OUT/parity.log" | grep -v ' 0 FAIL' | head -20
    echo
    echo "benchmark:"; grep -E '^(matmul peak|model |cifar )' "$OUT/bench.log" || echo "  (no table: see $OUT/bench.log)"
} | tee "$OUT/summary.txt"
! grep -q FAILED "$OUT/summary.txt"
