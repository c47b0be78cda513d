#!/usr/bin/env python3
"""What a Python map's result costs to copy (docs/PERFORMANCE.md, "What a
Python map's copied result costs"): the microseconds an element of a map
over from_tensors({'x': 784 float32}).repeat(N) takes when the map
returns its input (passed on without a copy), one 784-float32 buffer of
its own (copied: it could change later) or one image-sized buffer of
150,528 bytes (copied), alternating, --runs times.

  PYTHONPATH=build/python /usr/bin/python3 bench/python_map_copy.py
"""

import argparse
import time

import numpy as np

import recflow


def per_element_us(ds, n):
    start = time.perf_counter()
    count = 0
    for _ in ds:
        count += 1
    assert count == n
    return (time.perf_counter() - start) / n * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=100000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n = args.elements
    small = np.zeros(784, np.float32)
    image = np.zeros(224 * 224 * 3, np.uint8)
    base = recflow.Dataset.from_tensors({"x": small}).repeat(n)
    cases = [("its input (no copy)", lambda e: e),
             ("a 784-float32 buffer (copied)", lambda e: {"x": small}),
             ("a 150,528-byte buffer (copied)", lambda e: {"x": image})]
    for run in range(args.runs):
        figures = [f"{name}: {per_element_us(base.map(fn), n):.2f}"
                   for name, fn in cases]
        print(f"run {run + 1}, us an element: " + "; ".join(figures))


if __name__ == "__main__":
    main()
