// Writes the seed corpora of the fuzz targets: make_seeds FIXTURES_DIR OUT
// fills OUT/<target>/ with valid inputs (records cut from the TensorFlow
// fixtures in every compression, their Examples, SequenceExamples, index
// files, checkpoints and state files, iterator states saved at several
// points, small CSV, JSON Lines, NumPy and IDX files, and JSON texts), each
// prefixed with the mode byte its target reads first.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_data.h"
#include "pipeline/dataset.h"
#include "records/example.pb.h"
#include "records/example_builder.h"
#include "records/index.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace {

using namespace recflow;
namespace fs = std::filesystem;

fs::path out_dir;
int written = 0;

void Seed(const std::string& target, const std::string& name, char mode,
          const std::string& bytes) {
  const fs::path dir = out_dir / target;
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.put(mode);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + (dir / name).string());
  ++written;
}

// The first `n` records of a fixture (none when it is missing).
std::vector<std::string> FixtureRecords(const fs::path& path, size_t n) {
  std::vector<std::string> out;
  if (!fs::exists(path)) return out;
  records::TFRecordReader r(path.string());
  std::string_view rec;
  while (out.size() < n && r.ReadRecord(&rec)) out.emplace_back(rec);
  return out;
}

void RecordSeeds(const std::vector<std::string>& records,
                 const fs::path& scratch) {
  const records::Compression kAll[] = {
      records::Compression::kNone, records::Compression::kZlib,
      records::Compression::kGzip, records::Compression::kZstd};
  for (int c = 0; c < 4; ++c) {
    const std::string path = (scratch / "r.tfrecord").string();
    records::WriterOptions o;
    o.compression = kAll[c];
    o.zstd_frame_bytes = 256;
    testing::WriteRecords(path, records, o);
    const std::string bytes = testing::ReadFileBytes(path);
    const std::string name(records::CompressionName(kAll[c]));
    Seed("tfrecord_reader", name, static_cast<char>(c), bytes);
    Seed("tfrecord_reader", name + "-detect", 4, bytes);
    Seed("tfrecord_reader", name + "-salvage-index",
         static_cast<char>(c | 0x08 | 0x20), bytes);
  }
}

void ExampleSeeds(const std::vector<std::string>& fixture_examples) {
  int i = 0;
  for (const auto& e : fixture_examples) {
    Seed("example_parser", fmt::format("fixture-{}", i++), 0, e);
  }
  records::ExampleBuilder b;
  const float pixels[784] = {0.5f};
  b.AddInt64("image_class", 3).AddFloatList("image_floats", pixels);
  const float pair[2] = {1, 2};
  const int64_t species[3] = {1, 2, 3};
  const std::string tags[2] = {"a", "bc"};
  b.AddFloatList("pair", pair)
      .AddBytes("name", "x")
      .AddInt64List("species", species)
      .AddFloat("body_mass_g", 3750)
      .AddBytesList("tags", tags);
  const std::string full(b.Serialize());
  Seed("example_parser", "all-features", 0, full);
  // A batch of two: the byte after the mode is the first one's length / 4.
  std::string name = "n";
  std::string small;
  do {
    name += "n";
    records::ExampleBuilder sb;
    sb.AddInt64("image_class", 1).AddBytes("name", name);
    small.assign(sb.Serialize());
  } while (small.size() % 4 != 0);
  std::string batch(1, static_cast<char>(small.size() / 4));
  batch.append(small);
  batch.append(full);
  Seed("example_parser", "batch-of-two", 1, batch);

  tensorflow::SequenceExample s;
  auto& ctx = *s.mutable_context()->mutable_feature();
  ctx["length"].mutable_int64_list()->add_value(2);
  ctx["title"].mutable_bytes_list()->add_value()->assign(1, 't');
  ctx["scores"].mutable_float_list()->add_value(0.25f);
  auto& lists = *s.mutable_feature_lists()->mutable_feature_list();
  for (int step = 0; step < 2; ++step) {
    lists["tokens"].add_feature()->mutable_bytes_list()->add_value()->assign(
        3, 'k');
    auto* frame = lists["frame"].add_feature()->mutable_float_list();
    for (int k = 0; k < 3; ++k) frame->add_value(static_cast<float>(k));
    lists["ids"].add_feature()->mutable_int64_list()->add_value(step);
  }
  Seed("sequence_example_parser", "one", 0, s.SerializeAsString());
}

void IndexSeeds() {
  for (bool zstd : {false, true}) {
    const std::string path = fuzz::SmallRecordFile(zstd);
    const std::string idx = path + ".seed-idx";
    records::WriteIndex(idx, records::BuildIndex(path));
    Seed("index_reader", zstd ? "zstd" : "plain", zstd ? 1 : 0,
         testing::ReadFileBytes(idx));
    fs::remove(idx);
  }
}

void CheckpointSeeds(const fs::path& scratch) {
  train::TensorMap t;
  const float w[] = {1.5f, -2, 3, 0.25f, 5, 6};
  t["dense/kernel"] = pipeline::Tensor::FromValues<float>(w, {2, 3});
  t["global_step"] = pipeline::Tensor::Scalar<int64_t>(7);
  const uint8_t state[] = {0, 1, 2};
  t["_input_iterator_state"] =
      pipeline::Tensor::FromValues<uint8_t>(state, {3});
  const std::string path = (scratch / "model.ckpt-7").string();
  train::WriteCheckpoint(path, t);
  Seed("checkpoint", "model", 0, testing::ReadFileBytes(path));
  Seed("checkpoint", "state", 1,
       "model_checkpoint_path: \"model.ckpt-7\"\n"
       "all_model_checkpoint_paths: \"model.ckpt-5\"\n"
       "all_model_checkpoint_paths: \"model.ckpt-7\"\n"
       "all_model_checkpoint_timestamps: 1700000000.5\n"
       "last_preserved_timestamp: 1699999999.0\n");
}

void StateSeeds() {
  const auto pipelines = fuzz::StatePipelines();
  for (size_t p = 0; p < pipelines.size(); ++p) {
    pipeline::Iterator it = pipelines[p].MakeIterator();
    pipeline::Element e;
    int drawn = 0;
    for (int stop : {0, 1, 4, 9, 17}) {
      // An error counts as drawn: the stream goes on after it, and the
      // state then holds where (a kept or buffered error).
      for (; drawn < stop; ++drawn) {
        try {
          if (!it.Next(&e)) break;
        } catch (const recflow::Error&) {
        }
      }
      Seed("iterator_state", fmt::format("p{}-at-{}", p, drawn),
           static_cast<char>(p), it.Save());
    }
  }
}

void ConvertSeeds() {
  Seed("convert_csv", "plain", 0, "a,b,c\n1,2.5,x\n-3,4,\"q,\"\"r\"\n");
  Seed("convert_csv", "typed", 2, "a,b,c,label\n1,\"0.5 1\",x y,0\n");
  Seed("convert_jsonl", "plain", 0,
       "{\"a\": 1, \"b\": [0.5, 2], \"c\": \"x\"}\n{\"a\": 2, \"c\": [\"p\", "
       "\"q\"]}\n");
  Seed("convert_jsonl", "typed", 2,
       "{\"a\": 1, \"b\": [0.5, 2], \"c\": [\"x\"], \"label\": 0}\n");
  // Every kind of value a row's event reading takes or hands to the document
  // (convert/jsonl.cc's LineValues): null in and out of a list, booleans,
  // integers past int64 and uint64, a float past float32, a nested object
  // and list, a key named twice, escapes and a non-ASCII key.
  Seed("convert_jsonl", "edges", 0,
       "{\"a\": 1, \"f\": 0.5, \"s\": \"q\\\"\\u00e9\", \"\u00fc\": [true, "
       "false], \"n\": null, \"e\": []}\n"
       "{\"f\": 18446744073709551616, \"a\": [9223372036854775807, -1]}\n"
       "{\"a\": 18446744073709551615, \"f\": 1e39}\n"
       "{\"a\": [1, null], \"o\": {\"a\": 2}, \"l\": [[1]]}\n"
       "{\"a\": 1, \"a\": 2} \n[1]\n");
  // JSON texts for the reader of JSON Lines' hot path: every kind of
  // value, escapes, surrogates, UTF-8, numbers at int64's and double's
  // ends, a byte order mark.
  Seed("json_events", "line", 0,
       "{\"a\": 1, \"b\": [0.5, -2, 1e-3], \"s\": \"x\\ty\", \"n\": null, "
       "\"t\": true, \"f\": false, \"o\": {\"p\": []}}");
  Seed("json_events", "strings", 0,
       "[\"\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\b\\f\\n\\r\", "
       "\"\xC3\xA9\xE2\x82\xAC"
       "\xF0\x9F\x98\x80\", \"\"]");
  Seed("json_events", "numbers", 0,
       "[0, -0, 9223372036854775807, -9223372036854775808, "
       "18446744073709551615, 18446744073709551616, 1.7976931348623157e308, "
       "4.9e-324, 1e-400, 12.5E+3]");
  Seed("json_events", "bom", 0, "\xEF\xBB\xBF { \"k\" : \"v\" } \n");
  const std::string npy_f = testing::NpyBytes(
      "<f4", "(3, 2)", testing::Raw(std::vector<float>{1, 2, 3, 4, 5, 6}));
  const std::string npy_i = testing::NpyBytes(
      "<i8", "(3,)", testing::Raw(std::vector<int64_t>{1, 2, 3}));
  Seed("convert_npy", "npy", 0, npy_f);
  Seed("convert_npy", "npz-stored", 1,
       testing::Zip({{"x.npy", npy_f}, {"y.npy", npy_i}}, false));
  Seed("convert_npy", "npz-deflated", 1,
       testing::Zip({{"x.npy", npy_f}, {"y.npy", npy_i}}, true));
  const std::string labels =
      testing::Be32(0x801) + testing::Be32(2) + std::string("\x01\x02", 2);
  const std::string images = testing::Be32(0x803) + testing::Be32(2) +
                             testing::Be32(2) + testing::Be32(2) +
                             std::string(8, '\x7f');
  // The byte after the mode is the labels' length / 2.
  std::string idx(1, static_cast<char>(labels.size() / 2));
  idx.append(labels);
  idx.append(images);
  Seed("convert_idx", "two", 0, idx);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds FIXTURES_DIR OUT_DIR\n");
    return 2;
  }
  const fs::path fixtures = argv[1];
  out_dir = argv[2];
  try {
    testing::TempDir scratch;
    auto mnist =
        FixtureRecords(fixtures / "tf/tfx_mnist_1000_example.tfrecord", 3);
    auto penguin =
        FixtureRecords(fixtures / "tf/tfx_penguin_eval_example.tfrecord.gz", 5);
    std::vector<std::string> records = mnist;
    records.insert(records.end(), penguin.begin(), penguin.end());
    records.push_back("");
    records.push_back(std::string(300, 'z'));
    RecordSeeds(records, scratch.path());
    ExampleSeeds(records);
    IndexSeeds();
    CheckpointSeeds(scratch.path());
    StateSeeds();
    ConvertSeeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  std::printf("%d seeds in %s\n", written, out_dir.c_str());
  return 0;
}
