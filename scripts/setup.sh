#!/usr/bin/env bash
# Installs the Debian packages recflow needs that are missing (as root), then
# builds in Release into build/.  Used by the README's two commands.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libprotobuf-dev protobuf-compiler
  libzstd-dev zstd zlib1g-dev libtbb-dev liburing-dev libeigen3-dev
  libbenchmark-dev libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libzip-dev
  # train/: the CPU backend's products (OpenBLAS's pthread build); the
  # sequential build only for the test that loads it instead.
  libopenblas-pthread-dev libopenblas0-serial
  dataset-fashion-mnist
  # python/: the module, for Debian's /usr/bin/python3; its tests use
  # pytest and PyTorch from Debian too.
  python3-dev pybind11-dev python3-numpy libdlpack-dev
  python3-pytest python3-torch python3-protobuf  # bench/python_bench.py: protobuf
  # train/: data-parallel training launched by mpirun (docs/DISTRIBUTED.md)
  openmpi-bin libopenmpi-dev
  clang llvm  # scripts/sanitize.sh: libFuzzer, sanitizers, llvm-symbolizer
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "error: missing packages and not root; run as root or install: ${missing[*]}" >&2
    exit 2
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[[ ${1:-} == --packages-only ]] && exit 0

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
# `import recflow` for /usr/bin/python3 from any directory: the package
# goes where that interpreter looks (/usr/local/lib/python3.X/dist-packages).
if [[ -d build/python/recflow ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    cmake --install build --component python >/dev/null
  else
    echo "not root: the Python module is not installed; use" \
      "PYTHONPATH=$PWD/build/python (docs/PYTHON.md)" >&2
  fi
fi
