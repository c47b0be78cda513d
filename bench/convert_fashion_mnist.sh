#!/usr/bin/env bash
# Target of docs/PERFORMANCE.md: convert Fashion-MNIST's 60,000 training
# images (Debian package dataset-fashion-mnist) from IDX into 8 shards,
# timed over several runs; prints each run and the median.
#
#   bash bench/convert_fashion_mnist.sh [BUILD_DIR] [RUNS]
set -euo pipefail
build=${1:-build}
runs=${2:-5}
data=/usr/share/datasets/fashion-mnist
out=${TMPDIR:-/tmp}/recflow-bench/fashion-mnist
mkdir -p "$out"
times=()
for ((i = 0; i < runs; i++)); do
  rm -f "$out"/train-*
  t0=$(date +%s%N)
  "$build/tools/recflow" convert idx \
    --images "$data/train-images-idx3-ubyte.gz" \
    --labels "$data/train-labels-idx1-ubyte.gz" \
    --output "$out/train" --shards 8 --index > /dev/null
  t1=$(date +%s%N)
  times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", (b - a) / 1e9}')")
done
printf 'runs: %s s\n' "${times[*]}"
printf 'median: %s s (60000 images, 8 shards with indexes)\n' \
  "$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
