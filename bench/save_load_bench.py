#!/usr/bin/env python3
"""Dataset.save / Dataset.load next to parsing the same TFRecords, in one
run (docs/PERFORMANCE.md, "Saved datasets").

Fashion-MNIST (Debian's dataset-fashion-mnist) is converted into 4 shards
of Examples {image: bytes, label: int64}; the pipeline parses them in
batches of 256 and decodes the images to uint8 [28, 28].  That pipeline is
saved twice, as its batches and unbatched (one element per image), and
each save is loaded back:

  parse     from_tfrecords(shards).batch(256).parse(spec).map(decode_raw)
  batches   Dataset.load(saved batches)
  rows      Dataset.load(saved rows).batch(256)

Prints the seconds of each save (three runs) and the records/s of each
read (the best of five, alternating, twice).

  PYTHONPATH=build/python /usr/bin/python3 bench/save_load_bench.py \\
      --recflow build/tools/recflow
"""

import argparse
import pathlib
import shutil
import subprocess
import tempfile
import time

import recflow

D = recflow.Dataset
SPEC = {"image": recflow.FixedLenFeature([], "bytes"),
        "label": recflow.FixedLenFeature([], "int64")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--recflow", default="build/tools/recflow")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        data = "/usr/share/datasets/fashion-mnist"
        subprocess.run([args.recflow, "convert", "idx",
                        "--images", f"{data}/train-images-idx3-ubyte.gz",
                        "--labels", f"{data}/train-labels-idx1-ubyte.gz",
                        "--output", str(work / "fm"), "--shards", "4"],
                       check=True, stdout=subprocess.DEVNULL)
        files = sorted(str(p) for p in work.glob("fm-*-of-00004.tfrecord"))

        def parsed():
            return D.from_tfrecords(files).batch(256).parse(
                SPEC, num_parallel_calls=args.threads).map(
                    recflow.maps.decode_raw("image", "uint8", [28, 28]))

        for name, ds in (("batches", parsed()), ("rows", parsed().unbatch())):
            times = []
            for _ in range(3):
                shutil.rmtree(work / name, ignore_errors=True)
                start = time.time()
                ds.save(work / name, shards=4)
                times.append(time.time() - start)
            print("save %-8s %s s" % (name, ", ".join("%.3f" % t
                                                       for t in times)))

        def run(name, ds):
            best = float("inf")
            for _ in range(5):
                start = time.time()
                n = 0
                for b in ds.iterator(threads=args.threads):
                    n += len(b["label"])
                best = min(best, time.time() - start)
            print("%-10s %5.2fM records/s (%d records, best of 5)"
                  % (name, n / best / 1e6, n))

        for _ in range(2):
            run("parse", parsed())
            run("batches", D.load(work / "batches", num_parallel_reads=2))
            run("rows", D.load(work / "rows", num_parallel_reads=2).batch(256))


if __name__ == "__main__":
    main()
