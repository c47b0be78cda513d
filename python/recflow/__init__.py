"""recflow: TFRecords, tf.train.Example and a tf.data-style input pipeline
in C++, for PyTorch and JAX, without copies.

    import recflow
    ds = (recflow.Dataset.from_tfrecords("data/train-*.tfrecord")
          .shuffle(10_000, seed=7)
          .batch(256, drop_remainder=True)
          .parse({"image": recflow.FixedLenFeature([], "bytes"),
                  "label": recflow.FixedLenFeature([], "int64")})
          .map(recflow.maps.decode_raw("image", "uint8", [28, 28]))
          .prefetch(2))
    for batch in ds:
        x = torch.from_dlpack(batch["image"])   # no copy

See docs/PYTHON.md.  recflow.torch adapts a Dataset to PyTorch's
DataLoader.
"""

import operator as _operator

from recflow import _recflow
from recflow._array import Array, Ragged
from recflow._recflow import (
    Dataset,
    Example,
    FeatureSpec,
    Iterator,
    RecordError,
    TFRecordDataSource,
    TFRecordIterator,
    TFRecordWriter,
    convert,
    count,
    index,
    maps,
    tfrecord_iterator,
    verify,
)

__version__ = "0.1.0"

# tf.data.AUTOTUNE: for map's num_parallel_calls (every thread of the
# iterator) and prefetch's buffer_size (a depth tuned while it runs).
AUTOTUNE = -1
# Dataset.cardinality()'s answers besides a count, as tf.data's.
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2

__all__ = [
    "AUTOTUNE", "Array", "Dataset", "Example", "FeatureSpec", "FixedLenFeature",
    "INFINITE_CARDINALITY", "Iterator", "Ragged", "RecordError",
    "TFRecordDataSource", "UNKNOWN_CARDINALITY",
    "TFRecordIterator",
    "TFRecordWriter", "VarLenFeature", "convert", "count", "index", "maps",
    "tfrecord_iterator", "verify",
]


def FixedLenFeature(shape, dtype, default_value=None):
    """tf.io.FixedLenFeature: `shape` values of `dtype` per Example
    ("float32", "int64" or "bytes"); required unless `default_value`."""
    spec = {"kind": "fixed", "dtype": _dtype_name(dtype),
            "shape": [_operator.index(d) for d in shape]}
    if default_value is not None:
        if isinstance(default_value, (bytes, str)):
            default_value = [default_value]
        import numpy as np
        # A scalar, list, nested list or numpy array, flat; numpy values as
        # Python's (JSON has no numpy types).
        values = np.asarray(default_value, dtype=object).ravel().tolist()
        spec["default"] = [
            _default_text(v.item() if isinstance(v, np.generic) else v)
            for v in values]
    return spec


def _default_text(value):
    # The spec is JSON: a bytes default must be UTF-8 text there.
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"default {value!r}: a bytes default must be UTF-8 text (a spec "
            f"is JSON); byte {e.start} is not") from None


def VarLenFeature(dtype):
    """tf.io.VarLenFeature: any number of values of `dtype` per Example
    (ragged after batch)."""
    return {"kind": "var", "dtype": _dtype_name(dtype)}


def _dtype_name(dtype):
    """float32, int64 or bytes: the three an Example holds.  A name is
    checked by FeatureSpec; a numpy dtype or Python type of any other kind
    is refused here rather than read as the nearest one (np.uint8 as int64,
    np.complex64 as bytes)."""
    if isinstance(dtype, str):
        return {"float": "float32", "string": "bytes"}.get(dtype, dtype)
    if dtype is int:
        return "int64"
    if dtype is float:
        return "float32"
    if dtype is bytes or dtype is str:
        return "bytes"
    import numpy as np
    dt = np.dtype(dtype)
    if dt == np.float32:
        return "float32"
    if dt == np.int64:
        return "int64"
    if dt.kind in "SUO":
        return "bytes"
    raise TypeError(
        f"an Example feature is float32, int64 or bytes, not {dt}; parse it "
        f"as one of those and convert it with recflow.maps.cast")


# `import recflow.maps` works as well as `recflow.maps`.
import sys as _sys

_sys.modules[__name__ + ".maps"] = maps
