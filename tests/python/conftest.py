"""Shared fixtures of the Python module's tests (run by ctest, which sets
PYTHONPATH to build/python, RECFLOW_BIN and RECFLOW_FIXTURES_DIR)."""

import os
import pathlib

import numpy as np
import pytest

import recflow

FIXTURES = pathlib.Path(os.environ.get(
    "RECFLOW_FIXTURES_DIR",
    pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures"))
MNIST = FIXTURES / "tf" / "tfx_mnist_1000_example.tfrecord"
PENGUIN = FIXTURES / "tf" / "tfx_penguin_eval_example.tfrecord.gz"
MNIST_SPEC = {
    "image_floats": recflow.FixedLenFeature([784], "float32"),
    "image_class": recflow.FixedLenFeature([], "int64"),
}


@pytest.fixture
def recflow_bin():
    path = os.environ.get("RECFLOW_BIN")
    if not path:
        pytest.skip("RECFLOW_BIN is not set (ctest sets it)")
    return path


def write_records(path, n, compression=None, index=False):
    """n Examples {"id": i, "x": [i, i + 0.5], "name": b"r<i>"}."""
    with recflow.TFRecordWriter(str(path), compression=compression,
                                index=index) as w:
        for i in range(n):
            w.write(recflow.Example({"id": i, "x": np.array([i, i + 0.5],
                                                            np.float32),
                                     "name": b"r%d" % i}))
    return path


SMALL_SPEC = {
    "id": recflow.FixedLenFeature([], "int64"),
    "x": recflow.FixedLenFeature([2], "float32"),
    "name": recflow.FixedLenFeature([], "bytes"),
}
