#!/usr/bin/env bash
# Target of docs/DISTRIBUTED.md / PERFORMANCE.md (data-parallel training):
# the step time of N MPI ranks (1 thread each, the same per-rank batch,
# each bound to a core of its own: mpirun's --bind-to core) against one
# process on 1 thread bound the same way (mpirun -np 1), the same model and
# input, in one run, alternating, RUNS times; prints each run and the
# medians.  Also one process not bound ("free"): its input pipeline then
# runs on the cores the ranks would use, so it is the figure to beat per
# process, not per core.  The model is
# the demo's DNN (784-256-128-10, 235k parameters: a 0.94 MB all-reduce a
# step) or --model cnn, on Fashion-MNIST (Debian: dataset-fashion-mnist).
#
#   bash bench/distributed_bench.sh [BUILD_DIR] [RUNS] [RANKS] [MODEL] [STEPS]
set -euo pipefail
build=${1:-build}
runs=${2:-3}
ranks=${3:-2}
model=${4:-dnn}
steps=${5:-600}
recflow=$build/tools/recflow
data=/usr/share/datasets/fashion-mnist
work=${TMPDIR:-/tmp}/recflow-bench/distributed
mkdir -p "$work"
if [[ ! -f $work/train-00007-of-00008.tfrecord.idx ]]; then
  "$recflow" convert idx --images "$data/train-images-idx3-ubyte.gz" \
    --labels "$data/train-labels-idx1-ubyte.gz" --output "$work/train" \
    --shards 8 --index >/dev/null
  "$recflow" convert idx --images "$data/t10k-images-idx3-ubyte.gz" \
    --labels "$data/t10k-labels-idx1-ubyte.gz" --output "$work/eval" \
    --shards 2 >/dev/null
fi
spec=$work/spec.json
cat >"$spec" <<'JSON'
{"features": {"image": {"kind": "fixed", "dtype": "bytes", "shape": []},
              "label": {"kind": "fixed", "dtype": "int64", "shape": []}}}
JSON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One evaluation at the end only; train_seconds counts the steps alone.
args=(train --model "$model" --spec "$spec" --train "$work/train-*.tfrecord"
  --eval "$work/eval-00000-of-00002.tfrecord" --batch 128 --threads 1
  --steps "$steps" --eval-every "$steps" --save-checkpoints-steps 100000
  --image-shape 28,28,1 --json)
step_ms() {  # JSON line -> ms per step
  local s
  s=$(grep -o '"train_seconds":[0-9.e+-]*' <<<"$1" | cut -d: -f2)
  awk -v s="$s" -v n="$steps" 'BEGIN {printf "%.3f", 1000 * s / n}'
}
one=() many=() free=()
for ((i = 0; i < runs; i++)); do
  rm -rf "$work"/m1 "$work"/mn "$work"/mf
  out=$(mpirun -np 1 --bind-to core "$recflow" "${args[@]}" --global-shuffle \
    --model-dir "$work/m1" | tail -1)
  one+=("$(step_ms "$out")")
  out=$(mpirun -np "$ranks" --bind-to core "$recflow" "${args[@]}" \
    --model-dir "$work/mn" | tail -1)
  many+=("$(step_ms "$out")")
  out=$("$recflow" "${args[@]}" --global-shuffle --model-dir "$work/mf" | tail -1)
  free+=("$(step_ms "$out")")
  echo "run $((i + 1)): 1 process ${one[-1]} ms/step, $ranks ranks ${many[-1]} ms/step (1 process, free: ${free[-1]})"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m1=$(median "${one[@]}") mn=$(median "${many[@]}") mf=$(median "${free[@]}")
echo "median: 1 process $m1 ms/step; $ranks ranks $mn ms/step; 1 process free $mf ms/step (batch 128 each, $model, 1 thread each)"
awk -v a="$m1" -v b="$mn" -v f="$mf" -v n="$ranks" 'BEGIN {
  printf "step time ratio %d ranks / 1 process: %.2fx (/ free process: %.2fx); examples/s %.2fx of 1 process\n", n, b / a, b / f, n * a / b }'
