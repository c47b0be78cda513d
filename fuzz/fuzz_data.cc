#include "fuzz_data.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "records/crc32c.h"
#include "records/example_builder.h"
#include "records/feature_spec.h"
#include "records/index.h"
#include "records/tfrecord_format.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"

namespace recflow::fuzz {
namespace {

// Writes a file with `write(path)` unless it is there already.
template <typename Fn>
std::string Ensure(const std::string& name, Fn write) {
  const std::string path = FixedDataDir() + "/" + name;
  if (!std::filesystem::exists(path)) write(path);
  return path;
}

}  // namespace

const std::string& FixedDataDir() {
  static const std::string dir = [] {
    std::string base = "/dev/shm";
    if (!std::filesystem::is_directory(base)) {
      base = std::filesystem::temp_directory_path().string();
    }
    const std::string d =
        base + "/recflow-fuzz-data-v1-" + std::to_string(getuid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::string SmallRecordFile(bool zstd) {
  return Ensure(zstd ? "small.tfrecord.zst" : "small.tfrecord",
                [&](const std::string& path) {
                  records::WriterOptions o;
                  o.compression = zstd ? records::Compression::kZstd
                                       : records::Compression::kNone;
                  o.zstd_frame_bytes = 64;
                  records::TFRecordWriter w(path, o);
                  for (int i = 0; i < 20; ++i) {
                    w.Write(std::string(static_cast<size_t>(i * 7),
                                        static_cast<char>('a' + i)));
                  }
                  w.Close();
                });
}

std::vector<pipeline::Dataset> StatePipelines() {
  using pipeline::Dataset;
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    files.push_back(Ensure("part-" + std::to_string(f) + ".tfrecord",
                           [&](const std::string& path) {
                             records::WriterOptions o;
                             o.build_index = true;
                             records::TFRecordWriter w(path, o);
                             records::ExampleBuilder b;
                             for (int r = 0; r < 10 + 5 * f; ++r) {
                               b.Clear();
                               b.AddInt64("id", f * 100 + r);
                               const float x[2] = {static_cast<float>(r), 0.5f};
                               b.AddFloatList("x", x);
                               w.Write(b.Serialize());
                             }
                             // The index first: a file is only used once its
                             // index is there.
                             records::WriteIndex(records::IndexPathFor(path),
                                                 w.index());
                             w.Close();
                           }));
  }
  const auto spec = records::FeatureSpec::FromJsonText(R"({"features": {
      "id": {"kind": "fixed", "dtype": "int64", "shape": []},
      "x": {"kind": "fixed", "dtype": "float32", "shape": [2]}}})");
  std::vector<Dataset> out;
  pipeline::TFRecordOptions t;
  t.num_parallel_reads = 2;
  t.shuffle_files = true;
  t.seed = 3;
  out.push_back(
      Dataset::FromTFRecords(files, t).Shuffle(8, 1).Batch(3).Repeat(2));
  pipeline::GlobalShuffleOptions g;
  g.seed = 5;
  g.num_shards = 2;
  out.push_back(
      Dataset::FromTFRecordsGlobalShuffle(files, g).Repeat(2).Parse(spec).Batch(
          4, true));
  pipeline::MapOptions m;
  m.num_parallel_calls = 2;
  out.push_back(Dataset::Range(0, 100)
                    .Shuffle(10, 7)
                    .Map([](pipeline::Element e) { return e; }, m)
                    .Skip(3)
                    .Take(60)
                    .Prefetch(2));
  out.push_back(Dataset::FromTFRecords(files).Parse(spec).Cache().Repeat(3));
  // Each file shuffled in a buffer of its own (its buffer and the records
  // drawn ahead in the state): stage by stage, and fused (Parse after
  // Batch with two calls: the reader tasks draw).  Appended, so that the
  // regression inputs' mode bytes keep naming the pipelines they name.
  pipeline::TFRecordOptions per_file;
  per_file.num_parallel_reads = 2;
  per_file.shuffle_buffer_per_file = 4;
  per_file.seed = 2;
  out.push_back(Dataset::FromTFRecords(files, per_file).Repeat(2));
  pipeline::ParseOptions two;
  two.num_parallel_calls = 2;
  out.push_back(
      Dataset::FromTFRecords(files, per_file).Batch(4).Parse(spec, two));
  // The stages that keep elements or a running value in the state:
  // windows, a scan, the distinct elements seen, groups, a batch split
  // part-way, a count, a resampler's estimate; and the endless sources.
  const auto value = [](const pipeline::Element& e) {
    return e["value"].scalar<int64_t>();
  };
  out.push_back(Dataset::Range(0, 40)
                    .Shuffle(6, 4)
                    .Window(3, {.shift = 2, .stride = 2})
                    .Rebatch({2, 5})
                    .Repeat(2));
  pipeline::Element zero;
  zero.Set("sum", pipeline::Tensor::Scalar<int64_t>(0));
  out.push_back(
      Dataset::Range(0, 50)
          .Shuffle(8, 2)
          .Scan(zero,
                [value](const pipeline::Element& state, pipeline::Element e) {
                  pipeline::Element next;
                  next.Set(
                      "sum",
                      pipeline::Tensor::Scalar<int64_t>(
                          (state["sum"].scalar<int64_t>() + value(e)) % 17));
                  return std::pair<pipeline::Element, pipeline::Element>{next,
                                                                         next};
                })
          .Unique()
          .TakeWhile([](const pipeline::Element&) { return true; })
          .Repeat(2));
  out.push_back(
      Dataset::Range(0, 60)
          .Shuffle(9, 3)
          .GroupByWindow(
              [value](const pipeline::Element& e) { return value(e) % 4; },
              [](int64_t key) { return key + 2; })
          .AssertCardinality(20)  // 8 + 5 + 4 + 3 windows
          .Repeat(2));
  out.push_back(Dataset::Zip({Dataset::Counter(3, 2).Take(30),
                              Dataset::Random(5).Map([](pipeline::Element e) {
                                pipeline::Element out;
                                out.Set("r", e["value"]);
                                return out;
                              })})
                    .AssertCardinality(30)
                    .Repeat(2));
  out.push_back(
      Dataset::Range(0, 80)
          .Shuffle(7, 1)
          .RejectionResample(
              [value](const pipeline::Element& e) { return value(e) % 3; },
              {.target_dist = {0.2, 0.3, 0.5}})
          .Repeat(2));
  // The plain-file sources: lines of a plain and a gzip file (restored by
  // seeking, and by decoding up to the position), interleaved and not;
  // fixed-length records of a zstd file between a header and a footer.
  std::vector<std::string> texts;
  for (const records::Compression c :
       {records::Compression::kNone, records::Compression::kGzip}) {
    texts.push_back(
        Ensure(c == records::Compression::kNone ? "lines.txt" : "lines.txt.gz",
               [c](const std::string& path) {
                 std::string text;
                 for (int i = 0; i < 30; ++i) {
                   text += std::string(static_cast<size_t>(i % 5), 'x') +
                           std::to_string(i) + (i % 4 == 0 ? "\r\n" : "\n");
                 }
                 testing::WriteFileBytes(path, testing::Compressed(text, c));
               }));
  }
  pipeline::PlainFileOptions two_open;
  two_open.num_parallel_reads = 2;
  out.push_back(Dataset::FromTextLines(texts, two_open).Repeat(2));
  out.push_back(Dataset::FromTextLines(texts).Take(40));
  const std::string fixed =
      Ensure("records.bin.zst", [](const std::string& path) {
        std::string bytes = "HDR";
        for (int i = 0; i < 20; ++i) bytes += std::string(5, 'a' + i);
        testing::WriteFileBytes(
            path,
            testing::Compressed(bytes + "FT", records::Compression::kZstd));
      });
  out.push_back(Dataset::FromFixedLengthRecords({fixed}, 5, 3, 2)
                    .Shuffle(4, 1)
                    .Repeat(2));
  // A parallel Interleave: inputs read ahead (their buffers in the state),
  // two reading at once of three open, an input that fails, not
  // deterministic.
  pipeline::InterleaveOptions ahead;
  ahead.block_length = 2;
  ahead.num_parallel_calls = 2;
  ahead.deterministic = false;
  ahead.buffer_output_elements = 3;
  out.push_back(Dataset::Range(0, 7).Interleave(
      [](const pipeline::Element& e) {
        // A restored state gives back the input element it holds, which
        // a forged one may make any value.
        const auto v = static_cast<int64_t>(
            static_cast<uint64_t>(e["value"].scalar<int64_t>()) % 7);
        if (v == 4) throw pipeline::Error("no dataset for input 4");
        return Dataset::Range(v * 10, v * 10 + v % 4);
      },
      3, ahead));
  // TFRecord files each read ahead on a thread of its own, two blocks of
  // two at a time, shuffled per file, not deterministic.
  pipeline::TFRecordOptions out_of_turn = per_file;
  out_of_turn.block_length = 2;
  out_of_turn.shuffle_buffer_per_file = 3;
  out_of_turn.deterministic = false;
  out.push_back(Dataset::FromTFRecords(files, out_of_turn).Repeat(2));
  // The same fused under one parse call: the reader tasks read ahead
  // while the consumer's thread plans and parses.
  out.push_back(
      Dataset::FromTFRecords(files, out_of_turn).Batch(3).Parse(spec));
  return out;
}

std::string WithCheckpointCrcs(std::string_view checkpoint) {
  std::string out(checkpoint);
  size_t pos = 8 + 8;  // magic, entry count
  auto get = [&](size_t n, uint64_t* v) {
    if (pos + n > out.size()) return false;
    *v = 0;
    std::memcpy(v, out.data() + pos, n);
    pos += n;
    return true;
  };
  while (true) {
    const size_t start = pos;
    uint64_t name_size, dtype, rank, dim, bytes;
    if (!get(4, &name_size) || name_size > out.size() - pos) break;
    pos += name_size;
    if (!get(1, &dtype) || !get(1, &rank) || rank > 8) break;
    bool ok = true;
    for (uint64_t i = 0; i < rank && ok; ++i) ok = get(8, &dim);
    if (!ok || !get(8, &bytes) || bytes > out.size() - pos) break;
    pos += bytes;
    if (pos + 4 > out.size()) break;
    const uint32_t crc = records::crc32c::Mask(
        records::crc32c::Value(out.data() + start, pos - start));
    records::EncodeLittleEndian<uint32_t>(out.data() + pos, crc);
    pos += 4;
  }
  return out;
}

}  // namespace recflow::fuzz
