"""How far a shuffle moves each record, and a batch's mix of files: one
Shuffle(n * files) after the interleave against a shuffle buffer of n per
file (TFRecordOptions::shuffle_buffer_per_file), over FILES files of
RECORDS records read all at once (docs/PERFORMANCE.md, pipeline
scaling, 2026-11-28's twenty-first session; pipeline/README.md).

    PYTHONPATH=build/python python3 bench/shuffle_displacement.py [FILES] [RECORDS] [N]

The distance is a record's place in the shuffled stream less its place in
the unshuffled interleave.  Seeded: the same figures each run.
"""
import sys
import tempfile

import numpy as np

import recflow


def main():
    files = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    records = int(sys.argv[2]) if len(sys.argv) > 2 else 3750
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 625
    spec = {"id": recflow.FixedLenFeature([], "int64")}
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for f in range(files):
            paths.append(f"{tmp}/part-{f:03d}.tfrecord")
            with recflow.TFRecordWriter(paths[-1]) as w:
                for i in range(records):
                    w.write(recflow.Example({"id": f * records + i}))

        def ids(ds):
            return np.concatenate(
                [b["id"] for b in ds.batch(1000).parse(spec)])

        base = ids(recflow.Dataset.from_tfrecords(paths,
                                                  num_parallel_reads=files))
        place = np.empty(len(base), np.int64)
        place[base] = np.arange(len(base))
        for name, ds in (
                (f"one Shuffle({n * files})",
                 recflow.Dataset.from_tfrecords(
                     paths, num_parallel_reads=files).shuffle(n * files,
                                                              seed=1)),
                (f"{files} buffers of {n}",
                 recflow.Dataset.from_tfrecords(
                     paths, num_parallel_reads=files,
                     shuffle_buffer_per_file=n, seed=1))):
            out = ids(ds)
            d = np.arange(len(out)) - place[out]
            most = [np.bincount(out[k:k + 256] // records,
                                minlength=files).max()
                    for k in range(0, len(out) - 255, 256)]
            print(f"{name}: distance mean {np.abs(d).mean():.0f}, median "
                  f"{np.median(np.abs(d)):.0f}, 5th/95th percentiles "
                  f"{np.percentile(d, 5):.0f}/{np.percentile(d, 95):.0f}; "
                  f"most records of one file in a batch of 256: median "
                  f"{np.median(most):.0f}, max {max(most)}")


if __name__ == "__main__":
    main()
