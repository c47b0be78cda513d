#!/usr/bin/env python3
"""The Python module's targets (docs/PERFORMANCE.md, "Python"), in one run:

  cpp      `recflow bench` on the pipeline below (C++ alone);
  python   the same pipeline through `import recflow`, each batch turned
           into torch tensors (recflow.torch.to_torch: torch.from_dlpack);
  source   random access in Python: recflow.torch.MapDataset over a
           recflow.TFRecordDataSource, one DataLoader batch (a
           BatchSampler over a RandomSampler, batch_size=None,
           num_workers=0) read and parsed in one call: a uniform random
           order over the whole epoch, where the others shuffle in a
           buffer of 10,000;
  loader   PyTorch's DataLoader over the same files the way the `tfrecord`
           package reads them (Python's struct for the framing, protobuf's
           example_pb2 for the Examples, a Python shuffle queue, DataLoader
           collation) -- a stand-in: the package itself is not in Debian
           and cannot be installed here.

Pipeline: shuffle(10,000, seed 1), batch 256, parse {image: bytes, label:
int64}, over Fashion-MNIST converted into 16 shards (indexed).  Runs
alternate and repeat; medians are printed with the ratios python/cpp,
python/loader and source/loader.

  /usr/bin/python3 bench/python_bench.py --build build --threads 2 \\
      --workers 2 --runs 3
"""

import argparse
import json
import os
import pathlib
import statistics
import struct
import subprocess
import sys
import tempfile
import time

SPEC = {"features": {"image": {"kind": "fixed", "dtype": "bytes", "shape": []},
                     "label": {"kind": "fixed", "dtype": "int64",
                               "shape": []}}}


def make_files(recflow_bin, work):
    out = work / "fm"
    if not (out / "train-00015-of-00016.tfrecord").exists():
        out.mkdir(parents=True, exist_ok=True)
        data = "/usr/share/datasets/fashion-mnist"
        subprocess.run([recflow_bin, "convert", "idx",
                        "--images", f"{data}/train-images-idx3-ubyte.gz",
                        "--labels", f"{data}/train-labels-idx1-ubyte.gz",
                        "--output", str(out / "train"), "--shards", "16"],
                       check=True, stdout=subprocess.DEVNULL)
    files = sorted(str(p) for p in out.glob("train-*-of-00016.tfrecord"))
    if not all(os.path.exists(f + ".idx") for f in files):
        subprocess.run([recflow_bin, "index", *files], check=True,
                       stdout=subprocess.DEVNULL)
    return files


def run_cpp(recflow_bin, files, spec_path, threads, repeat):
    out = subprocess.run(
        [recflow_bin, "bench", *files, "--spec", spec_path, "--batch", "256",
         "--map-threads", "-1", "--threads", str(threads), "--shuffle",
         "10000", "--seed", "1", "--repeat", str(repeat), "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["records_per_s"]


def run_python(files, threads, repeat):
    import recflow
    import recflow.torch
    ds = (recflow.Dataset.from_tfrecords(files).shuffle(10000, seed=1)
          .repeat(repeat).batch(256).parse(SPEC, num_parallel_calls=-1))
    n = 0
    start = time.perf_counter()
    for batch in ds.iterator(threads=threads):
        tensors = recflow.torch.to_torch(batch)
        n += tensors["label"].shape[0]
    return n / (time.perf_counter() - start)


def run_source(files, repeat):
    import recflow
    import recflow.torch
    import torch
    ds = recflow.torch.MapDataset(recflow.TFRecordDataSource(files,
                                                             spec=SPEC))
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(
            ds, generator=torch.Generator().manual_seed(1)), 256, False)
    loader = torch.utils.data.DataLoader(ds, batch_size=None,
                                         sampler=sampler, num_workers=0)
    n = 0
    start = time.perf_counter()
    for _ in range(repeat):
        for batch in loader:
            n += batch["label"].shape[0]
    return n / (time.perf_counter() - start)


def run_loader(files, workers, repeat, pb_dir):
    import numpy as np
    import torch
    sys.path.insert(0, pb_dir)
    import example_pb2  # generated from records/example.proto

    class TFRecordFiles(torch.utils.data.IterableDataset):
        """What the `tfrecord` package's MultiTFRecordDataset does."""

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            mine = files if info is None else files[info.id::info.num_workers]
            rng = np.random.default_rng(1 if info is None else info.id)
            queue = []
            for _ in range(repeat):
                for path in mine:
                    with open(path, "rb") as f:
                        while True:
                            header = f.read(12)
                            if len(header) < 12:
                                break
                            (length,) = struct.unpack("<Q", header[:8])
                            data = f.read(length)
                            f.read(4)
                            ex = example_pb2.Example()
                            ex.ParseFromString(data)
                            feat = ex.features.feature
                            item = {
                                "image": np.frombuffer(
                                    feat["image"].bytes_list.value[0],
                                    np.uint8),
                                "label": np.array(
                                    feat["label"].int64_list.value, np.int64),
                            }
                            if len(queue) < 10000 // max(1, len(mine)):
                                queue.append(item)
                                continue
                            k = rng.integers(len(queue))
                            yield queue[k]
                            queue[k] = item
            rng.shuffle(queue)
            yield from queue

    loader = torch.utils.data.DataLoader(TFRecordFiles(), batch_size=256,
                                         num_workers=workers)
    n = 0
    start = time.perf_counter()
    for batch in loader:
        n += batch["label"].shape[0]
    return n / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5,
                    help="epochs per C++/Python run (the loader runs one)")
    ap.add_argument("--work", default=os.path.join(
        tempfile.gettempdir(), "recflow-bench"))
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    sys.path.insert(0, str(build / "python"))
    recflow_bin = str(build / "tools" / "recflow")
    work = pathlib.Path(args.work)
    files = make_files(recflow_bin, work)
    spec_path = str(work / "fm-python-bench-spec.json")
    pathlib.Path(spec_path).write_text(json.dumps(SPEC))
    pb_dir = str(work / "pb")
    os.makedirs(pb_dir, exist_ok=True)
    proto = pathlib.Path(__file__).resolve().parents[1] / "records"
    subprocess.run(["protoc", f"-I{proto}", f"--python_out={pb_dir}",
                    str(proto / "example.proto")], check=True)

    rates = {"cpp": [], "python": [], "source": [], "loader": []}
    for run in range(args.runs):
        rates["cpp"].append(run_cpp(recflow_bin, files, spec_path,
                                    args.threads, args.repeat))
        rates["python"].append(run_python(files, args.threads, args.repeat))
        rates["source"].append(run_source(files, 1))
        rates["loader"].append(run_loader(files, args.workers, 1, pb_dir))
        print(f"run {run + 1}: " + "  ".join(
            f"{k} {v[-1] / 1e3:,.0f}k rec/s" for k, v in rates.items()),
            flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median: cpp {med['cpp'] / 1e3:,.0f}k  python "
          f"{med['python'] / 1e3:,.0f}k  source {med['source'] / 1e3:,.0f}k  "
          f"loader {med['loader'] / 1e3:,.1f}k records/s  (threads "
          f"{args.threads}, workers {args.workers})")
    print(f"python / cpp = {med['python'] / med['cpp']:.2f}  (target >= 0.8)")
    print(f"python / loader = {med['python'] / med['loader']:.1f}  "
          "(target >= 10)")
    print(f"source / loader = {med['source'] / med['loader']:.1f}  "
          f"(source / python = {med['source'] / med['python']:.2f})")


if __name__ == "__main__":
    main()
