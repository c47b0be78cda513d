"""recflow for PyTorch: a recflow.Dataset as a torch IterableDataset, and
a recflow.TFRecordDataSource as a map-style Dataset.

    from torch.utils.data import DataLoader
    import recflow, recflow.torch
    ds = recflow.Dataset.from_tfrecords(files).batch(256).parse(spec)
    loader = DataLoader(recflow.torch.IterableDataset(ds), batch_size=None)
    for batch in loader:           # dicts of torch tensors, no copy
        ...

For random access (a sampler of your own: shuffled indices, a
DistributedSampler, chosen records), recflow.torch.MapDataset wraps a
recflow.TFRecordDataSource; give the DataLoader a BatchSampler so that a
batch is one call (one read of all its records and one parse):

    src = recflow.TFRecordDataSource(files, spec=spec)
    ds = recflow.torch.MapDataset(src)
    loader = DataLoader(ds, batch_size=None, sampler=BatchSampler(
        RandomSampler(ds), batch_size=256, drop_last=True))

Use IterableDataset with ``batch_size=None`` (recflow batches) and
``num_workers=0``: the parallelism is in C++, on every core, and worker
processes would only add copies between processes.  With
``num_workers > 0`` each worker would read the whole dataset, so
recflow.torch refuses it unless told ``shard_by_worker=True``: then worker
k of n reads ``dataset.shard(n, k)`` (whole files where there are at
least n, else every n-th element).
"""

import torch
import torch.utils.data

import recflow

__all__ = ["IterableDataset", "MapDataset", "to_torch"]


def to_torch(element):
    """A dict of recflow arrays as a dict of torch tensors sharing their
    memory (torch.from_dlpack); bytes values and Ragged stay as they are."""
    out = {}
    for name, value in element.items():
        if isinstance(value, recflow.Array):
            out[name] = torch.from_dlpack(value)
        else:
            out[name] = value
    return out


class IterableDataset(torch.utils.data.IterableDataset):
    """Iterates a recflow.Dataset, yielding dicts of torch tensors.

    threads: the C++ pipeline's threads (0: every core).
    shard_by_worker: under a DataLoader with num_workers > 0, read
    dataset.shard(num_workers, worker_id) in each worker instead of
    refusing.
    """

    def __init__(self, dataset, threads=0, shard_by_worker=False):
        super().__init__()
        if not isinstance(dataset, recflow.Dataset):
            raise TypeError("recflow.torch.IterableDataset takes a "
                            f"recflow.Dataset, not {type(dataset).__name__}")
        self.dataset = dataset
        self.threads = threads
        self.shard_by_worker = shard_by_worker

    def __iter__(self):
        dataset = self.dataset
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            if not self.shard_by_worker:
                raise RuntimeError(
                    "recflow.torch.IterableDataset in a DataLoader with "
                    f"num_workers={info.num_workers}: every worker would read "
                    "every record. Use num_workers=0 (recflow runs the "
                    "pipeline on every core itself), or pass "
                    "shard_by_worker=True to read one shard per worker")
            dataset = dataset.shard(info.num_workers, info.id)
        for element in dataset.iterator(threads=self.threads):
            yield to_torch(element)

    def __len__(self):
        """len(dataset) where its cardinality is a count (the elements of
        all workers' shards together), so that len(DataLoader(...)) works;
        TypeError where it is unknown or infinite."""
        return len(self.dataset)


class MapDataset(torch.utils.data.Dataset):
    """A recflow.TFRecordDataSource as a torch map-style Dataset.

    ``dataset[i]`` is record i and ``dataset[[i, j, ...]]`` a batch of
    them (one read of all and, with a spec, one vectorised parse), as
    dicts of torch tensors sharing the parsed arrays' memory; a source
    without a spec gives bytes (a list of them for a batch).  Under a
    DataLoader with ``num_workers > 0`` each worker reads the records its
    sampler gives it (a forked worker keeps the source; a spawned one gets
    it pickled, as its files and spec, and reads the indexes again).
    """

    def __init__(self, source):
        super().__init__()
        if not isinstance(source, recflow.TFRecordDataSource):
            raise TypeError("recflow.torch.MapDataset takes a "
                            "recflow.TFRecordDataSource, not "
                            f"{type(source).__name__}")
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, index):
        item = self.source[index]
        return to_torch(item) if isinstance(item, dict) else item

    def __getitems__(self, indices):
        """``[self[i] for i in indices]``, read and parsed in one call: the
        fetcher of PyTorch 2's DataLoader calls it with a batch of its
        sampler's indices, then collates the list, so that
        ``DataLoader(ds, batch_size=256)`` reads each batch at once.  The
        records' tensors are rows of the batch's, sharing its memory."""
        batch = self.source[list(indices)]
        if not isinstance(batch, dict):
            return batch
        # Tensors and bytes index by row as they are (a bytes object
        # array's row i is what self[i] has); a Ragged's rows become tensors.
        columns = to_torch(batch)
        for name, value in columns.items():
            if isinstance(value, recflow.Ragged):
                columns[name] = [torch.from_dlpack(value[i])
                                 for i in range(len(value))]
        return [{name: column[i] for name, column in columns.items()}
                for i in range(len(indices))]
