"""recflow's records in Python: writer, iterator, Example, count, verify,
index, random access (TFRecordDataSource), and the exceptions bad files
raise."""

import os
import pickle
import warnings
import threading

import numpy as np
import pytest

import recflow
from conftest import MNIST, PENGUIN, SMALL_SPEC, write_records


@pytest.mark.parametrize("compression,suffix", [
    ("none", ""), ("zlib", ".zz"), ("gzip", ".gz"), ("zstd", ".zst")])
def test_writer_roundtrip_every_compression(tmp_path, compression, suffix):
    path = tmp_path / f"a.tfrecord{suffix}"
    records = [os.urandom(n) for n in (0, 1, 100, 70000)]
    with recflow.TFRecordWriter(str(path), compression=compression) as w:
        for r in records:
            w.write(r)
        assert w.records == 4
    assert list(recflow.tfrecord_iterator(path)) == records
    assert recflow.count(str(path)) == 4


def test_writer_compression_from_suffix_and_level(tmp_path):
    path = tmp_path / "b.tfrecord.gz"
    with recflow.TFRecordWriter(str(path), level=9) as w:
        w.write(b"x" * 1000)
    assert open(path, "rb").read(2) == b"\x1f\x8b"
    assert list(recflow.tfrecord_iterator(str(path))) == [b"x" * 1000]


def test_writer_leaves_nothing_on_exception(tmp_path):
    path = tmp_path / "c.tfrecord"
    with pytest.raises(RuntimeError):
        with recflow.TFRecordWriter(str(path)) as w:
            w.write(b"half")
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []


def test_writer_index_matches_index_command(tmp_path):
    a = write_records(tmp_path / "a.tfrecord", 50, index=True)
    written = open(str(a) + ".idx").read()
    os.remove(str(a) + ".idx")
    assert recflow.index(str(a)) == [str(a) + ".idx"]
    assert open(str(a) + ".idx").read() == written
    assert len(written.splitlines()) == 50


def test_write_to_closed_writer_is_an_error(tmp_path):
    w = recflow.TFRecordWriter(str(tmp_path / "d.tfrecord"))
    w.close()
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write(b"x")


def test_example_dict_roundtrip():
    e = recflow.Example({"i": 3, "f": 0.5, "b": b"raw", "s": "text",
                         "il": [1, 2, 3], "fl": np.arange(4, dtype=np.float32),
                         "bl": [b"a", b"b"], "empty": np.zeros(0, np.int64)})
    d = recflow.Example.from_bytes(e.serialize()).to_dict()
    assert d["i"].tolist() == [3] and d["i"].dtype == np.int64
    assert d["f"].tolist() == [0.5] and d["f"].dtype == np.float32
    assert d["b"] == [b"raw"] and d["s"] == [b"text"]
    assert d["il"].tolist() == [1, 2, 3]
    assert d["fl"].tolist() == [0, 1, 2, 3]
    assert d["bl"] == [b"a", b"b"]
    assert d["empty"].tolist() == []
    assert recflow.Example.from_bytes(bytes(e)) == e


def test_example_rejects_what_it_cannot_hold():
    with pytest.raises(TypeError, match="empty list"):
        recflow.Example({"x": []})
    with pytest.raises(TypeError, match="complex"):
        recflow.Example({"x": np.zeros(2, np.complex64)})
    with pytest.raises(ValueError, match="not a serialized tf.train.Example"):
        recflow.Example.from_bytes(b"\xff\xff\xff")


def test_example_lists_take_their_type_from_their_values():
    # numpy's promotion would make [1, "a"] strings and [2**63] a wrapped
    # uint64; an Example list is all ints, all numbers or all bytes/str.
    d = recflow.Example({"i": [np.True_, 2, np.int8(3)],
                         "f": [1, np.float32(2.5)],
                         "o": np.array([1, 2.5], dtype=object),
                         "b": [b"x", "y", bytearray(b"z")],
                         "ba": bytearray(b"raw"),
                         "n": np.int64(7)}).to_dict()
    assert d["i"].tolist() == [1, 2, 3] and d["i"].dtype == np.int64
    assert d["f"].tolist() == [1.0, 2.5] and d["f"].dtype == np.float32
    assert d["o"].tolist() == [1.0, 2.5]
    assert d["b"] == [b"x", b"y", b"z"]
    assert d["ba"] == [b"raw"]
    assert d["n"].tolist() == [7]
    with pytest.raises(TypeError, match="'m': a list holds both numbers"):
        recflow.Example({"m": [1, "a"]})
    with pytest.raises(TypeError, match="'m': a list holds both numbers"):
        recflow.Example({"m": [1.5, b"a"]})
    with pytest.raises(TypeError, match="'r': .* not list"):
        recflow.Example({"r": [[1, 2], [3]]})


def test_int64_lists_refuse_values_past_int64():
    # Int64List raises "Value out of range" in protobuf; never a wrap.
    for value in (2**63, -2**63 - 1, [1, 2**64],
                  np.array([2**64 - 1], np.uint64)):
        with pytest.raises(ValueError, match="'x': .* outside int64"):
            recflow.Example({"x": value})
    edge = recflow.Example({"x": [2**63 - 1, -2**63],
                            "u": np.array([2**63 - 1], np.uint64)}).to_dict()
    assert edge["x"].tolist() == [2**63 - 1, -2**63]
    assert edge["u"].tolist() == [2**63 - 1]


def test_compression_levels_are_checked_before_a_file_is_made(tmp_path):
    for path, compression, level in (("a.tfrecord", None, 5),
                                     ("b.tfrecord.gz", None, 10),
                                     ("c.tfrecord", "zstd", 23)):
        with pytest.raises(ValueError, match=f"compression level {level}"):
            recflow.TFRecordWriter(str(tmp_path / path),
                                   compression=compression, level=level)
    csv = write_csv(tmp_path)
    with pytest.raises(ValueError, match="zlib takes 1 to 9"):
        recflow.convert("csv", str(csv), str(tmp_path / "x"),
                        compression="zlib", level=-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


def write_csv(tmp_path, text="id\tname\n1\t\"a\tb\"\n2\tc,d\n"):
    path = tmp_path / "in.csv"
    path.write_text(text)
    return path


def test_csv_with_another_delimiter(tmp_path):
    path = write_csv(tmp_path)
    rows = list(recflow.Dataset.from_csv(str(path), delimiter="\t"))
    assert [r["name"] for r in rows] == [b"a\tb", b"c,d"]
    summary = recflow.convert("csv", str(path), str(tmp_path / "out"),
                              delimiter="\t")
    assert summary["records"] == 2
    first = next(recflow.tfrecord_iterator(summary["shards"][0]["path"]))
    assert recflow.Example.from_bytes(first).to_dict()["name"] == [b"a\tb"]
    with pytest.raises(ValueError, match="column_types names 'nmae'"):
        recflow.Dataset.from_csv(str(path), delimiter="\t",
                                 column_types={"nmae": "bytes"})
    with pytest.raises(ValueError, match="named twice"):
        recflow.convert("csv", [str(path), str(tmp_path / "." / "in.csv")],
                        str(tmp_path / "twice"), delimiter="\t")
    with pytest.raises(ValueError, match="delimiter is for csv"):
        recflow.convert("jsonl", str(path), str(tmp_path / "j"),
                        delimiter="\t")


def test_reads_tensorflow_fixtures():
    assert recflow.count(str(MNIST)) == 1000
    first = next(recflow.tfrecord_iterator(MNIST))
    d = recflow.Example.from_bytes(first).to_dict()
    assert d["image_floats"].shape == (784,)
    assert recflow.count(str(PENGUIN)) > 0
    assert recflow.verify([str(MNIST), str(PENGUIN)])[str(MNIST)] == 1000


def test_damage_raises_record_error_naming_file_and_offset(tmp_path):
    path = write_records(tmp_path / "bad.tfrecord", 10)
    data = bytearray(open(path, "rb").read())
    first_len = int.from_bytes(data[:8], "little")
    second = 16 + first_len
    data[second + 12] ^= 0xFF  # a payload byte of record 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(recflow.RecordError) as info:
        recflow.verify(str(path))
    e = info.value
    assert isinstance(e, ValueError)
    assert e.path == str(path) and e.offset == second and e.record_index == 1
    assert e.kind == "data CRC mismatch"
    assert str(path) in str(e) and str(second) in str(e)
    with pytest.raises(recflow.RecordError):
        list(recflow.tfrecord_iterator(path))
    # Without checksums the damaged payload is read as it is.
    assert len(list(recflow.tfrecord_iterator(
        path, verify_checksums=False))) == 10


def test_missing_files_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        recflow.count(str(tmp_path / "nope.tfrecord"))
    with pytest.raises(OSError):
        recflow.tfrecord_iterator(str(tmp_path / "nope.tfrecord"))
    with pytest.raises(TypeError):
        recflow.count(42)
    with pytest.raises(ValueError, match="unknown compression"):
        recflow.TFRecordWriter(str(tmp_path / "x"), compression="lz4")


def test_convert_csv_into_indexed_shards(tmp_path):
    csv = tmp_path / "people.csv"
    csv.write_text("name,age,height\n" +
                   "".join(f"p{i},{i},{i + 0.5}\n" for i in range(1000)))
    s = recflow.convert("csv", [str(csv)], str(tmp_path / "people"),
                        shards=3, index=True)
    assert s["records"] == 1000 and len(s["shards"]) == 3
    paths = [sh["path"] for sh in s["shards"]]
    assert all(os.path.exists(p + ".idx") for p in paths)
    assert recflow.count(paths) == 1000
    ids = sorted(
        int(recflow.Example.from_bytes(r).to_dict()["age"][0])
        for p in paths for r in recflow.tfrecord_iterator(p))
    assert ids == list(range(1000))


def test_convert_bad_row_names_file_and_line(tmp_path):
    csv = tmp_path / "bad.csv"
    csv.write_text("a,b\n1,2\n3\n")
    with pytest.raises(ValueError, match=r"bad\.csv:3: 1 fields, the header has 2"):
        recflow.convert("csv", [str(csv)], str(tmp_path / "bad"))
    assert sorted(os.listdir(tmp_path)) == ["bad.csv"]
    s = recflow.convert("csv", [str(csv)], str(tmp_path / "bad"),
                        skip_bad=True)
    assert s["records"] == 1 and s["skipped"] == 1


def test_convert_refuses_records_past_max_record_bytes(tmp_path):
    csv = tmp_path / "long.csv"
    csv.write_text("a,b\n1,2\n3," + "x" * 300 + "\n")
    with pytest.raises(ValueError,
                       match=r"long\.csv:3: its record is \d+ bytes, more "
                             r"than the 200 a record may have"):
        recflow.convert("csv", str(csv), str(tmp_path / "out"),
                        max_record_bytes=200)
    s = recflow.convert("csv", str(csv), str(tmp_path / "out"),
                        max_record_bytes=200, skip_bad=True)
    assert s["records"] == 1 and s["skipped"] == 1
    with pytest.raises(ValueError, match="element 1: its record is"):
        recflow.Dataset.range(3).map(
            lambda e: {"s": b"x" * (300 if int(e["value"]) == 1 else 1)}
        ).write_tfrecords(str(tmp_path / "w"), max_record_bytes=200)
    with pytest.raises(ValueError, match="max_record_bytes must be at least 1"):
        recflow.convert("csv", str(csv), str(tmp_path / "out"),
                        max_record_bytes=0)


def test_max_row_bytes_ends_reading_at_a_longer_row(tmp_path):
    """A csv or jsonl row longer than max_row_bytes is an error that ends the
    conversion, skip_bad or not, and from_csv's file; other formats refuse
    the argument."""
    csv = tmp_path / "long.csv"
    csv.write_text("a,b\n1,2\n3," + "x" * 300 + "\n")  # row 3: 302 bytes
    assert recflow.convert("csv", str(csv), str(tmp_path / "out"),
                           max_row_bytes=302)["records"] == 2
    with pytest.raises(ValueError,
                       match=r"long\.csv:3: the row is longer than 301 bytes "
                             r"\(its cells and delimiters\)"):
        recflow.convert("csv", str(csv), str(tmp_path / "fail"),
                        max_row_bytes=301, skip_bad=True)
    assert not list(tmp_path.glob("fail*"))
    jsonl = tmp_path / "doc.jsonl"
    jsonl.write_text('[{"a": 1}, {"a": 2}]')
    with pytest.raises(ValueError, match=r"doc\.jsonl:1: the line is longer "
                       r"than 10 bytes.*`jq -c '\.\[\]' FILE`"):
        recflow.convert("jsonl", str(jsonl), str(tmp_path / "fail"),
                        max_row_bytes=10)
    with pytest.raises(ValueError, match="max_row_bytes is for csv and jsonl"):
        recflow.convert("npy", str(csv), str(tmp_path / "fail"),
                        max_row_bytes=10)
    with pytest.raises(ValueError, match="max_row_bytes must be at least 1"):
        recflow.convert("csv", str(csv), str(tmp_path / "fail"),
                        max_row_bytes=0)
    ds = recflow.Dataset.from_csv(str(csv), max_row_bytes=301)
    with pytest.raises(ValueError, match=r"long\.csv:3: the row is longer"):
        list(ds)
    assert [int(r["a"]) for r in ds.ignore_errors()] == [1]
    with pytest.raises(ValueError, match="max_row_bytes must be at least 1"):
        recflow.Dataset.from_csv(str(csv), max_row_bytes=0)


def test_convert_warns_of_untyped_columns_and_rounded_integers(tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text("id,empty,score\n1,,16777217\n2,,0.5\n")
    with pytest.warns(UserWarning) as caught:
        s = recflow.convert("csv", str(csv), str(tmp_path / "out"))
    assert s["records"] == 2
    said = [str(w.message) for w in caught]
    assert said == s["warnings"] and len(said) == 2
    assert said[0].startswith("column 'empty' is empty in every row")
    assert said[1].startswith(f"{csv}:2: column 'score': the integer 16777217 "
                              "becomes 16777216")
    # A filter that makes warnings errors raises, after the shards are done.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="column 'empty'"):
            recflow.convert("csv", str(csv), str(tmp_path / "again"))


def test_convert_refuses_a_prefix_that_names_no_shard(tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text("a\n1\n")
    with pytest.raises(ValueError, match="ends in a folder: name the shards"):
        recflow.convert("csv", str(csv), str(tmp_path) + "/")
    with pytest.raises(ValueError, match="output is empty"):
        recflow.convert("csv", str(csv), "")
    assert os.listdir(tmp_path) == ["in.csv"]


def test_a_pipe_is_read_where_one_pass_does_and_refused_elsewhere(tmp_path):
    data = open(MNIST, "rb").read()

    def through_a_pipe(read):
        r, w = os.pipe()

        def write():
            with os.fdopen(w, "wb") as f:
                f.write(data)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            return read(f"/dev/fd/{r}")
        finally:
            os.close(r)
            writer.join()

    assert through_a_pipe(recflow.count) == 1000
    assert sum(1 for _ in through_a_pipe(
        lambda p: list(recflow.tfrecord_iterator(p)))) == 1000
    # Sources and converters read their files again or at offsets: from a
    # pipe they got nothing the second time.  A fifo is refused by its name
    # alone (opening one would wait for a writer); from_tfrecords as it
    # opens it.
    fifo = tmp_path / "rows.tfrecord"
    os.mkfifo(fifo)
    for make in (lambda: list(recflow.Dataset.from_tfrecords(str(fifo))),
                 lambda: recflow.Dataset.from_csv(str(fifo)),
                 lambda: recflow.index(str(fifo)),
                 lambda: recflow.convert("jsonl", str(fifo),
                                         str(tmp_path / "out"))):
        with pytest.raises(OSError, match="not a regular file"):
            make()
    assert not (tmp_path / "out-00000-of-00001.tfrecord").exists()


def test_verify_checks_the_index_beside_a_file(tmp_path):
    # As `recflow verify`: an index that is not the file's (which DALI, the
    # range reader and the global shuffle would trust) is found, in the
    # same read as the records.
    path = tmp_path / "a.tfrecord"
    with recflow.TFRecordWriter(str(path), index=True) as w:
        for i in range(50):
            w.write(b"x" * (i + 1))
    assert recflow.verify(str(path)) == {str(path): 50}
    idx = tmp_path / "a.tfrecord.idx"
    lines = idx.read_text().splitlines()
    idx.write_text("\n".join(lines[:-1]) + "\n")  # one record short
    with pytest.raises(ValueError,
                       match=r"stale index: 49 records, the file has 50"):
        recflow.verify(str(path))
    recflow.index(str(path))
    assert recflow.verify(str(path)) == {str(path): 50}
    # zstd: its own index kind, checked against the frames.
    zpath = tmp_path / "z.tfrecord.zst"
    with recflow.TFRecordWriter(str(zpath), index=True) as w:
        for i in range(50):
            w.write(b"y" * (i + 1))
    assert recflow.verify(str(zpath)) == {str(zpath): 50}
    zidx = tmp_path / "z.tfrecord.zst.idx"
    zidx.write_text(idx.read_text())  # an uncompressed file's index
    with pytest.raises(ValueError, match="an index of a none file beside"):
        recflow.verify(str(zpath))


def test_data_source_reads_records_by_number(tmp_path):
    # Three files: indexed on disk, ZSTD with its index, and indexed in
    # memory; record i is the i-th of all of them.
    a = write_records(tmp_path / "a.tfrecord", 5, index=True)
    b = write_records(tmp_path / "b.tfrecord.zst", 7, index=True)
    c = write_records(tmp_path / "c.tfrecord", 3)
    files = [str(a), str(b), str(c)]
    every = [r for f in files for r in recflow.tfrecord_iterator(f)]
    src = recflow.TFRecordDataSource(files)
    assert len(src) == 15 and src.files == files and src.spec is None
    assert [src[i] for i in range(15)] == every
    assert src[-1] == every[-1] and src[-15] == every[0]
    assert src[[14, 0, 6, 6]] == [every[14], every[0], every[6], every[6]]
    assert src[3:12:4] == every[3:12:4]
    assert src[np.array([9, 2], np.uint16)] == [every[9], every[2]]
    assert src[[]] == []
    assert src.locate(6) == (str(b), 1, src.locate(6)[2])
    assert src.locate(-1)[:2] == (str(c), 2)
    assert src.locate(np.int64(6)) == src.locate(6)
    with pytest.raises(TypeError, match="locate takes an int"):
        src.locate(1.5)


def test_data_source_parses_as_batch_then_parse(tmp_path):
    write_records(tmp_path / "a.tfrecord", 30)
    src = recflow.TFRecordDataSource(tmp_path, spec=SMALL_SPEC)
    whole = next(iter(recflow.Dataset.from_tfrecords(tmp_path).batch(30)
                      .parse(SMALL_SPEC)))
    rows = [29, 3, 3, 17]
    batch = src[rows]
    assert sorted(batch) == sorted(whole)
    for key, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype != object:
            np.testing.assert_array_equal(value, whole[key][rows])
        else:
            assert list(value) == [whole[key][r] for r in rows]
    one = src[17]
    np.testing.assert_array_equal(one["x"], whole["x"][17])
    assert one["id"] == 17 and one["name"] == b"r17"
    again = pickle.loads(pickle.dumps(src))
    assert len(again) == 30 and again.spec.to_dict() == src.spec.to_dict()
    np.testing.assert_array_equal(again[rows]["x"], batch["x"])


def test_data_source_errors(tmp_path):
    f = write_records(tmp_path / "a.tfrecord", 4, index=True)
    src = recflow.TFRecordDataSource(f)
    every = list(recflow.tfrecord_iterator(f))
    with pytest.raises(IndexError, match="record 4 is out of range: the data "
                       "source has 4 records"):
        src[4]
    with pytest.raises(IndexError):
        src[[0, -5]]
    with pytest.raises(IndexError):
        src[2**80]
    for bad in ("0", [0.5], [[0, 1]], None):
        with pytest.raises(TypeError, match="indices must be"):
            src[bad]
    with pytest.raises(ValueError, match="gzip stream cannot be indexed"):
        recflow.TFRecordDataSource(
            write_records(tmp_path / "g.tfrecord.gz", 2))
    with pytest.raises(FileNotFoundError):
        recflow.TFRecordDataSource(tmp_path / "missing.tfrecord")
    # Damage found when the record is read, naming the file and record.
    offset = src.locate(2)[2]
    data = bytearray(f.read_bytes())
    data[offset + 14] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(recflow.RecordError) as e:
        src[[1, 2]]
    assert e.value.path == str(f) and e.value.record_index == 2
    assert src[3] == every[3]
    with pytest.raises(ValueError, match="is required"):
        recflow.TFRecordDataSource(
            f, spec={"nope": recflow.FixedLenFeature([], "int64")})[0]
