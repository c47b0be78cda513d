"""recflow.torch: a recflow.Dataset feeding PyTorch without copies."""

import gc

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import recflow
import recflow.torch
from conftest import MNIST, MNIST_SPEC, SMALL_SPEC, write_records


def mnist(batch):
    return (recflow.Dataset.from_tfrecords(MNIST).shuffle(1000, seed=1)
            .batch(batch, drop_remainder=True).parse(MNIST_SPEC).prefetch(2))


def test_data_loader_yields_torch_tensors():
    loader = DataLoader(recflow.torch.IterableDataset(mnist(100)),
                        batch_size=None, num_workers=0)
    batches = list(loader)
    assert len(batches) == 10
    # Files are of unknown length; through the global shuffle, known.
    with pytest.raises(TypeError, match="length is unknown"):
        len(loader)
    known = recflow.Dataset.from_tfrecords(MNIST).global_shuffle(seed=1)
    assert len(DataLoader(recflow.torch.IterableDataset(
        known.batch(300).parse(MNIST_SPEC)), batch_size=None)) == 4
    x, y = batches[0]["image_floats"], batches[0]["image_class"]
    assert isinstance(x, torch.Tensor) and x.shape == (100, 784)
    assert y.dtype == torch.int64
    labels = torch.cat([b["image_class"] for b in batches])
    assert sorted(labels.tolist()) == sorted(
        int(b["image_class"][i]) for b in recflow.Dataset.from_tfrecords(
            MNIST).batch(1000).parse(MNIST_SPEC) for i in range(1000))


def test_workers_are_refused_or_sharded(tmp_path):
    files = [str(write_records(tmp_path / f"s{i}.tfrecord", 10))
             for i in range(2)]
    ds = recflow.Dataset.from_tfrecords(files).parse(SMALL_SPEC)
    refused = DataLoader(recflow.torch.IterableDataset(ds), batch_size=None,
                         num_workers=2)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        list(refused)
    # PyTorch shuts down the workers of a loader whose worker raised when
    # its iterator is collected, joining each for up to 5 s.  Collect it
    # before the next loader forks its workers, not while it does: a fork
    # with the first loader's queue threads still running left a worker
    # blocked on a lock they held (seen once, under ctest).
    del refused
    gc.collect()
    sharded = DataLoader(
        recflow.torch.IterableDataset(ds, threads=1, shard_by_worker=True),
        batch_size=None, num_workers=2)
    names = sorted(e["name"] for e in sharded)
    assert names == sorted([b"r%d" % i for i in range(10)] * 2)


def test_a_short_training_loop_learns():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = recflow.torch.IterableDataset(mnist(50).repeat(5))
    losses = []
    for batch in loader:
        loss = torch.nn.functional.cross_entropy(
            model(batch["image_floats"]), batch["image_class"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert len(losses) == 100
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])


def test_writing_into_a_torch_tensor_changes_no_cache_and_no_source():
    a = np.arange(8, dtype=np.float32)
    # Epoch 2 of a cached dataset sees epoch 1's values, not what a
    # training loop wrote into its tensors.
    cached = recflow.Dataset.from_tensor_slices({"x": a}).batch(4).cache()
    seen = []
    for b in recflow.torch.IterableDataset(cached.repeat(2)):
        seen.append(b["x"].tolist())
        b["x"].mul_(10)
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    # Elements that are slices of the caller's arrays leave them alone.
    for e in recflow.torch.IterableDataset(
            recflow.Dataset.from_tensor_slices({"x": a})):
        e["x"].add_(100)
    assert a.tolist() == list(range(8))
    for e in recflow.torch.IterableDataset(
            recflow.Dataset.from_tensors({"x": a}).repeat(2)):
        assert e["x"].tolist() == list(range(8))
        e["x"].add_(100)
    assert a.tolist() == list(range(8))
    # What only the element holds is still shared, not copied: a fresh
    # batch, and a view of it.
    b = next(iter(recflow.Dataset.from_tensor_slices({"x": a}).batch(4)))
    assert torch.from_dlpack(b["x"]).data_ptr() == b["x"].ctypes.data
    assert torch.from_dlpack(b["x"][1:]).data_ptr() == b["x"][1:].ctypes.data
    # A batch its iterator's cache holds is copied, with the same values.
    it = iter(recflow.Dataset.from_tensor_slices({"x": a}).batch(4).cache())
    c = next(it)
    t = torch.from_dlpack(c["x"])
    assert t.data_ptr() != c["x"].ctypes.data and t.tolist() == [0, 1, 2, 3]


def test_to_torch_keeps_bytes_and_shares_memory():
    b = next(iter(recflow.Dataset.from_tfrecords(MNIST).batch(2).parse(
        MNIST_SPEC, keep_record=True)))
    t = recflow.torch.to_torch(b)
    assert t["image_floats"].data_ptr() == b["image_floats"].ctypes.data
    assert isinstance(t["record"][0], bytes)


def _batches(loader):
    return [(b["image_class"].clone(), b["image_floats"].sum().item())
            for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_map_dataset_under_a_batch_sampler(workers):
    src = recflow.TFRecordDataSource(MNIST, spec=MNIST_SPEC)
    ds = recflow.torch.MapDataset(src)
    assert len(ds) == 1000
    # The parent reads first: forked workers then must not share its
    # io_uring ring (they set up their own).
    first = ds[[0, 1, 2]]
    assert isinstance(first["image_floats"], torch.Tensor)
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(3))
    sampler = torch.utils.data.BatchSampler(order.tolist(), 100, False)
    loader = DataLoader(ds, batch_size=None, sampler=sampler,
                        num_workers=workers)
    got = _batches(loader)
    assert len(got) == 10
    whole = next(iter(recflow.Dataset.from_tfrecords(MNIST).batch(1000)
                      .parse(MNIST_SPEC)))
    labels = torch.from_dlpack(whole["image_class"])
    images = torch.from_dlpack(whole["image_floats"])
    for k, (y, x_sum) in enumerate(got):
        rows = order[k * 100:(k + 1) * 100]
        assert torch.equal(y, labels[rows])
        assert x_sum == pytest.approx(images[rows].sum().item(), rel=1e-6)


def test_map_dataset_gets_a_list_of_records_in_one_call(tmp_path):
    # What PyTorch 2's fetcher asks for: [ds[i] for i in indices], here
    # with a ragged feature, bytes and a scalar, and without a spec.
    path = str(tmp_path / "a.tfrecord")
    with recflow.TFRecordWriter(path) as w:
        for i in range(6):
            w.write(recflow.Example({"v": np.arange(i, dtype=np.int64),
                                     "s": b"x" * i, "l": np.int64(i)}))
    spec = {"v": recflow.VarLenFeature("int64"),
            "s": recflow.FixedLenFeature([], "bytes"),
            "l": recflow.FixedLenFeature([], "int64")}
    ds = recflow.torch.MapDataset(recflow.TFRecordDataSource(path, spec=spec))
    indices = [4, 1, 4, 5, 0]
    got = ds.__getitems__(indices)
    assert len(got) == len(indices)
    for item, i in zip(got, indices):
        want = ds[i]
        assert sorted(item) == sorted(want)
        assert torch.equal(item["v"], want["v"]) and item["v"].shape == (i,)
        assert torch.equal(item["l"], want["l"]) and item["l"].dim() == 0
        assert item["s"] == want["s"] == b"x" * i
    # Collated as the fetcher does, the scalars stack into the batch.
    collated = torch.utils.data.default_collate(
        [{"l": g["l"]} for g in got])
    assert collated["l"].tolist() == indices
    raw = recflow.torch.MapDataset(recflow.TFRecordDataSource(path))
    assert raw.__getitems__([2, 0]) == [raw[2], raw[0]]


def test_map_dataset_one_record_at_a_time_with_spawned_workers():
    ds = recflow.torch.MapDataset(
        recflow.TFRecordDataSource(MNIST, spec=MNIST_SPEC))
    item = ds[5]
    assert item["image_floats"].shape == (784,)
    loader = DataLoader(ds, batch_size=50, shuffle=False, num_workers=2,
                        multiprocessing_context="spawn")
    labels = torch.cat([b["image_class"] for b in loader])
    assert labels.shape == (1000,)
    assert torch.equal(labels[:3], torch.stack([ds[i]["image_class"]
                                                for i in range(3)]))
    with pytest.raises(TypeError, match="TFRecordDataSource"):
        recflow.torch.MapDataset(recflow.Dataset.from_tfrecords(MNIST))
