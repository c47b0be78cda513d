#!/usr/bin/env bash
# Builds (installing missing packages first, see setup.sh) and runs the
# default test suite: everything but the tests labelled `slow`.
# Run the slow ones with: ctest --test-dir build -L slow --output-on-failure
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" -LE slow
