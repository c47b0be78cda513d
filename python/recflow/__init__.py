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

from recflow import _recflow
from recflow._array import Array, Ragged
from recflow._recflow import (
    Dataset,
    Example,
    FeatureSpec,
    Iterator,
    RecordError,
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

__all__ = [
    "Array", "Dataset", "Example", "FeatureSpec", "FixedLenFeature",
    "Iterator", "Ragged", "RecordError", "TFRecordIterator",
    "TFRecordWriter", "VarLenFeature", "convert", "count", "index", "maps",
    "tfrecord_iterator", "verify",
]


def FixedLenFeature(shape, dtype, default_value=None):
    """tf.io.FixedLenFeature: `shape` values of `dtype` per Example
    ("float32", "int64" or "bytes"); required unless `default_value`."""
    spec = {"kind": "fixed", "dtype": _dtype_name(dtype),
            "shape": [int(d) for d in shape]}
    if default_value is not None:
        if isinstance(default_value, (bytes, str, int, float)):
            default_value = [default_value]
        spec["default"] = [v.decode() if isinstance(v, bytes) else v
                           for v in default_value]
    return spec


def VarLenFeature(dtype):
    """tf.io.VarLenFeature: any number of values of `dtype` per Example
    (ragged after batch)."""
    return {"kind": "var", "dtype": _dtype_name(dtype)}


def _dtype_name(dtype):
    if isinstance(dtype, str):
        return {"float": "float32", "string": "bytes"}.get(dtype, dtype)
    import numpy as np
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return "float32"
    if dt.kind in "iub":
        return "int64"
    return "bytes"


# `import recflow.maps` works as well as `recflow.maps`.
import sys as _sys

_sys.modules[__name__ + ".maps"] = maps
