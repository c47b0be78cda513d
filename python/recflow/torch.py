"""recflow for PyTorch: a recflow.Dataset as a torch IterableDataset.

    from torch.utils.data import DataLoader
    import recflow, recflow.torch
    ds = recflow.Dataset.from_tfrecords(files).batch(256).parse(spec)
    loader = DataLoader(recflow.torch.IterableDataset(ds), batch_size=None)
    for batch in loader:           # dicts of torch tensors, no copy
        ...

Use it with ``batch_size=None`` (recflow batches) and ``num_workers=0``:
the parallelism is in C++, on every core, and worker processes would
only add copies between processes.  With ``num_workers > 0`` each worker
would read the whole dataset, so recflow.torch refuses it unless told
``shard_by_worker=True``: then worker k of n reads ``dataset.shard(n, k)``
(whole files where there are at least n, else every n-th element).
"""

import torch
import torch.utils.data

import recflow

__all__ = ["IterableDataset", "to_torch"]


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
