#!/usr/bin/env bash
# Two recflow builds' pipelines side by side: the steady sweeps of
# scripts/gpu_session.sh (`recflow bench --threads 1,2,4,8,16 --warmup
# 200`, Fashion-MNIST shuffled and parse-only over 16 shards read 16 at
# once, and the MNIST fixture shuffled), alternating the builds ROUNDS
# times, one line per build, pipeline and thread count: records/s, the
# speed-up over its one thread, the planner's ns a record (the fused
# stage's "batch" busy time over the records), the consumer's share of
# the run in Next() and on a core, the cores busy, and the order digest
# (the same for both builds where the change keeps the order).  What the
# eleventh session ran on the 16-core machine (docs/PERFORMANCE.md).
#
#   bash bench/pipeline_ab.sh OLD_RECFLOW NEW_RECFLOW [ROUNDS] [THREADS]
#   e.g. bash bench/pipeline_ab.sh /tmp/old build/tools/recflow 3 1,2
# KINDS="mnist_shuffled" (say): only those of the three pipelines
# (shuffled, parse_only, mnist_shuffled).
# Needs Fashion-MNIST's .gz files (/usr/share/datasets/fashion-mnist, or
# FASHION_MNIST=DIR) and ../shared/fixtures/tf/tfx_mnist_1000_example.tfrecord.
set -euo pipefail
old=$(realpath "$1")
new=$(realpath "$2")
rounds=${3:-3}
threads=${4:-1,2,4,8,16}
here=$(cd "$(dirname "$0")/.." && pwd)
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
work=${TMPDIR:-/tmp}/recflow-bench/ab
mnist=$here/../shared/fixtures/tf/tfx_mnist_1000_example.tfrecord
mkdir -p "$work/fm"
if [[ ! -f $work/fm/train-00015-of-00016.tfrecord ]]; then
  "$new" convert idx --images "$data/train-images-idx3-ubyte.gz" \
    --labels "$data/train-labels-idx1-ubyte.gz" --output "$work/fm/train" \
    --shards 16 >/dev/null
fi
"$new" inspect --spec "$work/fm/train-00000-of-00016.tfrecord" >"$work/fm.json"
"$new" inspect --spec "$mnist" >"$work/mnist.json"

# sweep BIN KIND: one steady sweep, a line per thread count.
sweep() {
  local args
  case $2 in
    shuffled) args=("$work/fm/train-*.tfrecord" --spec "$work/fm.json"
                    --repeat 40 --parallel-reads 16 --shuffle 10000) ;;
    parse_only) args=("$work/fm/train-*.tfrecord" --spec "$work/fm.json"
                      --repeat 40 --parallel-reads 16) ;;
    mnist_shuffled) args=("$mnist" --spec "$work/mnist.json" --repeat 1200
                          --shuffle 10000) ;;
  esac
  "$1" bench "${args[@]}" --batch 256 --map-threads -1 --seed 1 \
    --threads "$threads" --warmup 200 --json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    planner = sum(s["busy_seconds"] for s in d["stages"] if s["name"] == "batch")
    print("%-8s %-15s T=%2d %7.2f M/s %5.2fx planner %3.0f ns in Next %.2f"
          " on a core %.2f cores %4.1f %s"
          % (sys.argv[1], sys.argv[2], d["threads"], d["records_per_s"] / 1e6,
             d["speedup"], planner / max(d["records"], 1) * 1e9,
             d["consumer_in_next_fraction"], d["consumer_cpu_fraction"],
             d["cores_busy"], d["order_digest"]))' "$3" "$2"
}
for ((r = 1; r <= rounds; r++)); do
  echo "== round $r"
  for kind in ${KINDS:-shuffled parse_only mnist_shuffled}; do
    sweep "$old" "$kind" old
    sweep "$new" "$kind" new
  done
done
