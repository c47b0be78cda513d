#!/usr/bin/env bash
# What a session on a lent GPU machine runs (see ../shared/gpu/README.md and
# docs/PERFORMANCE.md): build with the CUDA backend, run the `gpu` tests and
# the default suite (the gpu tests include NCCL's on one GPU), train_bench
# on the GPU next to a PyTorch eager loop (CudaStepNccl against CudaStep:
# what NCCL's all-reduce adds to a step),
# and the demo on the GPU; on its 16 cores, the pipeline's scaling (issue
# 15) and CPU training next to PyTorch CPU (issue 17).  Logs go to $OUT (or
# ./gpu-out).
#   carry: .gpu (pack-deps.sh with the README's RECFLOW_EXTRA_DEBS: libzip,
#   OpenBLAS) and .data (Fashion-MNIST's four .gz files)
#   bash scripts/gpu_session.sh [build|test|bench|demo|pipeline|cpu ...]
#   A device call may run 600 s: run `build test`, `bench` and `demo` as
#   three calls on the warm machine (build-gpu stays between them).
#   TF32_MODES="1 0": train_bench with TF32 allowed (default) and without.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
parts=("${@:-build test bench demo}")
read -r -a parts <<<"${parts[*]}"
if [ -d .data ] && [ ! -e /usr/share/datasets/fashion-mnist ]; then
  mkdir -p /usr/share/datasets/fashion-mnist
  cp .data/*.gz /usr/share/datasets/fashion-mnist/
fi
for part in "${parts[@]}"; do
  case "$part" in
    build)
      nvidia-smi --query-gpu=name,driver_version --format=csv >"$out/gpu.txt" 2>&1
      bash .gpu/build.sh . build-gpu -DRECFLOW_CUDA=ON >"$out/build.log" 2>&1 ||
        { tail -40 "$out/build.log"; exit 1; }
      ;;
    test)
      source .gpu/build.sh --env-only
      ctest --test-dir build-gpu -L gpu --output-on-failure >"$out/gpu-tests.log" 2>&1
      echo "gpu tests rc=$?"; grep -E "tests passed|FAILED|Failed" "$out/gpu-tests.log" | head -20
      if [ -z "${GPU_TESTS_ONLY:-}" ]; then
        ctest --test-dir build-gpu -LE 'slow|gpu' -j 16 >"$out/suite.log" 2>&1
        echo "suite rc=$?"; grep -E "tests passed|\(Failed\)" "$out/suite.log" | head -20
      fi
      ;;
    bench)
      source .gpu/build.sh --env-only
      # What the targets compare first, so that a call cut at its time
      # limit still brings them back (each file is whole when written):
      # PyTorch's baseline, then the DNN and CNN benchmarks, then linear.
      python3 bench/pytorch_baseline.py 2000 >"$out/pytorch.jsonl" 2>&1
      cat "$out/pytorch.jsonl"
      for tf32 in ${TF32_MODES:-1}; do
        for models in "dnn|cnn" linear; do
          log="$out/train_bench_tf32_${tf32}_${models/|/_}.txt"
          RECFLOW_CUDA_TF32=$tf32 build-gpu/bench/train_bench --device cuda \
            --benchmark_filter="^Cuda[A-Za-z]*/($models)(/|$)" \
            --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
            >"$log" 2>&1
          echo "train_bench TF32=$tf32 ($models):"; grep -E "median" "$log"
        done
      done
      ;;
    pipeline)
      source .gpu/build.sh --env-only
      # 16 files read at once (the figures of 2026-11-22 read one at a
      # time, which bounds every thread count by one reader).
      bash bench/pipeline_scaling.sh build-gpu 3 1,2,4,8,16 16 \
        >"$out/pipeline_scaling.txt" 2>&1
      echo "pipeline_scaling rc=$?"; tail -48 "$out/pipeline_scaling.txt"
      # What a consumer busy 200 us a batch (a GPU step) waits in Next().
      build-gpu/bench/pipeline_bench --benchmark_filter=ConsumerNext \
        --benchmark_min_time=1 >"$out/consumer_next.txt" 2>&1
      grep ConsumerNext "$out/consumer_next.txt"
      ;;
    cpu)
      source .gpu/build.sh --env-only
      build-gpu/bench/train_bench --benchmark_filter='^(Step|Ceiling)/' \
        --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
        >"$out/train_bench_cpu.txt" 2>&1
      grep -E "median" "$out/train_bench_cpu.txt"
      threads=$(nproc)
      python3 bench/pytorch_baseline.py 300 --cpu "$threads" \
        >"$out/pytorch_cpu.jsonl" 2>&1
      cat "$out/pytorch_cpu.jsonl"
      ;;
    demo)
      source .gpu/build.sh --env-only
      # Each model call by call, then with each step one CUDA graph.
      for model in dnn cnn; do
        for graphs in "" --cuda-graphs; do
          name="demo_$model${graphs:+_graphs}"
          build-gpu/tools/recflow demo --device cuda --model "$model" --json \
            $graphs >"$out/$name.json" 2>"$out/$name.err"
          echo "$name rc=$?"
          python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r.get(k) for k in ('device','test_accuracy','train_seconds','examples_per_s','global_step','cuda_graph_launches')})" "$out/$name.json" 2>&1 | tail -1
        done
      done
      ;;
  esac
done
