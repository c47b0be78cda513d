"""The array types recflow hands to Python (used by the C++ module)."""

import numpy as np

from recflow import _recflow


class Array(np.ndarray):
    """A read-only numpy array that shares memory with a recflow tensor.

    It is a plain numpy.ndarray in every way, except that ``__dlpack__``
    exports it even though it is read-only (numpy refuses to), so that
    ``torch.from_dlpack(a)`` and ``jax.dlpack.from_dlpack(a)`` take it
    without a copy.  The memory stays alive as long as any array or
    framework tensor viewing it does.  Where something else holds that
    memory (a cache, the arrays a dataset was sliced from), ``__dlpack__``
    exports a copy instead, so that writing through the framework's tensor
    changes nothing recflow or the caller will read again.
    """

    def __dlpack__(self, stream=None):
        if stream is not None:
            raise BufferError("recflow arrays live in host memory; "
                              "stream must be None")
        return _recflow._export_dlpack(self)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0


class Ragged:
    """A ragged tensor: a VarLen feature parsed over a batch.

    Row ``i`` holds ``row_lengths[i]`` of ``values``, in order (TensorFlow's
    RaggedTensor.from_row_lengths).  ``values`` and ``row_lengths`` are
    arrays; ``ragged[i]`` is row i.
    """

    __slots__ = ("values", "row_lengths", "_splits")

    def __init__(self, values, row_lengths):
        self.values = values
        lengths = np.asarray(row_lengths)
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind
                                 not in "iu"):
            # asarray(..., dtype=int64) would cut 1.5 to 1 silently.
            raise TypeError(
                f"row_lengths must be a vector of integers, not "
                f"{lengths.dtype} of shape {lengths.shape}")
        self.row_lengths = lengths.astype(np.int64)
        if self.row_lengths.size and int(self.row_lengths.min()) < 0:
            row = int(np.argmax(self.row_lengths < 0))
            raise ValueError(
                f"row {row} has length {int(self.row_lengths[row])}; row "
                f"lengths are never negative")
        if int(self.row_lengths.sum()) != len(values):
            raise ValueError(
                f"row lengths adding up to {int(self.row_lengths.sum())} do "
                f"not match {len(values)} values")
        self._splits = None

    @property
    def row_splits(self):
        """[0, len(row 0), len(row 0) + len(row 1), ...] (n + 1 values)."""
        if self._splits is None:
            self._splits = np.concatenate(
                ([0], np.cumsum(self.row_lengths))).astype(np.int64)
        return self._splits

    def __len__(self):
        return len(self.row_lengths)

    def __getitem__(self, i):
        splits = self.row_splits
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of a ragged tensor of {len(self)} rows")
        return self.values[splits[i]:splits[i + 1]]

    def to_list(self):
        """The rows as a list of lists."""
        return [list(self[i]) for i in range(len(self))]

    def __eq__(self, other):
        return (isinstance(other, Ragged)
                and np.array_equal(self.row_lengths, other.row_lengths)
                and np.array_equal(self.values, other.values))

    def __repr__(self):
        return f"Ragged({self.to_list()!r})"
