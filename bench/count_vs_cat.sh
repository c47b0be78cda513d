#!/usr/bin/env bash
# Whole-process target of docs/PERFORMANCE.md: `recflow count` of a 1 GiB
# file in the page cache next to `cat FILE > /dev/null`, for 100 KiB and
# 100-byte records.  Runs alternate (cat, count, cat, count, ...) so that
# both see the same machine; prints each median and the ratio.
#
#   bash bench/count_vs_cat.sh [BUILD_DIR] [RUNS]
set -euo pipefail
build=${1:-build}
runs=${2:-11}
dir=${TMPDIR:-/tmp}/recflow-bench
mkdir -p "$dir"
recflow=$build/tools/recflow
make=$build/bench/make_bench_file

seconds() {  # seconds one run of "$@" takes, to the microsecond
  local t0 t1
  t0=$(date +%s%N)
  "$@" > /dev/null
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f\n", (b - a) / 1e9}'
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for size in 102400 100; do
  file=$dir/count-$size.tfrecord
  [[ -f $file ]] || "$make" "$file" "$size" $((1 << 30)) > /dev/null
  cat "$file" > /dev/null  # into the page cache
  "$recflow" count "$file" > /dev/null
  cat_times=() count_times=()
  for ((i = 0; i < runs; i++)); do
    cat_times+=("$(seconds cat "$file")")
    count_times+=("$(seconds "$recflow" count "$file")")
  done
  c=$(printf '%s\n' "${cat_times[@]}" | median)
  r=$(printf '%s\n' "${count_times[@]}" | median)
  printf '%7s-byte records: cat %.3f s, recflow count %.3f s, ratio %.2f\n' \
    "$size" "$c" "$r" "$(awk -v r="$r" -v c="$c" 'BEGIN {print r / c}')"
done
