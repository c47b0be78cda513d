#!/usr/bin/env python3
"""Does the Python module lose anything by leaving glibc's allocator alone?

`recflow` (the CLI) and the C++ benchmarks call
pipeline::TuneAllocatorForBatches(): mmap threshold 64 MiB, trim threshold
256 MiB.  `import recflow` does not, since a library does not retune its
host's allocator.  This runs each pipeline below in a fresh interpreter,
untuned and tuned (the same two mallopt calls through ctypes before
`import recflow`), alternating which goes first, and prints records/s and minor page faults
per second (getrusage) of each run:

  gzip     4 gzipped shards, num_parallel_reads=2 (one reader thread per
           file), batch 256, parse;
  plain    4 uncompressed shards, batch 256, parse;
  shuffled 4 uncompressed shards, shuffle(10,000, seed 1), batch 256, parse.

The shards are Fashion-MNIST's training set (dataset-fashion-mnist),
converted with the build's `recflow convert idx`.

  /usr/bin/python3 bench/python_allocator.py --build build --runs 5
"""

import argparse
import glob
import os
import pathlib
import subprocess
import sys
import tempfile

MNIST = "/usr/share/datasets/fashion-mnist"

CHILD = r"""
import ctypes, glob, resource, sys, time
if sys.argv[1] == "tuned":
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 << 20)   # M_MMAP_THRESHOLD
    libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
import recflow
case, pattern, seconds = sys.argv[2], sys.argv[3], float(sys.argv[4])
spec = {"image": recflow.FixedLenFeature([], "string"),
        "label": recflow.FixedLenFeature([], "int64")}
reads = 2 if case == "gzip" else 1
ds = recflow.Dataset.from_tfrecords(sorted(glob.glob(pattern)),
                                    num_parallel_reads=reads).repeat()
if case == "shuffled":
    ds = ds.shuffle(10000, seed=1)
it = ds.batch(256).parse(spec).iterator(threads=1)
for _ in range(20):  # warm up: buffers filled, reader threads running
    next(it)
n = 0
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for _ in range(20):
        n += len(next(it)["label"])
dt = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(n / dt, (r1.ru_minflt - r0.ru_minflt) / dt)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    env = dict(os.environ, PYTHONPATH=str(build / "python"))
    with tempfile.TemporaryDirectory() as tmp:
        for prefix, compression in (("plain", "none"), ("gzip", "gzip")):
            subprocess.run(
                [str(build / "tools/recflow"), "convert", "idx", "--images",
                 f"{MNIST}/train-images-idx3-ubyte.gz", "--labels",
                 f"{MNIST}/train-labels-idx1-ubyte.gz", "-o",
                 f"{tmp}/{prefix}", "-n", "4", "--compression", compression],
                check=True, stdout=subprocess.DEVNULL)
        cases = (("gzip", f"{tmp}/gzip-*"), ("plain", f"{tmp}/plain-*"),
                 ("shuffled", f"{tmp}/plain-*"))
        print(f"{'case':9} {'run':>3} {'untuned rec/s':>14} {'faults/s':>9}"
              f" {'tuned rec/s':>12} {'faults/s':>9} {'tuned/untuned':>13}")
        for case, pattern in cases:
            assert glob.glob(pattern), pattern
            for run in range(args.runs):
                got = {}
                modes = ("untuned", "tuned")
                for mode in modes if run % 2 == 0 else modes[::-1]:
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, mode, case, pattern,
                         str(args.seconds)], env=env, check=True,
                        capture_output=True, text=True).stdout.split()
                    got[mode] = (float(out[0]), float(out[1]))
                (ru, fu), (rt, ft) = got["untuned"], got["tuned"]
                print(f"{case:9} {run + 1:3} {ru:14,.0f} {fu:9,.0f}"
                      f" {rt:12,.0f} {ft:9,.0f} {rt / ru:13.2f}")


if __name__ == "__main__":
    main()
