#!/usr/bin/env bash
# `mpirun -np 2 recflow train` end to end (ctest: tools.train_mpirun_kill_and_resume):
#   1. two ranks train, evaluate and report as one job;
#   2. one rank killed with SIGKILL mid-training: the job ends non-zero
#      within a bounded time (no rank left waiting in a collective);
#   3. the same command again resumes from the chief's last checkpoint;
#   4. one process (--global-shuffle) continues the two ranks' checkpoint.
# Usage: train_mpirun_test.sh RECFLOW MPIRUN
set -euo pipefail
recflow=$1 mpirun=$2
dir=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
cd "$dir"

fail() { echo "FAIL: $*" >&2; exit 1; }
json_field() { grep -o "\"$1\":[^,}]*" <<<"$2" | tail -1 | cut -d: -f2; }

# Two numeric features, label 1 when x + 2y > 0.5.
for part in train:3001 eval:500; do
  name=${part%%:*} rows=${part##*:}
  awk -v n="$rows" -v s="${#name}" 'BEGIN {
    srand(s); print "x,y,label";
    for (i = 0; i < n; i++) { x = 2*rand()-1; y = 2*rand()-1;
      printf "%.5f,%.5f,%d\n", x, y, (x + 2*y > 0.5) }
  }' >"$name.csv"
  "$recflow" convert csv "$name.csv" -o "$name" -n 2 >/dev/null
  "$recflow" index "$name"-*.tfrecord >/dev/null
done
cat >spec.json <<'JSON'
{"features": {"x": {"kind": "fixed", "dtype": "float", "shape": []},
              "y": {"kind": "fixed", "dtype": "float", "shape": []},
              "label": {"kind": "fixed", "dtype": "int64", "shape": []}}}
JSON
train() {  # train MODEL_DIR STEPS [more flags]
  local model_dir=$1 steps=$2
  shift 2
  "$recflow" train --model dnn --spec spec.json --train 'train-*.tfrecord' \
    --eval 'eval-*.tfrecord' --model-dir "$model_dir" --classes 2 --batch 16 \
    --hidden 8 --learning-rate 0.05 --threads 1 --steps "$steps" \
    --eval-every 1000000 "$@"
}

echo "== 1. two ranks train as one job"
out=$("$mpirun" -np 2 "$recflow" train --model dnn --spec spec.json \
  --train 'train-*.tfrecord' --eval 'eval-*.tfrecord' --model-dir m1 \
  --classes 2 --batch 16 --hidden 8 --learning-rate 0.05 --threads 1 \
  --steps 300 --eval-every 1000 --json | tail -1)
echo "$out"
[[ $(json_field ranks "$out") == 2 ]] || fail "ranks: $out"
[[ $(json_field global_step "$out") == 300 ]] || fail "global_step: $out"
awk -v a="$(json_field accuracy "$out")" 'BEGIN { exit !(a > 0.9) }' ||
  fail "accuracy: $out"
[[ -f m1/model.ckpt-300 ]] || fail "the chief wrote no checkpoint"

echo "== 2. SIGKILL one rank: the job ends, non-zero, in bounded time"
"$mpirun" -np 2 "$recflow" train --model dnn --spec spec.json \
  --train 'train-*.tfrecord' --eval 'eval-*.tfrecord' --model-dir m2 \
  --classes 2 --batch 16 --hidden 8 --learning-rate 0.05 --threads 1 \
  --steps 100000000 --eval-every 100000000 --save-checkpoints-steps 200 \
  >m2.log 2>&1 &
job=$!
for _ in $(seq 600); do
  ls m2/model.ckpt-* >/dev/null 2>&1 && break
  sleep 0.1
done
ls m2/model.ckpt-* >/dev/null 2>&1 || { cat m2.log; fail "no checkpoint in 60 s"; }
victim=""
for p in $(pgrep -f "model-dir m2" || true); do
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null |
    grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$p; fi
done
[[ -n $victim ]] || fail "rank 1 not found"
kill -9 "$victim"
killed_at=$SECONDS
rc=0
for _ in $(seq 600); do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$job" 2>/dev/null && fail "the job still runs 60 s after rank 1 died"
wait "$job" || rc=$?
echo "mpirun exited with $rc, $((SECONDS - killed_at)) s after the kill"
((rc != 0)) || fail "the job exited 0 after a rank was killed"

echo "== 3. the same job again resumes from the chief's last checkpoint"
last=$(sed -n 's/^model_checkpoint_path: "model.ckpt-\([0-9]*\)"/\1/p' m2/checkpoint)
[[ -n $last ]] || fail "no checkpoint state"
out=$("$mpirun" -np 2 "$recflow" train --model dnn --spec spec.json \
  --train 'train-*.tfrecord' --eval 'eval-*.tfrecord' --model-dir m2 \
  --classes 2 --batch 16 --hidden 8 --learning-rate 0.05 --threads 1 \
  --steps $((last + 40)) --eval-every 100000000 --json | tail -1)
echo "$out"
[[ $(json_field start_step "$out") == "$last" ]] || fail "did not resume at $last"
[[ $(json_field global_step "$out") == $((last + 40)) ]] || fail "steps: $out"

echo "== 4. one process continues the two ranks' checkpoint"
log=$(train m2 $((last + 60)) --global-shuffle 2>&1)
grep -q "Input iterator restored" <<<"$log" || { echo "$log"; fail "input not restored"; }
grep -q "resumed from step $((last + 40))" <<<"$log" || { echo "$log"; fail "not resumed"; }
echo "PASS"
