"""recflow.Dataset in Python: what it yields (checked against `recflow cat
--json`), zero-copy arrays, save/restore across processes, the built-in
maps, Python functions, Ctrl-C, and the errors bad inputs raise."""

import json
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import recflow
from conftest import MNIST, MNIST_SPEC, SMALL_SPEC, write_records


def test_batches_equal_recflow_cat_json(recflow_bin):
    out = subprocess.run([recflow_bin, "cat", "--json", str(MNIST)],
                         check=True, capture_output=True, text=True).stdout
    want_x, want_y = [], []
    for line in out.splitlines():
        f = json.loads(line)["features"]["feature"]
        want_x.append(f["image_floats"]["floatList"]["value"])
        want_y.append(int(f["image_class"]["int64List"]["value"][0]))
    got_x, got_y = [], []
    for b in recflow.Dataset.from_tfrecords(MNIST).batch(128).parse(
            MNIST_SPEC):
        assert b["image_floats"].shape[1:] == (784,)
        got_x.append(b["image_floats"])
        got_y.append(b["image_class"])
    np.testing.assert_array_equal(np.concatenate(got_x),
                                  np.array(want_x, np.float32))
    np.testing.assert_array_equal(np.concatenate(got_y), want_y)


def test_arrays_are_read_only_zero_copy_and_dlpack():
    b = next(iter(recflow.Dataset.from_tfrecords(MNIST).batch(32).parse(
        MNIST_SPEC)))
    x = b["image_floats"]
    assert isinstance(x, recflow.Array) and isinstance(x, np.ndarray)
    assert not x.flags.writeable
    with pytest.raises(ValueError):
        x[0, 0] = 1
    t = torch.from_dlpack(x)
    assert t.data_ptr() == x.ctypes.data  # the same memory, no copy
    assert t.shape == (32, 784) and t.dtype == torch.float32
    del b, x
    assert float(t.sum()) == float(t.sum())  # still alive after the batch
    s = x_view = None  # noqa: F841
    y = next(iter(recflow.Dataset.range(10).batch(10)))["value"]
    ty = torch.from_dlpack(y[2:8:2])  # a strided view exports too
    assert ty.tolist() == [2, 4, 6]


def test_arrays_python_functions_return_are_copied_unless_immutable():
    # A map or generator that fills one buffer again for each element (or
    # returns a read-only view of it) gives each element its own values,
    # batched, buffered or kept, as tf.data copies a py_function's result.
    buf = np.zeros(3, np.float32)

    def fill(e):
        buf[:] = e["value"]
        return {"x": buf}

    def fill_read_only_view(e):
        buf[:] = e["value"]
        view = buf.view()
        view.flags.writeable = False
        return {"x": view}

    def fill_ragged(e):
        buf[:] = e["value"]
        return {"r": recflow.Ragged(buf, [1, 2])}

    def generate():
        for v in range(4):
            buf[:] = v
            yield {"x": buf}

    def scan(state, e):
        buf[:] = e["value"]
        return state, {"x": buf}

    want = [[float(v)] * 3 for v in range(4)]
    for ds in (recflow.Dataset.range(4).map(fill),
               recflow.Dataset.range(4).map(fill_read_only_view),
               recflow.Dataset.from_generator(generate),
               recflow.Dataset.range(4).scan({"s": np.zeros(1)}, scan)):
        assert [x.tolist() for b in ds.batch(2) for x in b["x"]] == want
        assert [e["x"].tolist() for e in ds.prefetch(4)] == want
        kept = [e["x"] for e in ds]
        assert [x.tolist() for x in kept] == want
    ragged = [e["r"].values.tolist()
              for e in recflow.Dataset.range(2).map(fill_ragged)]
    assert ragged == [[0.0] * 3, [1.0] * 3]
    # A map that returns its input's arrays (a recflow tensor's memory,
    # which nothing changes) passes them on without a copy.
    a = np.arange(6, dtype=np.float32)
    x = next(iter(recflow.Dataset.from_tensors({"x": a}).map(lambda e: e)))
    assert x["x"].ctypes.data == a.ctypes.data
    assert x["x"].tolist() == a.tolist()


def test_save_and_restore_continue_exactly_in_another_process(tmp_path):
    path = write_records(tmp_path / "d.tfrecord", 500)
    program = textwrap.dedent(f"""
        import sys, recflow
        from conftest import SMALL_SPEC
        ds = (recflow.Dataset.from_tfrecords({str(path)!r})
              .shuffle(64, seed=5).repeat(2).batch(16).parse(SMALL_SPEC))
        if sys.argv[1] == "save":
            it = ds.iterator(threads=2)
            for _ in range(7):
                next(it)
            sys.stdout.buffer.write(it.save())
        else:
            state = sys.stdin.buffer.read()
            it = ds.restore(state, threads=1)
            print(",".join(str(v) for b in it for v in b["id"].tolist()))
    """)
    env_dir = str(tmp_path)
    (tmp_path / "prog.py").write_text(program)
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    state = subprocess.run([sys.executable, "prog.py", "save"], cwd=env_dir,
                           env=env, check=True, capture_output=True).stdout
    rest = subprocess.run([sys.executable, "prog.py", "restore"],
                          cwd=env_dir, env=env, input=state, check=True,
                          capture_output=True).stdout.decode().strip()
    ds = (recflow.Dataset.from_tfrecords(str(path)).shuffle(64, seed=5)
          .repeat(2).batch(16).parse(SMALL_SPEC))
    everything = [v for b in ds for v in b["id"].tolist()]
    assert [int(v) for v in rest.split(",")] == everything[7 * 16:]


def test_same_seed_same_order_whatever_the_threads(tmp_path):
    path = write_records(tmp_path / "o.tfrecord", 300)
    ds = (recflow.Dataset.from_tfrecords(str(path)).shuffle(100, seed=9)
          .batch(32).parse(SMALL_SPEC, num_parallel_calls=-1))
    orders = [[v for b in ds.iterator(threads=t) for v in b["id"].tolist()]
              for t in (1, 2, 4)]
    assert orders[0] == orders[1] == orders[2]
    assert sorted(orders[0]) == list(range(300))
    assert orders[0] != list(range(300))


def test_global_shuffle_reads_every_record_once(tmp_path):
    paths = [str(write_records(tmp_path / f"g{i}.tfrecord", 40, index=True))
             for i in range(3)]
    ds = (recflow.Dataset.from_tfrecords(paths).global_shuffle(seed=1)
          .parse(SMALL_SPEC))
    names = [e["name"] for e in ds]
    assert sorted(names) == sorted(b"r%d" % i for i in range(40)
                                   for _ in range(3))
    assert names != sorted(names)
    with pytest.raises(ValueError, match="from_tfrecords"):
        recflow.Dataset.from_tfrecords(paths).batch(2).global_shuffle()


def test_block_length_and_a_batched_global_shuffle(tmp_path):
    paths = [str(write_records(tmp_path / f"b{i}.tfrecord", 10, index=True))
             for i in range(2)]
    ds = (recflow.Dataset.from_tfrecords(paths, num_parallel_reads=2,
                                         block_length=3).parse(SMALL_SPEC))
    assert [int(e["id"]) for e in ds] == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5,
                                          6, 7, 8, 6, 7, 8, 9, 9]
    # Batched and parsed, the global shuffle runs fused (read by the parse
    # calls): still every record once.
    batched = (recflow.Dataset.from_tfrecords(paths).global_shuffle(seed=2)
               .batch(4).parse(SMALL_SPEC, num_parallel_calls=-1))
    ids = [i for b in batched.iterator(threads=2) for i in b["id"].tolist()]
    assert sorted(ids) == sorted(list(range(10)) * 2)
    assert ids != sorted(ids)


def test_parallel_reads_feed_a_python_map_in_turn_or_out_of_turn(tmp_path):
    # Unfused (a Python map between the files and the parse), each open
    # file is read on a thread of its own; gzipped and plain files mixed.
    paths = [str(write_records(tmp_path / f"p{i}.tfrecord.gz", 20 + 5 * i,
                               compression="GZIP")) for i in range(2)]
    paths.append(str(write_records(tmp_path / "p2.tfrecord", 30)))

    def read(deterministic):
        ds = (recflow.Dataset.from_tfrecords(
            paths, num_parallel_reads=2, deterministic=deterministic)
              .map(lambda e: {"record": e["record"]})
              .parse(SMALL_SPEC))
        return [(e["name"], int(e["id"])) for e in ds]

    in_turn = read(True)
    # Files 0 and 1 in turn, then file 2 in file 0's slot.
    assert [i for _, i in in_turn[:6]] == [0, 0, 1, 1, 2, 2]
    assert len(in_turn) == 20 + 25 + 30
    assert read(True) == in_turn
    out_of_turn = read(False)
    assert sorted(out_of_turn) == sorted(in_turn)

    # Batched and parsed by one call (fused: reader tasks read the files
    # ahead), the same records in the same order, and in and out of turn
    # each once; optimize=False runs the stages one by one.
    def batched(deterministic, optimize):
        ds = (recflow.Dataset.from_tfrecords(
            paths, num_parallel_reads=2, deterministic=deterministic)
              .batch(4).parse(SMALL_SPEC))
        return [(n, int(i)) for b in ds.iterator(threads=1, optimize=optimize)
                for n, i in zip(b["name"].tolist(), b["id"].tolist())]

    assert batched(True, True) == in_turn
    assert batched(True, False) == in_turn
    assert sorted(batched(False, True)) == sorted(in_turn)


def test_a_shuffle_buffer_per_file(tmp_path):
    paths = [str(write_records(tmp_path / f"s{i}.tfrecord", 30))
             for i in range(2)]

    def ids(threads, **kw):
        ds = (recflow.Dataset.from_tfrecords(
            paths, num_parallel_reads=2, seed=3, shuffle_buffer_per_file=8,
            **kw).batch(7).parse(SMALL_SPEC, num_parallel_calls=-1))
        return [i for b in ds.iterator(threads=threads)
                for i in b["id"].tolist()]

    one = ids(1)
    # Each file's records shuffled among themselves, the files in turn;
    # the same order at every thread count.
    assert one != [i for i in range(30) for _ in range(2)]
    assert sorted(one[0::2]) == list(range(30))
    assert sorted(one[1::2]) == list(range(30))
    assert ids(2) == one
    with pytest.raises(ValueError, match="shuffle_buffer_per_file"):
        recflow.Dataset.from_tfrecords(paths, shuffle_buffer_per_file=-1)
    with pytest.raises(ValueError, match="shuffle_buffer_per_file"):
        recflow.Dataset.from_tfrecords(
            paths, shuffle_buffer_per_file=8).global_shuffle()


def test_builtin_maps_decode_raw_scale_cast(tmp_path):
    images = np.arange(6 * 4, dtype=np.uint8).reshape(6, 2, 2)
    path = tmp_path / "img.tfrecord"
    with recflow.TFRecordWriter(str(path)) as w:
        for i, img in enumerate(images):
            w.write(recflow.Example({"image": img.tobytes(), "label": i}))
    spec = {"image": recflow.FixedLenFeature([], "bytes"),
            "label": recflow.FixedLenFeature([], "int64")}
    parsed = recflow.Dataset.from_tfrecords(str(path)).batch(6).parse(spec)
    ds = (parsed.map(recflow.maps.decode_raw("image", "uint8", [2, -1]))
          .map(recflow.maps.cast("label", np.int32)))
    b = next(iter(ds))
    np.testing.assert_array_equal(b["image"], images)
    assert b["label"].dtype == np.int32
    s = next(iter(ds.map(recflow.maps.scale("image", 1 / 255),
                         num_parallel_calls=-1)))
    np.testing.assert_allclose(s["image"], images / 255, rtol=1e-6)
    only = next(iter(ds.map(recflow.maps.select(["label"]))))
    assert list(only) == ["label"]
    with pytest.raises(ValueError, match="shape"):
        next(iter(parsed.map(recflow.maps.decode_raw("image", "float32",
                                                     [3]))))
    with pytest.raises(ValueError, match="no component 'nope'"):
        next(iter(ds.map(recflow.maps.cast("nope", "int64"))))


def test_python_functions_in_the_pipeline():
    ds = recflow.Dataset.from_tensor_slices(
        {"x": np.arange(20, dtype=np.int64),
         "w": np.linspace(0, 1, 20).astype(np.float32)})
    doubled = ds.map(lambda e: {"x": e["x"] * 2, "w": e["w"]},
                     num_parallel_calls=2)
    kept = doubled.filter(lambda e: e["x"] % 4 == 0).batch(100)
    b = next(iter(kept))
    assert b["x"].tolist() == list(range(0, 40, 4))
    inter = recflow.Dataset.range(3).interleave(
        lambda e: recflow.Dataset.range(int(e["value"]) * 10,
                                        int(e["value"]) * 10 + 2),
        cycle_length=3)
    assert [int(e["value"]) for e in inter] == [0, 10, 20, 1, 11, 21]
    # Read ahead on threads of their own (Python maps inside them take the
    # GIL there): the same order.
    parallel = recflow.Dataset.range(5).interleave(
        lambda e: recflow.Dataset.range(int(e["value"]) * 10,
                                        int(e["value"]) * 10 + 3).map(
            lambda x: {"value": x["value"] + 1}),
        cycle_length=3, block_length=2, num_parallel_calls=2,
        buffer_output_elements=1)
    assert [int(e["value"]) for e in parallel] == [
        1, 2, 11, 12, 21, 22, 3, 13, 23, 31, 32, 41, 42, 33, 43]
    unordered = recflow.Dataset.range(5).interleave(
        lambda e: recflow.Dataset.range(int(e["value"]) * 10,
                                        int(e["value"]) * 10 + 3),
        cycle_length=3, num_parallel_calls=recflow.AUTOTUNE,
        deterministic=False)
    assert sorted(int(e["value"]) for e in unordered) == [
        v * 10 + j for v in range(5) for j in range(3)]
    with pytest.raises(ValueError, match="num_parallel_calls"):
        recflow.Dataset.range(2).interleave(
            lambda e: recflow.Dataset.range(1), cycle_length=2,
            num_parallel_calls=0)

    def gen():
        for i in range(5):
            yield {"i": i, "name": f"n{i}"}
    g = list(recflow.Dataset.from_generator(gen).repeat(2))
    assert [int(e["i"]) for e in g] == [0, 1, 2, 3, 4] * 2
    assert g[1]["name"] == b"n1"


def test_errors_of_python_functions_keep_their_type():
    ds = recflow.Dataset.range(5).map(lambda e: {"v": 1 // 0})
    with pytest.raises(ZeroDivisionError):
        list(ds)
    with pytest.raises(TypeError, match="dict of arrays"):
        list(recflow.Dataset.range(5).map(lambda e: 3))
    with pytest.raises(TypeError, match="recflow.Dataset"):
        list(recflow.Dataset.range(2).interleave(lambda e: [1],
                                                 cycle_length=1))


def test_var_len_features_become_ragged(tmp_path):
    path = tmp_path / "v.tfrecord"
    rows = [[1], [], [2, 3, 4]]
    with recflow.TFRecordWriter(str(path)) as w:
        for r in rows:
            w.write(recflow.Example({"v": np.array(r, np.int64)}))
    b = next(iter(recflow.Dataset.from_tfrecords(str(path)).batch(3).parse(
        {"v": recflow.VarLenFeature("int64")})))
    assert isinstance(b["v"], recflow.Ragged)
    assert b["v"].to_list() == rows
    assert b["v"].row_lengths.tolist() == [1, 0, 3]


def test_ragged_refuses_lengths_that_are_no_row_lengths():
    values = np.arange(5)
    with pytest.raises(ValueError, match="row 1 has length -1"):
        recflow.Ragged(values, [6, -1])
    with pytest.raises(TypeError, match="vector of integers"):
        recflow.Ragged(values, [2.5, 2.5])  # not cut to [2, 2]
    with pytest.raises(TypeError, match="vector of integers"):
        recflow.Ragged(values, [[2], [3]])
    assert recflow.Ragged(values, np.array([2, 3], np.uint8)).to_list() == [
        [0, 1], [2, 3, 4]]


def test_python_values_are_never_coerced_or_wrapped():
    slices = recflow.Dataset.from_tensor_slices
    with pytest.raises(TypeError, match=r"\['a'\].*only bytes or str, not int"):
        slices({"a": [1, "x"]})  # numpy would make it ["1", "x"]
    with pytest.raises(ValueError, match=r"\['a'\]: 9223372036854775808 is "
                       "outside int64"):
        slices({"a": [2**63]})
    gen = recflow.Dataset.from_generator(lambda: iter([{"a": 2**64}]))
    with pytest.raises(ValueError, match="outside int64"):
        list(gen)
    assert [e["a"].tolist() for e in slices({"a": [2**63 - 1, -2**63]})] == [
        2**63 - 1, -2**63]


def test_padded_batch_and_threads_refuse_what_would_be_ignored():
    ds = recflow.Dataset.range(3)
    with pytest.raises(ValueError, match="padded_shapes names 'valu', which "
                       r"the elements lack \(they have: value\)"):
        list(ds.padded_batch(2, padded_shapes={"valu": []}))
    for call in (lambda: ds.iterator(threads=-1),
                 lambda: ds.restore(ds.iterator().save(), threads=-2),
                 lambda: recflow.count(MNIST, threads=-1),
                 lambda: recflow.verify(MNIST, threads=-1)):
        with pytest.raises(ValueError, match="threads must be 0 .every "
                           "core. or positive"):
            call()


def test_feature_dtypes_and_defaults_are_taken_exactly():
    # np.uint8 was read as int64 and np.complex64 as bytes; a shape of 2.5
    # as 2; numpy defaults could not be written into the JSON spec.
    for dtype in (np.uint8, np.float64, np.complex64, bool):
        with pytest.raises(TypeError, match="float32, int64 or bytes"):
            recflow.FixedLenFeature([], dtype)
    with pytest.raises(TypeError):
        recflow.FixedLenFeature([2.5], "int64")
    with pytest.raises(ValueError, match="UTF-8"):
        recflow.FixedLenFeature([], "bytes", default_value=b"\xff")
    spec = recflow.FeatureSpec({
        "a": recflow.FixedLenFeature([2, 2], np.int64,
                                     default_value=np.arange(4)),
        "b": recflow.FixedLenFeature([np.int64(2)], float,
                                     default_value=np.float32(0.5)),
        "c": recflow.VarLenFeature(str)}).to_dict()["features"]
    assert spec["a"]["default"] == [0, 1, 2, 3]
    assert spec["b"] == {"kind": "fixed", "dtype": "float32", "shape": [2],
                         "default": 0.5}
    assert spec["c"]["dtype"] == "bytes"


def test_cast_refuses_values_outside_the_target_dtype():
    ds = recflow.Dataset.from_tensor_slices(
        {"x": np.array([1.5, 300.0], np.float32)})
    with pytest.raises(ValueError, match="value 300 .* outside uint8's range"):
        list(ds.map(recflow.maps.cast("x", "uint8")))
    assert [e["x"].item() for e in ds.map(recflow.maps.cast("x", "int32"))] \
        == [1, 300]


def test_seeds_take_tensorflows_int64_range_and_uint64():
    def order(seed):
        return [int(e["value"]) for e in
                recflow.Dataset.range(8).shuffle(8, seed=seed)]
    # A negative seed (valid in TensorFlow) is its two's complement; it was
    # an opaque "incompatible function arguments" TypeError.
    assert order(-1) == order(2**64 - 1)
    assert order(np.int64(5)) == order(5)
    for bad, error in ((2**64, ValueError), (-2**63 - 1, ValueError),
                       (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="seed"):
            order(bad)


def test_bad_specs_and_files_raise_value_errors(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        recflow.FeatureSpec({"x": {"kind": "fixed", "dtype": "complex",
                                   "shape": []}})
    missing = recflow.Dataset.from_tfrecords(MNIST).batch(4).parse(
        {"nope": recflow.FixedLenFeature([], "int64")})
    with pytest.raises(ValueError, match="nope.*required"):
        next(iter(missing))
    bad = tmp_path / "bad.tfrecord"
    write_records(bad, 5)
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(recflow.RecordError, match="bad.tfrecord"):
        list(recflow.Dataset.from_tfrecords(str(bad)))
    assert len(list(recflow.Dataset.from_tfrecords(str(bad)).parse(
        SMALL_SPEC).ignore_errors())) == 4
    with pytest.raises(FileNotFoundError):
        recflow.Dataset.from_tfrecords(str(tmp_path / "none-*.tfrecord"))
    with pytest.raises(TypeError):
        recflow.Dataset.from_tfrecords(MNIST).batch("many")
    with pytest.raises(TypeError):
        recflow.Dataset.from_tfrecords(MNIST).map(42)


def interrupt_when_ready(program, *args, timeout=60):
    """Runs `program` (python -c, with `args`), waits for its "ready" line
    and sends it SIGINT 0.5 s later; returns the rest of its stdout, its
    exit status and the seconds it took to end after the signal."""
    p = subprocess.Popen([sys.executable, "-c", program, *args],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    start = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=timeout)
    return out, p.returncode, time.monotonic() - start


# The slow step on the calling thread (a map of one call, a generator) and
# on the pipeline's threads (a parallel map, a filter after it).
@pytest.mark.parametrize("pipeline", [
    "recflow.Dataset.range(10).map(slow)",
    "recflow.Dataset.range(10).map(slow, num_parallel_calls=2)",
    "recflow.Dataset.from_generator(lambda: ({'x': slow(i)} for i in range(3)))",
    "recflow.Dataset.range(10).map(slow, num_parallel_calls=2)"
    ".filter(lambda e: True).prefetch(1)",
])
def test_ctrl_c_interrupts_a_waiting_iteration_promptly(pipeline):
    program = textwrap.dedent("""
        import sys, time, numpy, recflow
        def slow(e):
            time.sleep(30)
            return e
        ds = {pipeline}
        print("ready", flush=True)
        try:
            next(iter(ds))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """)
    program = program.replace("{pipeline}", pipeline)
    out, returncode, seconds = interrupt_when_ready(program)
    # The map's sleep holds its thread for 30 s; the iteration must not.
    assert out.strip() == "interrupted"
    assert returncode == 3
    assert seconds < 20


# A conversion runs with the GIL released; a Ctrl-C ends it at its next
# progress report (the typing pass of CSV or JSON Lines, on every core, or
# a chunk of rows or elements)
# instead of after its last row, and leaves no file (all shards or none;
# save() leaves the folder it made, empty).
@pytest.mark.parametrize("conversion", [
    "recflow.convert('csv', csvs, out + '/x', shards=2)",
    "recflow.convert('jsonl', jsonls, out + '/x', shards=2)",
    "recflow.Dataset.range(10**10).write_tfrecords(out + '/x', shards=2)",
    "recflow.Dataset.range(10**10).save(out + '/saved')",
])
def test_ctrl_c_ends_a_conversion_and_leaves_no_shards(tmp_path, conversion):
    program = textwrap.dedent("""
        import os, shutil, signal, sys, recflow
        # Python's own Ctrl-C, even where this was started with SIGINT
        # ignored (a shell's background job).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        work = sys.argv[1]
        out = os.path.join(work, 'out')
        os.makedirs(out)
        rows = '\\n'.join('%d,%d,row %d' % (i, 2 * i, i) for i in range(500000))
        with open(os.path.join(work, 'a.csv'), 'w') as f:
            f.write('id,v,s\\n' + rows + '\\n')
        csvs = [os.path.join(work, 'a.csv')]
        for i in range(15):
            csvs.append(os.path.join(work, 'c%d.csv' % i))
            shutil.copy(csvs[0], csvs[-1])
        jsonls = []
        if {jsonl}:  # 4M rows: the Ctrl-C comes in the typing pass
            jsonls.append(os.path.join(work, 'a.jsonl'))
            with open(jsonls[0], 'w') as f:
                f.write(''.join('{"id": %d, "v": %d, "s": "row %d"}\\n'
                                % (i, 2 * i, i) for i in range(500000)))
            for i in range(7):
                jsonls.append(os.path.join(work, 'j%d.jsonl' % i))
                shutil.copy(jsonls[0], jsonls[-1])
        print("ready", flush=True)
        try:
            {conversion}
        except KeyboardInterrupt:
            files = [f for _, _, fs in os.walk(out) for f in fs]
            print("interrupted", files, flush=True)
            sys.exit(3)
    """).replace("{conversion}", conversion).replace(
        "{jsonl}", str("jsonls" in conversion))
    out, returncode, seconds = interrupt_when_ready(program, str(tmp_path),
                                                    timeout=120)
    assert out.strip() == "interrupted []", out
    assert returncode == 3
    # 8M CSV rows take ~10 s here, the ranges without end.
    assert seconds < 5


def test_exit_right_after_an_interrupted_iteration_never_aborts():
    # The interrupted iterator is destroyed on a thread of its own, which
    # drops the generator's reference with the GIL while the program exits:
    # Python 3.11 ends such a thread with pthread_exit once finalization
    # has begun, which aborted ("terminate called without an active
    # exception", -6) about one exit in four before the module's atexit
    # gate.  Six exits: a regression fails this with ~80% odds per run.
    program = textwrap.dedent("""
        import sys, time, recflow
        def slow(e):
            time.sleep(30)
            return e
        ds = recflow.Dataset.from_generator(
            lambda: ({'x': slow(i)} for i in range(3)))
        print("ready", flush=True)
        try:
            next(iter(ds))
        except KeyboardInterrupt:
            sys.exit(3)
    """)
    for attempt in range(6):
        p = subprocess.Popen([sys.executable, "-c", program],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 3, (attempt, p.returncode, err[-500:])


@pytest.mark.parametrize("stage", [
    "map(slow, num_parallel_calls=2)",
    "filter(lambda e: slow(e) is e)",
    "interleave(lambda e: recflow.Dataset.range(2).map(slow), cycle_length=2)",
    "interleave(lambda e: recflow.Dataset.range(2).map(slow), cycle_length=2,"
    " num_parallel_calls=2)",
])
def test_exit_while_python_functions_run_on_pipeline_threads(stage):
    # The program ends while the pipeline's threads are inside Python
    # functions (or about to call one): they must finish or be refused,
    # never ask Python 3.11 for the GIL during finalization, whose
    # pthread_exit unwound through oneTBB's catch (...) and aborted the
    # process ("FATAL: exception not rethrown", -6) in about one exit in
    # three under load.  Four exits each.
    program = textwrap.dedent(f"""
        import time, recflow
        def slow(e):
            time.sleep(0.05)
            return e
        it = recflow.Dataset.range(1000).{stage}.prefetch(4).iterator(threads=2)
        next(it)
        print("ready", flush=True)
    """)
    for attempt in range(4):
        p = subprocess.Popen([sys.executable, "-c", program],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        out, err = p.communicate(timeout=60)
        assert out.strip() == "ready" and p.returncode == 0, (
            attempt, p.returncode, err[-500:])


def test_a_sigint_handler_of_the_program_leaves_the_iteration_alone():
    # The graceful stop of a training script: the handler sets a flag, the
    # loop finishes its batch, saves the position and stops; a new iterator
    # restored from it continues with the next element.
    program = textwrap.dedent("""
        import signal, time, recflow
        stop = []
        signal.signal(signal.SIGINT, lambda *a: stop.append(1))
        def slow(e):
            time.sleep(0.2)
            return e
        ds = recflow.Dataset.range(1000).map(slow, num_parallel_calls=2)
        it = ds.iterator(threads=2)
        seen = []
        for e in it:
            seen.append(int(e["value"]))
            if len(seen) == 1:
                print("ready", flush=True)
            if stop:
                break
        state = it.save()
        after = next(ds.restore(state))
        print(len(seen), seen == list(range(len(seen))),
              int(after["value"]) == len(seen), flush=True)
    """)
    out, returncode, _ = interrupt_when_ready(program)
    assert returncode == 0
    count, in_order, continues = out.split()
    assert 1 < int(count) < 1000
    assert in_order == "True" and continues == "True"


def test_csv_padded_batch_take_shard_cache_and_rename(tmp_path):
    """The parts of the API no other test reaches from Python, each against
    what tf.data gives for the same input."""
    csv = tmp_path / "a.csv"
    csv.write_text("id,score,name\n1,0.5,x\n2,1.5,yy\n3,2,zzz\n4,3.5,w\n")
    ds = recflow.Dataset.from_csv(str(csv), column_types={"score": "float32"},
                                  select_columns=["id", "score"])
    rows = [(int(r["id"]), float(r["score"])) for r in ds]
    assert rows == [(1, 0.5), (2, 1.5), (3, 2.0), (4, 3.5)]
    assert sorted(next(iter(ds)).keys()) == ["id", "score"]
    with pytest.raises(ValueError, match="has no column 'nope'"):
        recflow.Dataset.from_csv(str(csv), select_columns=["nope"])
    with pytest.raises(ValueError, match="one character"):
        recflow.Dataset.from_csv(str(csv), delimiter=";;")
    import gzip
    packed = tmp_path / "packed"  # no suffix: compression given
    packed.write_bytes(gzip.compress(csv.read_bytes()))
    assert [int(r["id"]) for r in recflow.Dataset.from_csv(
        str(packed), compression="gzip")] == [1, 2, 3, 4]
    (tmp_path / "a.csv.gz").write_bytes(packed.read_bytes())  # by its name
    assert [int(r["id"]) for r in recflow.Dataset.from_csv(
        str(tmp_path / "a.csv.gz"))] == [1, 2, 3, 4]

    # Shard then take: every 2nd row from the 2nd on, the first two of them.
    ids = [int(r["id"]) for r in
           recflow.Dataset.from_csv(str(csv)).shard(2, 1).take(2)]
    assert ids == [2, 4]
    # Two files, two shards: each shard one whole file.
    more = tmp_path / "b.csv"
    more.write_text("id,score,name\n5,4.5,v\n6,5,u\n")
    both = recflow.Dataset.from_csv([str(csv), str(more)])
    assert [int(r["id"]) for r in both.shard(2, 1)] == [5, 6]

    # Element i holds i values of i; padded to the longest, with -1.
    def values(n):
        return {"v": np.full(n, n, np.int64)}
    padded = recflow.Dataset.from_generator(
        lambda: (values(n) for n in range(1, 4))).padded_batch(
            3, padding_values={"v": -1})
    (batch,) = list(padded)
    np.testing.assert_array_equal(
        batch["v"], [[1, -1, -1], [2, 2, -1], [3, 3, 3]])
    with pytest.raises(ValueError, match="padding value 300 for 'v'"):
        list(recflow.Dataset.from_generator(
            lambda: (values(n) for n in range(1, 3))).map(
                recflow.maps.cast("v", "uint8")).padded_batch(
                    2, padding_values={"v": 300}))

    # A cache file: the second pass reads it, not the CSV.
    cached = recflow.Dataset.from_csv(str(csv)).cache(
        str(tmp_path / "cache")).map(recflow.maps.rename("id", "key"))
    first = [int(r["key"]) for r in cached]
    csv.write_text("id,score,name\n9,0,q\n")
    assert [int(r["key"]) for r in cached] == first == [1, 2, 3, 4]


def test_autotune_as_tf_data():
    # tf.data.AUTOTUNE's spelling and value, for map and prefetch.
    assert recflow.AUTOTUNE == -1
    ds = recflow.Dataset.range(500).batch(7)
    want = [b["value"].tolist() for b in ds]
    tuned = (ds.map(lambda b: b, num_parallel_calls=recflow.AUTOTUNE)
             .prefetch(recflow.AUTOTUNE))
    assert [b["value"].tolist() for b in tuned] == want
    it = tuned.iterator(threads=2)
    for _ in range(20):
        next(it)
    rest = recflow.Dataset.range(500).batch(7).map(
        lambda b: b, num_parallel_calls=recflow.AUTOTUNE).prefetch(
            recflow.AUTOTUNE).restore(it.save())
    assert [b["value"].tolist() for b in rest] == want[20:]
    with pytest.raises(ValueError, match="positive, or -1 to autotune"):
        ds.prefetch(0)
    # TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    tuned = recflow.Dataset.from_tfrecords(
        [str(MNIST), str(MNIST)], num_parallel_reads=recflow.AUTOTUNE)
    assert sum(1 for _ in tuned) == 2000
    # interleave's cycle_length defaults to AUTOTUNE, as tf.data's.
    flat = recflow.Dataset.range(4).interleave(
        lambda e: recflow.Dataset.range(int(e["value"])))
    assert sorted(int(e["value"]) for e in flat) == [0, 0, 0, 1, 1, 2]


def test_stats_count_the_takes_that_woke_a_prefetch_driver():
    # Each stage's counters; an asynchronous stage's `buffered` and
    # `wakes`. A take from a full buffer (its driver asleep once full)
    # wakes the driver: a system call on the consumer's thread.
    it = recflow.Dataset.range(20).prefetch(3).iterator()
    next(it)

    def prefetch():
        return next(s for s in it.stats() if s["buffered"] >= 0)

    for _ in range(5):
        deadline = time.monotonic() + 10
        while prefetch()["buffered"] < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert prefetch()["buffered"] == 3
        before = prefetch()["wakes"]
        next(it)
        assert prefetch()["wakes"] == before + 1
    assert all(s["wakes"] == 0 for s in it.stats() if s["buffered"] < 0)


def test_zip_concatenate_enumerate_as_tf_data(tmp_path):
    D = recflow.Dataset
    a = D.range(3)
    b = D.range(10, 15).map(lambda e: {"b": e["value"]})
    for zipped in (D.zip(a, b), D.zip((a, b)), D.zip([a, b])):
        assert [(int(e["value"]), int(e["b"])) for e in zipped] == [
            (0, 10), (1, 11), (2, 12)]
    with pytest.raises(TypeError, match="not int"):
        D.zip(a, 3)
    with pytest.raises(ValueError, match="component 'value'"):
        list(D.zip(a, a))
    assert [int(e["value"]) for e in a.concatenate(D.range(7, 9))] == [
        0, 1, 2, 7, 8]
    # flat_map: tf.data's example (each dataset in turn).
    flat = D.range(1, 4).flat_map(lambda x: D.range(int(x["value"])))
    assert [int(x["value"]) for x in flat] == [0, 0, 1, 0, 1, 2]
    with pytest.raises(TypeError, match="flat_map's function must return"):
        list(D.range(2).flat_map(lambda x: 3))
    e = list(D.range(5, 8).enumerate(start=5, name="i"))
    assert [(int(x["i"]), int(x["value"])) for x in e] == [
        (5, 5), (6, 6), (7, 7)]
    # Resumable, from a state saved halfway through the second input.
    ds = (D.range(0, 4).concatenate(D.range(100, 104))
          .enumerate().batch(3))
    it = ds.iterator()
    next(it), next(it)
    rest = [b["value"].tolist() for b in ds.restore(it.save())]
    assert rest == [[102, 103]]


def test_sample_and_choose_from_datasets_as_tf_data():
    D = recflow.Dataset
    # tf.data's example: every element of both, each input in its order.
    sample = D.sample_from_datasets([D.range(0, 3), D.range(100, 103)],
                                    weights=[0.5, 0.5], seed=4)
    got = [int(e["value"]) for e in sample]
    assert sorted(got) == [0, 1, 2, 100, 101, 102]
    assert [v for v in got if v < 100] == [0, 1, 2]
    assert [v for v in got if v >= 100] == [100, 101, 102]
    # Weights (numpy too): 1 in 5 from the first, within 5 deviations.
    many = D.sample_from_datasets(
        (D.range(0, 10).repeat(), D.range(100, 110).repeat()),
        weights=np.array([1.0, 4.0]), seed=np.int64(-3)).take(5000)
    first = sum(1 for e in many if int(e["value"]) < 100)
    assert abs(first - 1000) < 5 * (5000 * 0.2 * 0.8) ** 0.5
    # A seed gives one stream; stop_on_empty_dataset ends at an ended one.
    again = D.sample_from_datasets([D.range(0, 3), D.range(100, 103)],
                                   weights=[0.5, 0.5], seed=4)
    assert [int(e["value"]) for e in again] == got
    stopped = D.sample_from_datasets([D.range(0, 2), D.range(100, 150)],
                                     seed=1, stop_on_empty_dataset=True)
    assert len(list(stopped)) < 52
    assert "rerandomize_each_iteration=false" in stopped.describe()
    with pytest.raises(ValueError, match="1 weights for 2 datasets"):
        D.sample_from_datasets([D.range(2), D.range(2)], weights=[1.0])
    with pytest.raises(ValueError, match="weight 0 is -1"):
        D.sample_from_datasets([D.range(2), D.range(2)], weights=[-1, 1])
    with pytest.raises(TypeError, match="sequence of recflow.Datasets, not"):
        D.sample_from_datasets(D.range(2))
    with pytest.raises(TypeError, match="takes recflow.Datasets, not int"):
        D.sample_from_datasets([D.range(2), 3])
    # choose_from_datasets: tf.data's example.
    three = [D.range(10, 20), D.range(20, 30), D.range(30, 40)]
    chosen = D.choose_from_datasets(three, D.range(3).repeat(3))
    assert [int(e["value"]) for e in chosen] == [
        10, 20, 30, 11, 21, 31, 12, 22, 32]
    with pytest.raises(ValueError, match=r"choice 3 is 3, not in \[0, 3\)"):
        list(D.choose_from_datasets(three, D.range(5)))
    skipped = D.choose_from_datasets(
        [D.range(0, 1), D.range(10, 12)],
        D.from_tensor_slices({"c": np.array([0, 0, 1, 0, 1])}),
        stop_on_empty_dataset=False)
    assert [int(e["value"]) for e in skipped] == [0, 10, 11]
    # Resumable: restored mid-stream, the rest as uninterrupted.
    ds = D.sample_from_datasets(
        [D.range(0, 20).shuffle(5, seed=2), D.range(100, 120)],
        seed=8).batch(3)
    full = [b["value"].tolist() for b in ds]
    it = ds.iterator()
    for _ in range(4):
        next(it)
    assert [b["value"].tolist() for b in ds.restore(it.save())] == full[4:]



def test_mixtures_of_tfrecord_files_batched_and_parsed(tmp_path):
    D = recflow.Dataset
    a = D.from_tfrecords(str(write_records(tmp_path / "a.tfrecord", 7)))
    b = D.from_tfrecords(str(write_records(tmp_path / "b.tfrecord", 12)))

    def ids(ds, optimize):
        return [int(i) for batch in ds.batch(4).parse(SMALL_SPEC).iterator(
                    threads=2, optimize=optimize) for i in batch["id"]]

    # Run fused (optimize=True) or stage by stage, the same records in the
    # same order: round robin, then b's rest once a has ended.
    chosen = D.choose_from_datasets([a, b], D.range(0, 2).repeat(),
                                    stop_on_empty_dataset=False)
    want = [x for i in range(7) for x in (i, i)] + list(range(7, 12))
    assert ids(chosen, True) == want
    assert ids(chosen, False) == want
    sampled = D.sample_from_datasets([a, b.shuffle(5, seed=1)], seed=2)
    assert ids(sampled, True) == ids(sampled, False)
    assert sorted(ids(sampled, True)) == sorted(list(range(7)) +
                                                list(range(12)))
    # A global shuffle among the inputs too.
    c = D.from_tfrecords(
        str(write_records(tmp_path / "c.tfrecord", 9, index=True))
    ).global_shuffle(seed=3)
    mixed = D.sample_from_datasets([c, a], seed=4)
    assert ids(mixed, True) == ids(mixed, False)
    assert sorted(ids(mixed, True)) == sorted(list(range(9)) +
                                              list(range(7)))

def test_bucket_by_sequence_length_as_tf_data():
    D = recflow.Dataset
    seqs = [[0], [1, 2, 3, 4], [5, 6, 7], [7, 8, 9, 10, 11],
            [13, 14, 15, 16, 19, 20], [21, 22]]

    def elements():
        return D.from_generator(
            lambda: ({"x": np.array(s, np.int64)} for s in seqs))

    # tf.data's example, by a function and by the entry's name.
    want = [[[1, 2, 3, 4], [5, 6, 7, 0]],
            [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]],
            [[0, 0], [21, 22]]]
    for length in (lambda e: len(e["x"]), "x"):
        ds = elements().bucket_by_sequence_length(length, [3, 5], [2, 2, 2])
        assert [b["x"].tolist() for b in ds] == want
    padded = elements().bucket_by_sequence_length(
        "x", [3, 7], [2, 2, 2], padded_shapes={"x": [-1]},
        padding_values={"x": -1}, pad_to_bucket_boundary=True)
    assert [b["x"].shape for b in padded] == [(2, 6), (2, 6), (2, 2)]
    with pytest.raises(ValueError, match="2 batch sizes for 2 boundaries"):
        elements().bucket_by_sequence_length("x", [3, 5], [2, 2])
    with pytest.raises(TypeError, match="must return an int, not str"):
        list(elements().bucket_by_sequence_length(lambda e: "3", [3], [2, 2]))
    with pytest.raises(TypeError, match="a function of the element or"):
        elements().bucket_by_sequence_length(3, [3], [2, 2])
    # Resumable with elements waiting in the buckets.
    ds = elements().repeat(3).bucket_by_sequence_length("x", [3, 5], [2, 3, 2])
    full = [b["x"].tolist() for b in ds]
    it = ds.iterator()
    next(it), next(it)
    assert [b["x"].tolist() for b in ds.restore(it.save())] == full[2:]


def test_cardinality_and_len_as_tf_data(tmp_path):
    D = recflow.Dataset
    assert D.range(10).batch(4).cardinality() == 3
    assert len(D.range(10).batch(4, drop_remainder=True)) == 2
    assert len(D.range(10).repeat(3).shard(4, 1)) == 8
    assert D.range(10).repeat().cardinality() == recflow.INFINITE_CARDINALITY
    assert (D.range(10).filter(lambda e: True).cardinality()
            == recflow.UNKNOWN_CARDINALITY)
    with pytest.raises(TypeError, match="The dataset is infinite."):
        len(D.range(3).repeat())
    with pytest.raises(TypeError, match="The dataset length is unknown."):
        len(D.range(3).filter(lambda e: True))
    # Always true, whatever its length; list() takes the unknown in stride.
    assert D.range(0) and D.range(3).filter(lambda e: True)
    assert len(list(D.range(5).filter(lambda e: int(e["value"]) % 2))) == 2
    path = str(tmp_path / "a.tfrecord")
    with recflow.TFRecordWriter(path) as w:
        for i in range(6):
            w.write(b"%d" % i)
    assert (D.from_tfrecords(path).cardinality()
            == recflow.UNKNOWN_CARDINALITY)
    assert len(D.from_tfrecords(path).global_shuffle(seed=1).batch(4)) == 2


def test_ragged_batch_as_tf_data():
    D = recflow.Dataset
    ds = D.range(6).map(lambda e: {"r": np.arange(int(e["value"])),
                                   "n": e["value"]})
    batches = list(ds.ragged_batch(2))
    assert [b["r"].to_list() for b in batches] == [
        [[], [0]], [[0, 1], [0, 1, 2]], [[0, 1, 2, 3], [0, 1, 2, 3, 4]]]
    assert isinstance(batches[0]["r"], recflow.Ragged)
    assert batches[2]["n"].tolist() == [4, 5]
    assert len(ds.ragged_batch(4, drop_remainder=True)) == 1
    with pytest.raises(ValueError, match="only the first dimension may"):
        list(D.range(3).map(lambda e: {"m": np.zeros(
            (2, int(e["value"])))}).ragged_batch(3))


def test_window_take_while_and_scan_as_tf_data():
    D = recflow.Dataset
    # tf.data's documented windows of range(7), each batched.
    assert [w["value"].tolist() for w in D.range(7).window(3)] == [
        [0, 1, 2], [3, 4, 5], [6]]
    assert [w["value"].tolist() for w in D.range(7).window(
        3, shift=1, stride=2, drop_remainder=True)] == [
        [0, 2, 4], [1, 3, 5], [2, 4, 6]]
    assert len(D.range(7).window(3, shift=1)) == 7
    with pytest.raises(ValueError, match="shift must be positive"):
        D.range(7).window(3, shift=0)
    with pytest.raises(ValueError, match="size must be positive, not 0"):
        D.range(7).window(0)
    # take_while ends at the first element the predicate rejects.
    dip = D.from_tensor_slices({"v": np.array([1, 2, 9, 3, 4], np.int64)})
    assert [int(e["v"]) for e in dip.take_while(lambda e: e["v"] < 5)] == [
        1, 2]
    assert dip.take_while(lambda e: True).cardinality() == (
        recflow.UNKNOWN_CARDINALITY)
    # tf.data's running sum, resumed in the middle.
    sums = D.range(10).scan({"sum": np.int64(0)}, lambda s, e: (
        {"sum": s["sum"] + e["value"]}, {"sum": s["sum"] + e["value"]}))
    want = [0, 1, 3, 6, 10, 15, 21, 28, 36, 45]
    assert [int(e["sum"]) for e in sums] == want
    it = sums.iterator()
    for _ in range(4):
        next(it)
    assert [int(e["sum"]) for e in sums.restore(it.save())] == want[4:]
    with pytest.raises(TypeError, match="must return a tuple"):
        list(D.range(3).scan({"s": 0}, lambda s, e: s))
    with pytest.raises(ValueError, match="keep the state's names and dtypes"):
        list(D.range(3).scan({"s": np.int64(0)}, lambda s, e: (
            {"s": np.float32(1)}, e)))


def test_from_tensors_and_unique_as_tf_data():
    D = recflow.Dataset
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    one = D.from_tensors({"x": x, "label": np.int64(4)})
    assert len(one) == 1
    (e,) = list(one)
    assert e["x"].tolist() == x.tolist() and int(e["label"]) == 4
    assert len(list(one.repeat(3))) == 3
    ids = D.from_tensor_slices({"id": np.array([1, 37, 2, 37, 2, 1])})
    assert [int(e["id"]) for e in ids.unique()] == [1, 37, 2]
    words = D.from_tensor_slices({"w": np.array([b"a", b"b", b"a"],
                                                dtype=object)})
    assert [bytes(e["w"]) for e in words.unique()] == [b"a", b"b"]
    with pytest.raises(ValueError, match="component 'f' is float32"):
        list(D.from_tensor_slices(
            {"f": np.zeros(2, np.float32)}).unique())


def test_group_by_window_as_tf_data():
    D = recflow.Dataset
    # tf.data's example: range(10) by parity, windows of 5, each batched.
    ds = D.range(10).group_by_window(lambda e: int(e["value"]) % 2, 5)
    assert [b["value"].tolist() for b in ds] == [
        [0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    # By an integer entry; each key its own window size; the groups left
    # at the end in key order.
    labelled = D.from_tensor_slices({
        "label": np.array([2, 1, 2, 1, 1, 2, 0], np.int64),
        "x": np.arange(7, dtype=np.float32)})
    out = labelled.group_by_window(
        "label", window_size_func=lambda key: key + 1)
    assert [b["x"].tolist() for b in out] == [
        [1.0, 3.0], [0.0, 2.0, 5.0], [6.0], [4.0]]
    assert [b["x"].tolist() for b in labelled.group_by_window(
        "label", 2, drop_remainder=True)] == [[0.0, 2.0], [1.0, 3.0]]
    with pytest.raises(ValueError, match="one of window_size and"):
        labelled.group_by_window("label")
    with pytest.raises(TypeError, match="key_func must return an int"):
        list(labelled.group_by_window(lambda e: "a", 2))
    # Resumable with groups waiting.
    ds = D.range(40).group_by_window(lambda e: int(e["value"]) % 3, 4)
    full = [b["value"].tolist() for b in ds]
    it = ds.iterator()
    next(it), next(it)
    assert [b["value"].tolist() for b in ds.restore(it.save())] == full[2:]


def test_write_tfrecords_round_trips_a_pipeline(tmp_path):
    D = recflow.Dataset
    ds = D.range(300).map(lambda e: {
        "x": np.full(3, int(e["value"]) / 2, np.float32),
        "label": e["value"] % 7,
        "name": np.array([b"n%d" % int(e["value"])], dtype=object)})
    out = str(tmp_path / "out" / "part")
    (tmp_path / "out").mkdir()
    s = ds.write_tfrecords(out, shards=2, index=True, compression="zstd")
    assert s["records"] == 300 and len(s["shards"]) == 2
    assert s["shards"][1]["path"].endswith("part-00001-of-00002.tfrecord.zst")
    assert all((tmp_path / "out" / (r["path"].split("/")[-1] + ".idx"))
               .exists() for r in s["shards"])
    spec = {"x": recflow.FixedLenFeature([3], "float32"),
            "label": recflow.FixedLenFeature([], "int64"),
            "name": recflow.FixedLenFeature([], "bytes")}
    back = list(D.from_tfrecords([r["path"] for r in s["shards"]])
                .batch(100).parse(spec))
    labels = np.concatenate([b["label"] for b in back])
    assert labels.tolist() == [i % 7 for i in range(300)]
    assert back[2]["x"][-1].tolist() == [149.5] * 3
    assert bytes(back[0]["name"][5]) == b"n5"
    # The records themselves: a shuffled reshard of what was written.
    paths = [r["path"] for r in s["shards"]]
    reshard = str(tmp_path / "re")
    r = D.from_tfrecords(paths).shuffle(50, seed=3).write_tfrecords(
        reshard, shards=3, record_key="record")
    assert r["records"] == 300
    before = sorted(bytes(e["record"]) for e in D.from_tfrecords(paths))
    after = [bytes(e["record"]) for e in D.from_tfrecords(
        [x["path"] for x in r["shards"]])]
    assert sorted(after) == before and after != before
    with pytest.raises(ValueError, match="names a float32"):
        D.range(3).map(lambda e: {"f": np.float32(1)}).write_tfrecords(
            str(tmp_path / "bad"), record_key="f")
    assert not list(tmp_path.glob("bad*"))


def test_apply_reduce_and_single_elements_as_tf_data():
    D = recflow.Dataset

    def evens(ds):
        return ds.filter(lambda e: int(e["value"]) % 2 == 0)

    assert [int(e["value"]) for e in D.range(7).apply(evens)] == [0, 2, 4, 6]
    # tf.data's examples: a sum, and a count.
    assert D.range(5).reduce(0, lambda s, e: s + int(e["value"])) == 10
    assert D.range(5).reduce(np.int64(0), lambda s, _: s + 1) == 5
    assert D.range(0).reduce("empty", lambda s, e: s) == "empty"
    assert [e["value"].tolist() for e in D.range(2).as_numpy_iterator()] == [
        0, 1]
    one = D.from_tensors({"x": np.arange(3)}).get_single_element()
    assert one["x"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="the dataset is empty"):
        D.range(0).get_single_element()
    with pytest.raises(ValueError, match="more than one element"):
        D.range(2).get_single_element()


def test_rebatch_as_tf_data():
    D = recflow.Dataset
    ds = D.range(6).batch(4)
    assert [b["value"].tolist() for b in ds.rebatch(3)] == [
        [0, 1, 2], [3, 4, 5]]
    assert [b["value"].tolist() for b in ds.rebatch([3, 1])] == [
        [0, 1, 2], [3], [4, 5]]
    assert [b["value"].tolist() for b in ds.rebatch(4, drop_remainder=True)
            ] == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="Rebatch: a batch size must be"):
        ds.rebatch([2, 0])


def test_counter_random_list_files_and_assert_cardinality_as_tf_data(
        tmp_path):
    D = recflow.Dataset
    assert [e["value"].item() for e in D.counter(5, -2).take(3)] == [5, 3, 1]
    assert D.counter().cardinality() == recflow.INFINITE_CARDINALITY
    seeded = [e["value"].item() for e in D.random(seed=3).take(50)]
    assert seeded == [e["value"].item() for e in D.random(seed=3).take(50)]
    assert len(set(seeded)) == 50 and min(seeded) < 0 < max(seeded)
    twice = [e["value"].item() for e in D.random(seed=3).take(4).repeat(2)]
    assert twice[:4] == twice[4:]
    twice = [e["value"].item() for e in
             D.random(seed=3, rerandomize_each_iteration=True).take(4)
             .repeat(2)]
    assert twice[:4] != twice[4:]

    for i in range(6):
        write_records(tmp_path / ("part-%d.tfrecord" % i), 3)
    pattern = str(tmp_path / "part-*.tfrecord")
    names = [e["filename"] for e in D.list_files(pattern, shuffle=False)]
    assert names == [str(tmp_path / ("part-%d.tfrecord" % i)).encode()
                     for i in range(6)]
    shuffled = D.list_files(pattern, seed=4)
    assert sorted(e["filename"] for e in shuffled) == names
    assert [e["filename"] for e in shuffled] == [
        e["filename"] for e in D.list_files([pattern], seed=4)]
    # tf.data's idiom: the file names, bytes, go straight to from_tfrecords.
    ids = [e["id"].item() for e in shuffled.interleave(
        lambda e: D.from_tfrecords(e["filename"]), cycle_length=3).parse(
            SMALL_SPEC)]
    assert sorted(ids) == sorted(list(range(3)) * 6)
    with pytest.raises(FileNotFoundError, match="ListFiles: no file matches"):
        D.list_files(str(tmp_path / "*.csv"))

    records = D.from_tfrecords(pattern)
    assert records.cardinality() == recflow.UNKNOWN_CARDINALITY
    assert records.assert_cardinality(18).cardinality() == 18
    assert len(list(records.assert_cardinality(18))) == 18
    with pytest.raises(ValueError, match=r"expected to contain 17 elements "
                       r"but contained at least 18 \(the first past them: "
                       r".*part-5.tfrecord: record 2 at offset"):
        list(records.assert_cardinality(17))
    with pytest.raises(ValueError, match="but contained only 18"):
        list(records.assert_cardinality(19))


def test_rejection_resample_as_tf_data():
    D = recflow.Dataset
    # Classes 0, 1, 2 in 70%, 20%, 10% of the elements.
    skewed = D.range(30000).shuffle(1000, seed=1).map(
        lambda e: {"value": e["value"],
                   "label": np.int64(0 if e["value"] % 10 < 7 else
                                     1 if e["value"] % 10 < 9 else 2)})
    for initial in (None, [0.7, 0.2, 0.1]):
        out = [e["label"].item() for e in skewed.rejection_resample(
            "label", target_dist=[0.2, 0.3, 0.5], initial_dist=initial,
            seed=4)]
        shares = np.bincount(out, minlength=3) / len(out)
        np.testing.assert_allclose(shares, [0.2, 0.3, 0.5], atol=0.03)
    by_function = skewed.rejection_resample(
        lambda e: int(e["label"]), [0.5, 0.5, 0.0], seed=2)
    labels = [e["label"].item() for e in by_function]
    assert labels and 2 not in labels
    with pytest.raises(ValueError, match="target_dist sums to 0.9, not 1"):
        skewed.rejection_resample("label", [0.5, 0.4, 0.0])
    with pytest.raises(TypeError, match="class_func must be a function"):
        skewed.rejection_resample(3, [1.0])


def test_save_and_load_keep_elements_exactly_as_tf_data(tmp_path):
    D = recflow.Dataset
    ds = D.from_tensor_slices({
        "x": np.arange(60, dtype=np.int32).reshape(20, 3),
        "y": np.linspace(0, 1, 20),
        "name": np.array([b"n%d" % i for i in range(20)], dtype=object),
    }).ragged_batch(3)
    summary = ds.save(tmp_path / "saved", shards=2, compression="zstd")
    assert summary["records"] == 7
    loaded = D.load(tmp_path / "saved")
    assert loaded.cardinality() == 7 and len(loaded) == 7

    def rows(d):
        out = []
        for e in d:
            x = e["x"]
            assert isinstance(x, recflow.Ragged) and x.values.dtype == np.int32
            out.append((x.values.tolist(), x.row_lengths.tolist(),
                        e["y"].dtype.name, e["y"].tolist(),
                        list(e["name"])))
        return sorted(out)
    assert rows(loaded) == rows(ds)
    assert rows(D.load(str(tmp_path / "saved"), num_parallel_reads=2,
                       num_parallel_calls=2)) == rows(ds)
    # Every element once per epoch, in a uniform order the seed fixes.
    shuffled = D.load(tmp_path / "saved", global_shuffle=True, seed=3)
    assert rows(shuffled) == rows(ds)
    order = [e["x"].values.tolist() for e in shuffled]
    assert order == [e["x"].values.tolist() for e in D.load(
        tmp_path / "saved", global_shuffle=True, seed=3)]
    with pytest.raises(ValueError, match="reads by index"):
        D.load(tmp_path / "saved", global_shuffle=True, num_parallel_reads=2)
    with pytest.raises(ValueError, match="already holds a saved dataset"):
        ds.save(tmp_path / "saved")
    with pytest.raises(ValueError, match="no saved dataset here"):
        D.load(tmp_path)
    # The records themselves, decoded by the built-in map.
    shard = tmp_path / "saved" / "elements-00000-of-00002.tfrecord.zst"
    first = next(iter(D.from_tfrecords(shard).map(
        recflow.maps.decode_element())))
    assert sorted(first) == ["name", "x", "y"]


def _field(number, payload):
    """A length-delimited protobuf field."""
    def varint(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _int64_feature(values):
    packed = b"".join(
        bytes([v]) for v in values)  # small non-negative ints: one byte
    return _field(3, _field(1, packed))  # Feature.int64_list.value


def _sequence_example(label, steps):
    """tf.train.SequenceExample: context {label}, feature_lists {tokens:
    one Feature per step}."""
    context = recflow.Example({"label": label}).serialize()  # field 1
    feature_list = b"".join(_field(1, _int64_feature(s)) for s in steps)
    entry = _field(1, b"tokens") + _field(2, feature_list)
    return context + _field(2, _field(1, entry))


def test_parse_sequence_as_tf_io_parse_sequence_example(tmp_path):
    path = tmp_path / "seq.tfrecord"
    with recflow.TFRecordWriter(str(path)) as w:
        w.write(_sequence_example(7, [[1], [2, 3]]))
        w.write(_sequence_example(8, [[4, 5, 6]]))
    context = {"label": recflow.FixedLenFeature([], "int64")}
    sequence = {"tokens": recflow.VarLenFeature("int64")}
    one = list(recflow.Dataset.from_tfrecords(str(path))
               .parse_sequence(context, sequence))
    assert int(one[0]["label"]) == 7
    tokens = one[0]["tokens"]  # Ragged [steps, (values)]
    assert tokens.values.tolist() == [1, 2, 3]
    assert tokens.row_lengths.tolist() == [1, 2]
    batch = next(iter(recflow.Dataset.from_tfrecords(str(path)).batch(2)
                      .parse_sequence(context, sequence)))
    assert batch["label"].tolist() == [7, 8]
    assert batch["tokens"].row_lengths.tolist() == [3, 3]
    assert batch["tokens/step_lengths"].values.tolist() == [1, 2, 3]
    assert batch["tokens/step_lengths"].row_lengths.tolist() == [2, 1]


def test_text_lines_and_fixed_length_records_as_tf_data(tmp_path):
    import gzip
    D = recflow.Dataset
    (tmp_path / "a.txt").write_bytes(b"one\r\n\ntwo\rparts\nlast")
    with gzip.open(tmp_path / "b.txt.gz", "wb") as f:  # gzip by its name
        f.write(b"".join(b"line %d\n" % i for i in range(1000)))
    lines = D.from_text_lines([tmp_path / "a.txt", tmp_path / "b.txt.gz"])
    got = [e["line"] for e in lines]
    assert got[:4] == [b"one", b"", b"twoparts", b"last"]
    assert got[4:] == [b"line %d" % i for i in range(1000)]
    # Restored after 500 lines, in the middle of the gzip stream: the rest.
    it = lines.iterator()
    for _ in range(500):
        next(it)
    assert [e["line"] for e in lines.restore(it.save())] == got[500:]
    interleaved = D.from_text_lines(str(tmp_path / "*.txt*"),
                                    num_parallel_reads=2, buffer_size=7)
    assert [e["line"] for e in interleaved][:6] == [
        b"one", b"line 0", b"", b"line 1", b"twoparts", b"line 2"]
    # A line past max_line_bytes ends its file: a ValueError naming it.
    it = iter(D.from_text_lines(tmp_path / "a.txt", max_line_bytes=4))
    assert next(it)["line"] == b"one"  # "one\r": 4 bytes
    assert next(it)["line"] == b""
    with pytest.raises(ValueError, match=r"a.txt: line 3, at byte 6, is "
                       r"longer than 4 bytes"):
        next(it)
    with pytest.raises(ValueError, match="max_line_bytes must be positive"):
        D.from_text_lines(tmp_path / "a.txt", max_line_bytes=0)

    # CIFAR-10's binary layout: a label byte, then 3 x 32 x 32 pixels.
    rows = np.arange(5 * 3073, dtype=np.int64).astype(np.uint8).reshape(5, -1)
    (tmp_path / "cifar.bin").write_bytes(rows.tobytes())
    images = D.from_fixed_length_records(
        tmp_path / "cifar.bin", 3073).map(
            recflow.maps.decode_raw("record", "uint8", [3073])).batch(5)
    np.testing.assert_array_equal(next(iter(images))["record"], rows)
    (tmp_path / "short.bin").write_bytes(rows.tobytes()[:-1])
    with pytest.raises(ValueError, match=r"short.bin: without its header "
                       r"\(0 bytes\) and footer \(0 bytes\), its body is "
                       r"15364 bytes, not a whole number of records of 3073"):
        list(D.from_fixed_length_records(tmp_path / "short.bin", 3073))
    with pytest.raises(ValueError, match="record_bytes must be positive"):
        D.from_fixed_length_records(tmp_path / "cifar.bin", 0)
    with pytest.raises(FileNotFoundError):
        D.from_text_lines(str(tmp_path / "nothing*.txt"))
