#!/usr/bin/env bash
# The reliability checks CI runs after the test suite (docs/RELIABILITY.md):
#   1. the whole test suite (but the slow tests) built with clang under
#      AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/, the
#      Python module's tests included (its runtime preloaded);
#   2. every fuzz target (fuzz/, libFuzzer, same build) for FUZZ_SECONDS
#      each (default 60), two at a time, from the seed corpora;
#   3. the records, pipeline, convert, train and tools tests under
#      ThreadSanitizer, in build-tsan/.
# Any sanitizer report, fuzzer crash, leak, timeout or out-of-memory fails.
# Run one part with: bash scripts/sanitize.sh asan|fuzz|tsan
set -euo pipefail
cd "$(dirname "$0")/.."
parts=("${@:-asan fuzz tsan}")
read -r -a parts <<<"${parts[*]}"
fuzz_seconds=${FUZZ_SECONDS:-60}
jobs=$(nproc)

bash scripts/setup.sh --packages-only

# -g1: file and line in the reports (line tables only), for less compile
# time than full debug information.
san_flags="-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined"
# vptr: oneTBB's flow graph casts task memory to its type before
# constructing it, which the vptr check reports inside TBB.
san_flags+=" -fno-sanitize=vptr -fno-sanitize-recover=undefined"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

build_asan() {
  # RECFLOW_CUDA=OFF: the sanitizers instrument host code only, and this
  # is where CI builds and tests the configuration without the CUDA backend.
  # The Python module too: its tests run in Debian's interpreter with
  # clang's shared ASan runtime preloaded (tests/CMakeLists.txt).
  local preload
  preload="$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)"
  preload+=" $(g++ -print-file-name=libstdc++.so)"
  CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DRECFLOW_CUDA=OFF -DRECFLOW_PYTHON=ON -DRECFLOW_MPI=OFF \
    -DRECFLOW_PYTHON_TEST_PRELOAD="$preload" \
    -DRECFLOW_BUILD_BENCH=OFF -DRECFLOW_FUZZ=ON -DRECFLOW_TEST_OPTIMIZATION=-O0 \
    -DCMAKE_CXX_FLAGS="$san_flags" >/dev/null
  cmake --build build-asan
}

for part in "${parts[@]}"; do
  case "$part" in
    asan)
      echo "== test suite under AddressSanitizer + UndefinedBehaviorSanitizer"
      build_asan
      # StreamingMemoryTest measures RSS growth, which ASan's quarantine
      # inflates; `install` re-builds the project without sanitizers.
      ctest --test-dir build-asan --output-on-failure -j "$jobs" \
        -LE 'slow|install' -E 'StreamingMemoryTest'
      ;;
    fuzz)
      echo "== fuzz targets, ${fuzz_seconds} s each"
      build_asan
      ctest --test-dir build-asan -R '^fuzz\.make_seeds$' >/dev/null
      mkdir -p build-asan/fuzz/corpus build-asan/fuzz/artifacts
      # FUZZ_SKIP="a b": leave targets a and b out (none by default).
      skip=${FUZZ_SKIP-}
      targets=$(cd build-asan/fuzz && ls -- *_fuzzer)
      for s in $skip; do targets=$(printf '%s\n' $targets | grep -vx "${s}_fuzzer"); done
      export fuzz_seconds
      # -rss_limit_mb: an input that makes a target use 2 GiB is a finding;
      # -timeout: so is one that takes 20 s.
      printf '%s\n' $targets | xargs -P "$jobs" -I{} bash -c '
        t={}; name=${t%_fuzzer}
        mkdir -p build-asan/fuzz/corpus/$name
        if build-asan/fuzz/$t -max_total_time=$fuzz_seconds \
             -rss_limit_mb=2048 -timeout=20 -max_len=65536 -print_final_stats=1 \
             -artifact_prefix=build-asan/fuzz/artifacts/$name- \
             build-asan/fuzz/corpus/$name build-asan/fuzz/seeds/$name \
             >build-asan/fuzz/$name.log 2>&1; then
          echo "fuzz $name: ok ($(grep -o "stat::number_of_executed_units: [0-9]*" build-asan/fuzz/$name.log | grep -o "[0-9]*$") runs)"
        else
          echo "fuzz $name: FAILED; the log ends:"; tail -40 build-asan/fuzz/$name.log
          exit 255
        fi'
      ;;
    tsan)
      echo "== records, pipeline, convert, train and tools tests under ThreadSanitizer"
      cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=None \
        -DRECFLOW_CUDA=OFF -DRECFLOW_PYTHON=OFF -DRECFLOW_MPI=OFF \
        -DRECFLOW_BUILD_BENCH=OFF -DRECFLOW_TEST_OPTIMIZATION=-O0 \
        -DCMAKE_CXX_FLAGS="-O1 -g1 -fno-omit-frame-pointer -fsanitize=thread" >/dev/null
      cmake --build build-tsan --target records_tests pipeline_tests \
        convert_tests train_tests tools_tests
      # Left out: StreamingMemoryTest (RSS, which TSan's shadow inflates),
      # and tests with no threads of their own to check, which run under
      # ASan: HostileInputTest (allocation caps, 80 s here), KillWriterTest
      # (a writer killed by SIGKILL, 60 s each), the parser's 100,000
      # mutated Examples on one thread (140 s), and
      # train.sequential_openblas (CpuBackendTest.* again with OpenBLAS's
      # sequential build, whose calls TSan cannot see: 100 s).  The
      # recflow binary the tools tests run is built with TSan too; a
      # report there stops it.
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp" \
        ctest --test-dir build-tsan --output-on-failure -j "$jobs" \
        -L '^(records|pipeline|convert|train|tools)$' \
        -E 'StreamingMemoryTest|HostileInput|KillWriterTest|MutatedBytesAreRejectedExactlyWhenProtobufRejects|^train\.sequential_openblas$'
      ;;
    *)
      echo "unknown part: $part (asan, fuzz or tsan)" >&2
      exit 2
      ;;
  esac
done
