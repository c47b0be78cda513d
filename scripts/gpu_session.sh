#!/usr/bin/env bash
# What a session on a lent GPU machine runs (see ../shared/gpu/README.md and
# docs/PERFORMANCE.md): build with the CUDA backend, run the `gpu` tests
# (NCCL's on one GPU among them), train_bench on the GPU next to a PyTorch
# eager loop (CudaStepNccl against CudaStep: what NCCL's all-reduce adds
# to a step), the demo on the GPU, and the default suite in that build;
# on its 16 cores, the pipeline's scaling (issue 15) and CPU training next
# to PyTorch CPU (issue 17).
#   carry: .gpu (pack-deps.sh with the README's RECFLOW_EXTRA_DEBS: libzip,
#   OpenBLAS) and .data (Fashion-MNIST's four .gz files, and the MNIST
#   fixture ../shared/fixtures/tf/tfx_mnist_1000_example.tfrecord, which
#   the call copies back to ../shared/fixtures/tf/ before it runs: shared/
#   does not travel)
#   bash scripts/gpu_session.sh [build|test|bench|paired|demo|suite|pipeline|planner|cpu|crc|pop|onethread ...]
# A session has 15 device-minutes in all, machine starts (30-60 s) and
# idle time included, and a call may run 600 s.  What 2026-11-26's
# session ran in one call of 400 s on a machine that had built once:
#   SESSION_SECONDS=575 BENCH_SETS='dnn|cnn' PIPELINE_RUNS=2 \
#     bash scripts/gpu_session.sh build test bench demo cpu pipeline
# (a fresh build takes ~65 s; test ~10, bench ~80, demo ~55, cpu ~55,
# pipeline ~130).  Give the machine back (device `give_back`) as soon as
# a call returns unless another follows at once: it idles on the budget.
# Each part runs under what is left of SESSION_SECONDS (default 570 s
# from the script's start) and is cut, saying so, rather than the whole
# call.
# A call brings back at most 8 files: every log goes into
# $OUT/logs.tar.gz (rewritten after each part, so a cut call still brings
# back what finished) and what is printed also into $OUT/summary.txt.
#   TF32_MODES="1 0": train_bench with TF32 allowed (default) and without.
#   BENCH_SETS='dnn|cnn': train_bench's model sets (default also linear).
#   PIPELINE_RUNS=2: rounds of the pipeline's scaling runs (default 3).
#   PLANNER_REPS=5: repetitions of `planner` (pipeline_bench's
#     FusedPlanner: the fused planner on the consumer's thread against in
#     a task of its own, over one Shuffle(10,000) (shuffle:1), 16 buffers
#     of 625 drawn by the readers (shuffle:2) and none (shuffle:0),
#     interleaved at random; default 5, ~90 s).
#   PAIRED_ROUNDS=2: the paired benchmarks twice (default once).
#   BENCH_VARIANTS='staged|graphs': train_bench's plain benchmarks and
#     those variants only; CUDA_API_BENCH=0: no cuda_api_bench.
set -uo pipefail
out=${OUT:-gpu-out}
logs=${GPU_LOGS:-gpu-logs}
mkdir -p "$out" "$logs"
started=$SECONDS
budget=${SESSION_SECONDS:-570}
left() { echo $((budget - (SECONDS - started))); }
# Runs "$@" under what is left (less 10 s to pack the logs), or says that
# no time is left.
# PART_LIMIT=S before it caps the command at S seconds too (a hung
# collective or benchmark then costs that, not the session).
limited() {
  local s
  s=$(($(left) - 10))
  if [[ -n ${PART_LIMIT:-} ]] && ((PART_LIMIT < s)); then s=$PART_LIMIT; fi
  if ((s < 5)); then
    echo "skipped (session budget spent): $*" >&3
    return 124
  fi
  timeout --signal=TERM --kill-after=5 "$s" "$@"
  local rc=$?
  ((rc == 124)) && echo "cut at its time limit (${s} s): $*" >&3
  return "$rc"
}
pack() { tar czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null; }
parts=("${@:-build test bench demo cpu pipeline}")
read -r -a parts <<<"${parts[*]}"
if [ -d .data ] && [ ! -e /usr/share/datasets/fashion-mnist ]; then
  mkdir -p /usr/share/datasets/fashion-mnist
  cp .data/*.gz /usr/share/datasets/fashion-mnist/
fi
main() {
  exec 3>&1  # the summary, for what limited says from inside a redirection
  for part in "${parts[@]}"; do
    echo "== $part ($(left) s of the session budget left)"
    case "$part" in
      build)
        nvidia-smi --query-gpu=name,driver_version --format=csv 2>&1 | tee "$logs/gpu.txt"
        # The CPU's model, cores and threads per core: the 16-core figures
        # are read against them (a per-core rate a fifth of the 2-vCPU VM's
        # was seen there on 2026-11-26).
        lscpu >"$logs/lscpu.txt" 2>&1
        grep -E "^(Model name|Thread\(s\) per core|Core\(s\) per socket|Flags)" "$logs/lscpu.txt" | cut -c1-200
        if ! limited bash .gpu/build.sh . build-gpu -DRECFLOW_CUDA=ON >"$logs/build.log" 2>&1; then
          # What failed, then every other target (a test that one compiler
          # refuses need not cost the session its measurements).
          grep -E "^FAILED|error:" "$logs/build.log" | head -10
          (source .gpu/build.sh --env-only && limited ninja -C build-gpu -k 0) >>"$logs/build.log" 2>&1
          [ -x build-gpu/tools/recflow ] && [ -x build-gpu/bench/train_bench ] ||
            { tail -40 "$logs/build.log"; pack; exit 1; }
        fi
        # What a clock read and a wake-up cost on this machine (the
        # training thread's take from a Prefetch may pay either).
        build-gpu/bench/clock_probe | tee "$logs/clock_probe.json"
        ;;
      test)
        source .gpu/build.sh --env-only
        limited ctest --test-dir build-gpu -L gpu -j 4 --output-on-failure >"$logs/gpu-tests.log" 2>&1
        echo "gpu tests rc=$?"; grep -E "tests passed|FAILED|Failed|Skipped" "$logs/gpu-tests.log" | head -20
        ;;
      suite)
        # The default suite in the CUDA build (it needs no GPU: last).
        source .gpu/build.sh --env-only
        limited ctest --test-dir build-gpu -LE 'slow|gpu' -j 16 >"$logs/suite.log" 2>&1
        echo "suite rc=$?"; grep -E "tests passed|\(Failed\)" "$logs/suite.log" | head -20
        ;;
      bench)
        source .gpu/build.sh --env-only
        # What the targets compare first, so that a part cut at its time
        # limit still brings them back: PyTorch's baseline, then the DNN and
        # CNN benchmarks, then linear.
        limited python3 bench/pytorch_baseline.py 2000 >"$logs/pytorch.jsonl" 2>&1
        cat "$logs/pytorch.jsonl"
        # What the input path's CUDA calls cost the launching thread
        # (CUDA_API_BENCH=0: not this time).
        if [[ ${CUDA_API_BENCH:-1} != 0 ]]; then
          limited build-gpu/bench/cuda_api_bench --benchmark_repetitions=3 \
            --benchmark_report_aggregates_only=true >"$logs/cuda_api.txt" 2>&1
          grep -E "median" "$logs/cuda_api.txt"
        fi
        for tf32 in ${TF32_MODES:-1}; do
          for models in ${BENCH_SETS:-"dnn|cnn" linear}; do
            log="$logs/train_bench_tf32_${tf32}_${models/|/_}.txt"
            # BENCH_VARIANTS='staged|pipeline': of each model's benchmarks
            # only the plain ones and those variants (default: all).
            filter="^Cuda[A-Za-z]*/($models)(/|$)"
            [[ -n ${BENCH_VARIANTS:-} ]] &&
              filter="^Cuda[A-Za-z]*/($models)(/(${BENCH_VARIANTS}))?/manual_time"
            RECFLOW_CUDA_TF32=$tf32 PART_LIMIT=240 limited build-gpu/bench/train_bench --device cuda \
              --benchmark_filter="$filter" \
              --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
              >"$log" 2>&1
            echo "train_bench TF32=$tf32 ($models):"; grep -E "median" "$log"
          done
        done
        ;;
      paired)
        # The input's cost to a step, paired (CudaPaired), with cuDNN's
        # heuristic convolution algorithms on both sides: with autotune each
        # backend measures its own (cudnnFind) and may choose differently
        # (the counter convs_differ), which moved the CNN's ratios
        # 0.83-1.29 whatever the input did.
        source .gpu/build.sh --env-only
        # PAIRED_ROUNDS=N: the benchmarks N times (the ratios move from
        # run to run more than within one), each in a log of its own.
        for ((round = 1; round <= ${PAIRED_ROUNDS:-1}; round++)); do
          log="$logs/train_bench_paired_heuristic_$round.txt"
          RECFLOW_CUDNN_AUTOTUNE=0 PART_LIMIT=120 limited build-gpu/bench/train_bench --device cuda \
            --benchmark_filter='^CudaPaired/(cnn|dnn)/(staged|graphs_staged|graphs_rotate)/manual_time' \
            --benchmark_repetitions=3 --benchmark_report_aggregates_only=true >"$log" 2>&1
          echo "train_bench paired, RECFLOW_CUDNN_AUTOTUNE=0, round $round:"
          # The ratio, both steps, and each side's launching thread a step
          # (input: Next and Prefetch; build: the model_fn's calls
          # captured; end: EndStep).
          python3 - "$log" <<'EOF2'
import re, sys
for line in open(sys.argv[1]):
    if "median" not in line:
        continue
    # Google Benchmark's suffixes (1.7m is 0.0017) read as numbers.
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3, "u": 1e-6, "n": 1e-9}
    d = {k: "%.6g" % (float(v) * scale[s])
         for k, v, s in re.findall(r"(\w+)=([\d.]+)([kMGmun]?)", line)}
    print(line.split()[0], " ".join("%s=%s" % (k, d.get(k)) for k in (
        "variant_over_plain", "plain_step_ms", "variant_step_ms", "convs_differ",
        "variant_input_us", "variant_wakes_per_step", "plain_build_us",
        "variant_build_us", "plain_end_us", "variant_end_us")))
EOF2
        done
        ;;
      pipeline)
        source .gpu/build.sh --env-only
        # 16 files read at once (the figures of 2026-11-22 read one at a
        # time, which bounds every thread count by one reader).
        limited bash bench/pipeline_scaling.sh build-gpu "${PIPELINE_RUNS:-3}" 1,2,4,8,16 16 \
          >"$logs/pipeline_scaling.txt" 2>&1
        echo "pipeline_scaling rc=$?"; tail -72 "$logs/pipeline_scaling.txt"
        # Each run's figures, also when the part was cut before its table.
        cp "${TMPDIR:-/tmp}"/recflow-bench/scaling/*.jsonl "$logs/" 2>/dev/null
        # Where the shuffled pipeline stops scaling (2026-11-26: 4.6-4.8 M
        # records/s from 2 threads to 16): each stage's busy share at each
        # count, and 15 threads next to 16 (16 workers and the consumer's
        # thread are one more than the cores).
        scaling=${TMPDIR:-/tmp}/recflow-bench/scaling
        for format in "" --json; do
          limited build-gpu/tools/recflow bench "$scaling/fm/train-*.tfrecord" \
            --spec "$scaling/fm.json" --batch 256 --map-threads -1 --seed 1 \
            --threads 1,2,4,8,15,16 --repeat 10 --shuffle 10000 \
            --parallel-reads 16 $format >"$logs/shuffled_stages${format:+.jsonl}.txt" 2>&1
        done
        tail -8 "$logs/shuffled_stages.txt"
        # The same sweeps in steady state: 4x the epochs and the first 200
        # batches untimed (recflow bench --warmup: 51,200 records, past the
        # shuffle's growth to ~3 buffers of blocks, each 2 MiB slab zeroed
        # as it is first touched), shuffled and parse-only, so that 16
        # threads are measured over ~0.3 s instead of ~0.1 s of which
        # start-up was a share.
        # per_file: each file shuffled by its reader tasks (16 buffers of
        # 625, TFRecordOptions::shuffle_buffer_per_file), the planner
        # moving refs as in parse-only.
        for kind in shuffled per_file parse_only; do
          spec=; [[ $kind == shuffled ]] && spec="--shuffle 10000"
          [[ $kind == per_file ]] && spec="--shuffle-per-file 625"
          name=steady_$kind
          limited build-gpu/tools/recflow bench "$scaling/fm/train-*.tfrecord" \
            --spec "$scaling/fm.json" --batch 256 --map-threads -1 --seed 1 \
            --threads 1,2,4,8,16 --repeat 40 --warmup 200 $spec \
            --parallel-reads 16 --json >"$logs/$name.jsonl" 2>&1
          # Per count: records/s, speed-up, each stage's busy (and wait)
          # share, the consumer's time in Next() (the planner's thread), and
          # the planner's ns a record.
          python3 - "$logs/$name.jsonl" "$name" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    stages = " ".join("%s %.0f/%.0f%%" % (s["name"], 100 * s["busy_fraction"],
                                         100 * s["wait_fraction"])
                      for s in d["stages"])
    # The planner (the fused stage's "batch", and since 51d592b the
    # shuffle's own share of it, "shuffle"): its ns a record, both.
    planner = sum(s["busy_seconds"] for s in d["stages"]
                  if s["name"] in ("batch", "shuffle"))
    shuffle = sum(s["busy_seconds"] for s in d["stages"] if s["name"] == "shuffle")
    # cores: the process's CPU time over the run's; the consumer's thread
    # on a core nearly all the run is a serial bound.
    print("%s T=%d: %.2f M/s (%.2fx, %.2f s) busy/wait: %s; consumer in Next %.0f%%,"
          " on a core %.0f%%; cores %.1f; planner %.0f ns a record (shuffle %.0f)"
          % (sys.argv[2], d["threads"], d["records_per_s"] / 1e6, d["speedup"],
             d["seconds"], stages, 100 * d["consumer_in_next_fraction"],
             100 * d["consumer_cpu_fraction"], d["cores_busy"],
             planner / max(d["records"], 1) * 1e9,
             shuffle / max(d["records"], 1) * 1e9))
EOF
        done
        # What a consumer busy 200 us a batch (a GPU step) waits in Next(),
        # and what the hand-off alone costs it (PrefetchPop: an input that
        # is never behind; the wake of the sleeping driver).
        limited build-gpu/bench/pipeline_bench \
          --benchmark_filter='ConsumerNext|PrefetchPop' \
          --benchmark_min_time=1 >"$logs/consumer_next.txt" 2>&1
        grep -E "ConsumerNext|PrefetchPop" "$logs/consumer_next.txt"
        ;;
      cpu)
        source .gpu/build.sh --env-only
        limited build-gpu/bench/train_bench --benchmark_filter='^(Step|StepFromFiles|Ceiling)/' \
          --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
          >"$logs/train_bench_cpu.txt" 2>&1
        grep -E "median" "$logs/train_bench_cpu.txt"
        threads=$(nproc)
        limited python3 bench/pytorch_baseline.py 300 --cpu "$threads" \
          >"$logs/pytorch_cpu.jsonl" 2>&1
        cat "$logs/pytorch_cpu.jsonl"
        ;;
      demo)
        source .gpu/build.sh --env-only
        # Each model with each step one CUDA graph (the default) and call
        # by call.
        for model in cnn dnn; do
          for graphs in "" --no-cuda-graphs; do
            name="demo_$model${graphs:+_calls}"
            limited build-gpu/tools/recflow demo --device cuda --model "$model" --json \
              $graphs >"$logs/$name.json" 2>"$logs/$name.err"
            echo "$name rc=$?"
            [ -s "$logs/$name.json" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r.get(k) for k in ('device','test_accuracy','train_seconds','examples_per_s','global_step','cuda_graph_launches')})" "$logs/$name.json" 2>&1 | tail -1
          done
        done
        ;;
      planner)
        source .gpu/build.sh --env-only
        limited build-gpu/bench/pipeline_bench --benchmark_filter=FusedPlanner \
          --benchmark_repetitions="${PLANNER_REPS:-5}" \
          --benchmark_enable_random_interleaving=true --benchmark_min_time=0.5 \
          >"$logs/fused_planner.txt" 2>&1
        echo "fused_planner rc=$?"
        grep -E "FusedPlanner.*(real_time |median)" "$logs/fused_planner.txt"
        ;;
      pop)
        # What a take from a Prefetch costs the consumer's thread (the
        # training thread's Next), and how many takes woke the driver (a
        # system call each; clock_probe in `build` prices one): ~15 s.
        source .gpu/build.sh --env-only
        limited build-gpu/bench/pipeline_bench \
          --benchmark_filter='PrefetchPop|ConsumerNext/threads:16' \
          --benchmark_min_time=0.3 >"$logs/prefetch_pop.txt" 2>&1
        echo "prefetch_pop rc=$?"
        grep -E "PrefetchPop|ConsumerNext" "$logs/prefetch_pop.txt"
        ;;
      crc)
        # The CRCs folded with VPCLMULQDQ against the crc32 instruction on
        # this machine's CPU, and verified reads next to read() (~16 s on
        # the 2-vCPU VM).
        limited build-gpu/bench/records_bench \
          --benchmark_filter='^crc32c/(fold|three|one|32_messages_[vi])|^read/(plain|records_verified)' \
          --benchmark_repetitions=3 --benchmark_min_time=0.1 \
          --benchmark_report_aggregates_only=true >"$logs/crc32c.txt" 2>&1
        echo "crc32c rc=$?"
        grep -E "median" "$logs/crc32c.txt"
        ;;
      onethread)
        # Issue 15's "one thread, parse-only >= 0.5x reading alone", met on
        # the AMD VM (0.63-0.69) and not on these machines (0.31-0.43):
        # where one thread's batch goes there.  The parser alone on
        # Fashion-MNIST's Examples (3: as protobuf serializes them, 4: as
        # recflow convert writes them, framed; and protobuf's), then the pipeline at
        # one thread, io_uring and pread, each stage's ns a record, next to
        # reading alone (--compare-protobuf).  Needs the files the pipeline
        # part writes.  ~30 s.  First the machine's context: its CPU, kernel
        # and transparent huge pages (the read blocks' slabs ask for them).
        source .gpu/build.sh --env-only
        echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-);" \
          "kernel $(uname -r); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
        limited build-gpu/bench/records_bench \
          --benchmark_filter='^parse/(protobuf_baseline|fast_1_thread)/[34]/' \
          --benchmark_repetitions=3 --benchmark_min_time=0.2 \
          --benchmark_report_aggregates_only=true >"$logs/parse_alone.txt" 2>&1
        grep -E "median" "$logs/parse_alone.txt"
        scaling=${TMPDIR:-/tmp}/recflow-bench/scaling
        for io in auto pread; do
          limited build-gpu/tools/recflow bench "$scaling/fm/train-*.tfrecord" \
            --spec "$scaling/fm.json" --batch 256 --map-threads -1 --seed 1 \
            --threads 1 --repeat 40 --warmup 200 --parallel-reads 16 \
            --io "$io" --compare-protobuf --json >"$logs/onethread_$io.jsonl" 2>&1
          python3 - "$logs/onethread_$io.jsonl" "$io" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    n = max(d["records"], 1)
    stages = " ".join("%s %.0f ns" % (s["name"], s["busy_seconds"] / n * 1e9)
                      for s in d["stages"])
    read = d.get("protobuf_read_records_per_s") or 0
    print("onethread io=%s: %.2f M/s, %.0f ns a record (%s); reading alone"
          " %.2f M/s, parse-only / reading alone %.2f"
          % (sys.argv[2], d["records_per_s"] / 1e6, 1e9 / d["records_per_s"],
             stages, read / 1e6, d["records_per_s"] / read if read else 0))
EOF
        done
        ;;
      *)
        echo "unknown part: $part (build, test, bench, paired, demo, suite, pipeline, planner, cpu, crc, pop, onethread)"
        ;;
    esac
    pack
  done
  echo "== done, $(left) s of the session budget left; logs in $out/logs.tar.gz"
}
# Through tee to the summary, which the pipeline waits for before the
# script ends (the call's files are collected as it returns).
main 2>&1 | tee -a "$out/summary.txt"
