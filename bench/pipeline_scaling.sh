#!/usr/bin/env bash
# The pipeline-scaling figures of docs/PERFORMANCE.md: Fashion-MNIST as 16
# TFRecord shards (~850-byte Examples; also as one indexed file) and the
# MNIST-like fixture (3.2 KB),
# parse-only and shuffled (10,000) (Fashion-MNIST also through the global
# shuffle), fused and stage by stage, at each
# thread count, RUNS times alternating; prints the median records/s of
# each, the ratios the targets name, and whether every run of a pipeline
# gave the same order digest (where each record came from), and whether
# the delivered values hash the same fused and stage by stage.  Each round
# also runs as many independent one-thread copies of the fused parse-only
# and shuffled pipelines at once as the largest count (the "ceiling": what
# the machine gives to work that shares nothing).
#
#   bash bench/pipeline_scaling.sh [BUILD_DIR] [RUNS] [THREADS] [READS]
#   e.g. bash bench/pipeline_scaling.sh build 5 1,2
#        bash bench/pipeline_scaling.sh build 3 1,2,4,8,16 16   (16 cores)
# READS (default 1) is --parallel-reads for the 16 Fashion-MNIST shards:
# how many files are read at once, each by its own reader task.  With 1,
# one file is read at a time, and its reading alone (one thread, ~5 M
# records/s) bounds every thread count; on many cores use 16.  The order
# depends on READS (an interleave's cycle length), not on THREADS.
# Environment: WARMUP=N leaves each timed run's first N batches out of its
# figures (recflow bench --warmup; default 0, as every figure before
# 2026-11-26's seventh session); REPEAT_SCALE=K runs K times the epochs
# (default 1): at 16 threads a run of the default epochs lasts 80-150 ms,
# of which start-up is a visible share.
# Each round also runs bench/cross_core_probe (where the build has it):
# what writing memory another core wrote last costs, which on a VM moves
# with where the host puts its virtual CPUs, and the shared pipelines'
# speed-ups with it; the summary prints it per round beside the round's
# shuffled speed-ups.
set -euo pipefail
build=${1:-build}
runs=${2:-5}
threads=${3:-1,2}
reads=${4:-1}
recflow=$(realpath "$build/tools/recflow")
here=$(cd "$(dirname "$0")/.." && pwd)
data=/usr/share/datasets/fashion-mnist
work=${TMPDIR:-/tmp}/recflow-bench/scaling
mkdir -p "$work"
if [[ ! -f $work/fm/train-00015-of-00016.tfrecord ]]; then
  rm -rf "$work/fm"
  mkdir -p "$work/fm"
  "$recflow" convert idx --images "$data/train-images-idx3-ubyte.gz" \
    --labels "$data/train-labels-idx1-ubyte.gz" --output "$work/fm/train" \
    --shards 16 > /dev/null
fi
"$recflow" inspect --spec "$work/fm/train-00000-of-00016.tfrecord" > "$work/fm.json"
# The same records as one 52 MB file with its index: one file read by
# ranges on several threads (fewer files at once than threads).
if [[ ! -f $work/fm1/train-00000-of-00001.tfrecord.idx ]]; then
  rm -rf "$work/fm1"
  mkdir -p "$work/fm1"
  "$recflow" convert idx --images "$data/train-images-idx3-ubyte.gz" \
    --labels "$data/train-labels-idx1-ubyte.gz" --output "$work/fm1/train" \
    --shards 1 > /dev/null
  "$recflow" index "$work/fm1/train-00000-of-00001.tfrecord" > /dev/null
fi
# The global shuffle reads through the files' indexes.
for f in "$work"/fm/train-*.tfrecord; do
  [[ -f $f.idx ]] || "$recflow" index "$f" > /dev/null
done
mnist=$here/../shared/fixtures/tf/tfx_mnist_1000_example.tfrecord
cat > "$work/mnist.json" <<'EOF'
{"features": {"image_class": {"kind": "fixed", "dtype": "int64", "shape": []},
              "image_floats": {"kind": "fixed", "dtype": "float32", "shape": [784]}}}
EOF

out=$work/runs.jsonl
: > "$out"
bench() {  # files spec extra...: the pipeline's JSON lines in run.jsonl
  local files=$1 spec=$2
  shift 2
  # The output goes to a file and is read after the run: a reader on the
  # other end of a pipe starts while the run does and, where python3 is
  # slow to start (a pyenv shim: ~0.3 s of CPU), takes a core from runs
  # that last under a second.  It once cut figures here by up to 30%.
  # shellcheck disable=SC2086
  "$recflow" bench $files --spec "$spec" --batch 256 --map-threads -1 \
    --seed 1 --threads "$threads" --json "$@" >"$work/run.jsonl"
}
warmup=${WARMUP:-0}
scale=${REPEAT_SCALE:-1}
run() {  # name files spec repeat extra...
  local name=$1 files=$2 spec=$3 repeat=$4
  shift 4
  bench "$files" "$spec" --repeat $((repeat * scale)) --warmup "$warmup" "$@"
  python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    # The stages that plan (the fused path: "batch", and "shuffle" for the
    # own draws of the shuffle): their busy ns a record.
    plan = {s["name"]: s["busy_seconds"] * 1e9 / d["records"]
            for s in d["stages"] if s["name"] in ("batch", "shuffle")}
    print(json.dumps({"name": sys.argv[1], "threads": d["threads"],
                      "rps": d["records_per_s"], "digest": d["order_digest"],
                      "rss": d["peak_rss_bytes"], "round": int(sys.argv[2]),
                      "read_rps": d.get("protobuf_read_records_per_s"),
                      "plan_ns": plan}))
' "$name" "$i" <"$work/run.jsonl" >>"$out"
}
# What the machine gives to work that shares nothing: as many independent
# one-thread runs of a pipeline as the largest thread count, at once, in
# processes of their own; the sum of their records/s.  Over the one-thread
# rate it bounds the speed-up that threads sharing one pipeline can reach
# (memory bandwidth, caches and the host's share of the cores are then the
# limit, not the pipeline).  A VM's cores may share more than they show.
copies=${threads##*,}
ceiling() {  # name files spec repeat extra...
  local name=$1 files=$2 spec=$3 repeat=$4 c
  shift 4
  for ((c = 0; c < copies; c++)); do
    # shellcheck disable=SC2086
    "$recflow" bench $files --spec "$spec" --batch 256 --map-threads -1 \
      --seed 1 --threads 1 --json --repeat $((repeat * scale)) \
      --warmup "$warmup" "$@" \
      >"$work/copy$c.jsonl" &
  done
  wait
  python3 -c '
import json, sys
runs = [json.loads(open(f).readline()) for f in sys.argv[3:]]
print(json.dumps({"name": sys.argv[1], "copies": int(sys.argv[2]),
                  "rps": sum(d["records_per_s"] for d in runs),
                  "digests": sorted({d["order_digest"] for d in runs})}))
' "$name" "$copies" "$work"/copy[0-9]*.jsonl >>"$ceilings"
  rm -f "$work"/copy[0-9]*.jsonl
}
ceilings=$work/ceilings.jsonl
: > "$ceilings"
probe=$(dirname "$recflow")/../bench/cross_core_probe
probes=$work/probes.jsonl
: > "$probes"
fm="$work/fm/train-*.tfrecord"
for ((i = 0; i < runs; i++)); do
  if [[ -x $probe ]]; then
    printf '{"round": %d, "probe": %s}\n' "$i" "$("$probe")" >>"$probes"
  fi
  if ((copies > 1)); then
    ceiling "fashion parse-only" "$fm" "$work/fm.json" 10 \
      --parallel-reads "$reads"
    ceiling "fashion shuffled" "$fm" "$work/fm.json" 10 --shuffle 10000 \
      --parallel-reads "$reads"
    if [[ -f $mnist ]]; then
      ceiling "mnist parse-only" "$mnist" "$work/mnist.json" 300
      ceiling "mnist shuffled" "$mnist" "$work/mnist.json" 300 --shuffle 10000
    fi
  fi
  for fusion in "" --no-fusion; do
    tag=${fusion:+ unfused}
    run "fashion parse-only$tag" "$fm" "$work/fm.json" 10 $fusion \
      --parallel-reads "$reads" --compare-protobuf
    run "fashion shuffled$tag" "$fm" "$work/fm.json" 10 --shuffle 10000 \
      --parallel-reads "$reads" $fusion
    run "fashion global$tag" "$fm" "$work/fm.json" 10 --global-shuffle $fusion
    if [[ -z $fusion ]]; then
      # The fused stage plans (shuffle, repeat, batch order) on the thread
      # that takes its batches, which here also hashes them: that thread's
      # share of a record's work bounds the speed-up.  Behind a Prefetch
      # the plan runs on Prefetch's thread, apart from the consumer.
      run "fashion shuffled prefetched" "$fm" "$work/fm.json" 10 \
        --shuffle 10000 --parallel-reads "$reads" --prefetch 2
      # Each of the 16 files shuffled by its reader (16 buffers of 625:
      # 10,000 records buffered in all, as the shuffle above), all 16 read
      # at once whatever READS says: the shuffle runs on the reader tasks
      # instead of the planner (TFRecordOptions::shuffle_buffer_per_file).
      run "fashion shuffled per file" "$fm" "$work/fm.json" 10 \
        --shuffle-per-file 625 --parallel-reads 16
      run "fashion one file parse-only" "$work/fm1/train-00000-of-00001.tfrecord" \
        "$work/fm.json" 10
      run "fashion one file shuffled" "$work/fm1/train-00000-of-00001.tfrecord" \
        "$work/fm.json" 10 --shuffle 10000
    fi
    if [[ -f $mnist ]]; then
      run "mnist parse-only$tag" "$mnist" "$work/mnist.json" 300 $fusion --compare-protobuf
      run "mnist shuffled$tag" "$mnist" "$work/mnist.json" 300 --shuffle 10000 $fusion
    fi
  done
done

# The timed runs hash where each record came from (--digest order); the
# delivered values are hashed here, untimed, fused and stage by stage at
# each count: the fused path must deliver what the stages one by one do.
values=$work/values.jsonl
: > "$values"
check() {  # name files spec extra...
  local name=$1 files=$2 spec=$3
  shift 3
  for fusion in "" --no-fusion; do
    # shellcheck disable=SC2086
    bench "$files" "$spec" --repeat 2 --digest data $fusion "$@"
    python3 -c '
import json, sys
for line in sys.stdin:
    print(json.dumps({"name": sys.argv[1],
                      "digest": json.loads(line)["order_digest"]}))
' "$name" <"$work/run.jsonl" >>"$values"
  done
}
check "fashion parse-only" "$fm" "$work/fm.json" --parallel-reads "$reads"
check "fashion shuffled" "$fm" "$work/fm.json" --shuffle 10000 \
  --parallel-reads "$reads"
check "fashion global" "$fm" "$work/fm.json" --global-shuffle
check "fashion shuffled per file" "$fm" "$work/fm.json" --shuffle-per-file 625 \
  --parallel-reads 16
if [[ -f $mnist ]]; then
  check "mnist parse-only" "$mnist" "$work/mnist.json"
  check "mnist shuffled" "$mnist" "$work/mnist.json" --shuffle 10000
fi

# The CPU the figures are from (recflow bench's "cpu"): the VMs these
# figures come from have been AMD EPYC and Intel Xeon, which differ.
echo "cpu: $(tail -n 1 "$work/run.jsonl" | python3 -c 'import json, sys; print(json.loads(sys.stdin.read()).get("cpu", "unknown"))')"
python3 - "$out" "$values" "$ceilings" "$probes" <<'EOF'
import json, statistics, sys
from collections import defaultdict
rps, digests, rss, read = defaultdict(list), defaultdict(set), defaultdict(int), defaultdict(list)
by_round = defaultdict(dict)  # round -> (name, threads) -> records/s
plan_ns = defaultdict(lambda: defaultdict(list))  # (name, threads) -> stage -> ns
for line in open(sys.argv[1]):
    d = json.loads(line)
    key = (d["name"], d["threads"])
    rps[key].append(d["rps"])
    for stage, ns in d.get("plan_ns", {}).items():
        plan_ns[key][stage].append(ns)
    by_round[d["round"]][key] = d["rps"]
    digests[d["name"].replace(" unfused", "").replace(" prefetched", "")].add(
        d["digest"])
    rss[key] = max(rss[key], d["rss"])
    if d["read_rps"]:
        read[d["name"].split()[0]].append(d["read_rps"])
med = {k: statistics.median(v) for k, v in rps.items()}
counts = sorted({t for _, t in med})
print(f"{'pipeline':<28}" + "".join(f"{f'T={t}':>14}" for t in counts) +
      f"{'T=max/T=1':>11}{'peak RSS':>10}")
for name in sorted({n for n, _ in med}):
    row = [med.get((name, t)) for t in counts]
    scale = row[-1] / row[0] if row[0] else 0
    mib = max(rss[(name, t)] for t in counts) / 2**20
    print(f"{name:<28}" + "".join(f"{v:>14,.0f}" for v in row) +
          f"{scale:>10.2f}x{mib:>7.0f} MiB")
print()
for data in sorted(read):
    r = statistics.median(read[data])
    p = med[(f"{data} parse-only", counts[0])]
    print(f"{data}: reading alone (one thread, CRCs checked) {r:,.0f} records/s;"
          f" fused parse-only at T={counts[0]} is {p / r:.2f}x of it")
    for t in counts:
        s, po = med[(f"{data} shuffled", t)], med[(f"{data} parse-only", t)]
        su, pu = med[(f"{data} shuffled unfused", t)], med[(f"{data} parse-only unfused", t)]
        print(f"  T={t}: shuffled/parse-only {s / po:.2f} (unfused {su / pu:.2f});"
              f" fused/unfused: parse-only {po / pu:.2f}x, shuffled {s / su:.2f}x")
        if (f"{data} shuffled prefetched", t) in med:
            sp = med[(f"{data} shuffled prefetched", t)]
            print(f"        shuffled behind --prefetch 2 / without: {sp / s:.2f}x")
        if (f"{data} shuffled per file", t) in med:
            sf = med[(f"{data} shuffled per file", t)]
            print(f"        shuffled per file: {sf / po:.2f} of parse-only,"
                  f" {sf / s:.2f}x the one buffer's records/s")
# The one thread that plans bounds every count (~15-20 M records/s at ~50
# ns a record): its busy ns a record, the shuffle's own draws apart.
planned = [n for n in ("fashion parse-only", "fashion shuffled",
                       "fashion shuffled per file", "mnist parse-only",
                       "mnist shuffled") if (n, counts[0]) in plan_ns]
if planned:
    print("\nthe planner's busy ns a record (medians; fused: \"batch\" plans, "
          "\"shuffle\" is the one buffer's draws and copies):")
    for name in planned:
        cells = []
        for t in counts:
            stages = plan_ns.get((name, t), {})
            cells.append(f"T={t} " + " + ".join(
                f"{stage} {statistics.median(stages[stage]):.0f}"
                for stage in ("batch", "shuffle") if stage in stages))
        print(f"  {name:<26} " + "; ".join(cells))
ceil = defaultdict(list)
for line in open(sys.argv[3]):
    d = json.loads(line)
    ceil[d["name"]].append(d["rps"])
    copies = d["copies"]
    digests[d["name"]].update(d["digests"])
if ceil:
    print(f"\nceiling: {copies} independent one-thread runs at once, the sum of"
          f" their records/s over T={counts[0]}'s (median of {len(next(iter(ceil.values())))}),"
          f" against T={counts[-1]}'s speed-up:")
    for name in sorted(ceil):
        c = statistics.median(ceil[name])
        one, top = med[(name, counts[0])], med[(name, counts[-1])]
        print(f"  {name:<26} {c:>14,.0f} records/s: {c / one:.2f}x;"
              f" T={counts[-1]} {top / one:.2f}x, {top / c:.2f} of the ceiling")
probes = [json.loads(line) for line in open(sys.argv[4])]
if probes:
    print(f"\nper round: writing a 64-byte line another core wrote last"
          f" (bench/cross_core_probe; on one core in brackets), and the"
          f" shuffled pipelines' T={counts[-1]}/T={counts[0]}:")
    for p in probes:
        r, got = p["round"], p["probe"]
        cross = got.get("cross_core_ns")
        line = (f"  round {r}: {cross:.2f} ns" if cross is not None else
                f"  round {r}: one CPU") + f" ({got['same_core_ns']:.2f} ns)"
        for name in ("fashion shuffled", "mnist shuffled"):
            one = by_round[r].get((name, counts[0]))
            top = by_round[r].get((name, counts[-1]))
            if one and top:
                line += f"; {name} {top / one:.2f}x"
        print(line)
print()
for name, ds in sorted(digests.items()):
    print(f"{name}: {'one order digest' if len(ds) == 1 else 'DIFFERENT digests'}"
          f" over every run, count and mode ({', '.join(sorted(ds))})")
values = defaultdict(set)
for line in open(sys.argv[2]):
    d = json.loads(line)
    values[d["name"]].add(d["digest"])
for name, ds in sorted(values.items()):
    print(f"{name}: {'the same values' if len(ds) == 1 else 'DIFFERENT values'}"
          f" fused and stage by stage at every count ({', '.join(sorted(ds))})")
EOF
