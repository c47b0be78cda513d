// recflow demo: the README's main job.  Writes a sample dataset of
// tf.Example records in every compression, then counts, verifies, reshards
// and indexes it, reads records back through the index, damages a copy and
// salvages it; then converts Fashion-MNIST, streams it through the input
// pipeline, trains a model on it and evaluates it — and says what each step
// did and how fast.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "convert/convert.h"
#include "pipeline/dataset.h"
#include "records/example_builder.h"
#include "records/example_parser.h"
#include "records/file.h"
#include "records/index.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"
#include "tools/cli.h"
#include "tools/training.h"
#include "train/backend.h"

namespace recflow::tools {
namespace {

namespace fs = std::filesystem;

struct DemoOptions {
  std::string workdir;
  uint64_t records = 100000;
  std::string model = "dnn";
  std::string device = "cpu";
  bool cuda_graphs = true;
  int64_t train_steps = 0;  // 0: the model's default
  std::string data;         // empty: Debian's package's folder
  bool json = false;
};

// Where Debian's dataset-fashion-mnist package puts the four IDX files.
constexpr const char* kDebianFashionMnist = "/usr/share/datasets/fashion-mnist";

// Written into the work folder, so that a rerun knows it may empty it.
constexpr char kWorkdirMarker[] = ".recflow-demo";

// Whether `name`, at the top of a work folder, is one the demo writes
// (for folders of demos from before the marker).
bool IsDemoName(const std::string& name) {
  return name == kWorkdirMarker || name == "shards" ||
         name == "fashion-mnist" || name == "damaged.tfrecord" ||
         name == "salvaged.tfrecord" || name.starts_with("sample.tfrecord") ||
         name.starts_with("model-");
}

// Empties `dir` for a fresh run, or makes it.  Only a folder the demo made
// (its marker, or nothing but the demo's names) or an empty one is
// emptied: `--workdir .` or a typo must never delete a user's files.
void PrepareWorkdir(const fs::path& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) {
      throw UsageError(fmt::format(
          "--workdir {}: a file, not a folder; give a new or empty folder",
          dir.string()));
    }
    std::vector<std::string> foreign;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (!IsDemoName(name)) foreign.push_back(name);
    }
    if (!foreign.empty() && !fs::exists(dir / kWorkdirMarker)) {
      std::sort(foreign.begin(), foreign.end());
      throw UsageError(fmt::format(
          "--workdir {}: holds files the demo did not write ({}{}); the demo "
          "empties its folder first, so give a new or empty one",
          dir.string(), foreign[0],
          foreign.size() > 1 ? fmt::format(" and {} more", foreign.size() - 1)
                             : ""));
    }
    fs::remove_all(dir);
  }
  records::MakeDirectories((dir / "shards").string());
  records::WritableFile marker((dir / kWorkdirMarker).string(),
                               /*atomic=*/true);
  marker.Append("recflow demo's work folder: the next demo run empties it.\n");
  marker.Close();
}

// The four Fashion-MNIST IDX files in a folder, each as NAME or NAME.gz
// (the IDX converter reads both), and the names of those not there.
struct FashionMnistFiles {
  fs::path dir;
  std::string train_images, train_labels, test_images, test_labels;
  std::vector<std::string> missing;
};

FashionMnistFiles FindFashionMnist(const fs::path& dir) {
  FashionMnistFiles f;
  f.dir = dir;
  auto find = [&](const char* name, std::string& path) {
    for (const std::string& candidate :
         {std::string(name) + ".gz", std::string(name)}) {
      if (fs::is_regular_file(dir / candidate)) {
        path = (dir / candidate).string();
        return;
      }
    }
    f.missing.push_back(std::string(name) + "[.gz]");
  };
  find("train-images-idx3-ubyte", f.train_images);
  find("train-labels-idx1-ubyte", f.train_labels);
  find("t10k-images-idx3-ubyte", f.test_images);
  find("t10k-labels-idx1-ubyte", f.test_labels);
  return f;
}

// What to do when they are not all there.
std::string FashionMnistHelp(const FashionMnistFiles& f) {
  const std::string what =
      fs::is_directory(f.dir)
          ? fmt::format("missing {}", fmt::join(f.missing, ", "))
          : std::string("no such folder");
  return fmt::format(
      "{}: {} (Fashion-MNIST's four IDX files, each .gz or not); install "
      "Debian's dataset-fashion-mnist (apt-get install "
      "dataset-fashion-mnist, or bash scripts/setup.sh) or give --data DIR "
      "with the four files",
      f.dir.string(), what);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

// A sample record: id, label, a few floats and a short text, all varying in
// size as real data does.
std::string SampleExample(uint64_t id, std::mt19937_64& rng,
                          records::ExampleBuilder& b) {
  static constexpr std::string_view kWords[] = {
      "stream", "record", "tensor", "batch", "shuffle", "epoch", "shard",
      "index",  "frame",  "check",  "train", "model",   "input", "data"};
  std::vector<float> values(8 + rng() % 120);
  for (float& v : values) v = static_cast<float>(rng() % 10000) / 100.0f;
  std::string text;
  const size_t words = 3 + rng() % 40;
  for (size_t i = 0; i < words; ++i) {
    if (i) text.push_back(' ');
    text.append(kWords[rng() % std::size(kWords)]);
  }
  b.Clear();
  b.AddInt64("id", static_cast<int64_t>(id))
      .AddInt64("label", static_cast<int64_t>(id % 10))
      .AddFloatList("values", values)
      .AddBytes("text", text);
  return std::string(b.Serialize());
}

// Collects what a salvaging reader skips.
class CountingReporter final : public records::Reporter {
 public:
  void Skipped(const records::RecordError& error, uint64_t bytes) override {
    lines.push_back(fmt::format("{} ({} bytes skipped)", error.what(), bytes));
  }
  std::vector<std::string> lines;
};

int RunDemo(const DemoOptions& o) {
  // A GPU that is not there is said at once, not after the first steps.
  if (o.device != "cpu") train::MakeBackend(train::ParseDevice(o.device));
  // So is a --data folder without the dataset; Debian's folder without it
  // skips parts 6-8, saying how to get it.
  const FashionMnistFiles fashion = FindFashionMnist(
      o.data.empty() ? fs::path(kDebianFashionMnist) : fs::path(o.data));
  if (!o.data.empty() && !fashion.missing.empty()) {
    throw UsageError("--data " + FashionMnistHelp(fashion));
  }
  const fs::path dir = o.workdir.empty()
                           ? fs::temp_directory_path() / "recflow-demo"
                           : fs::path(o.workdir);
  PrepareWorkdir(dir);
  nlohmann::json report = {{"workdir", dir.string()}};
  auto say = [&](const std::string& line) {
    if (!o.json) fmt::print("{}\n", line);
  };
  say(fmt::format("recflow demo: working in {}", dir.string()));

  // 1. Write the sample dataset in each compression.
  using records::Compression;
  const Compression kinds[] = {Compression::kNone, Compression::kGzip,
                               Compression::kZlib, Compression::kZstd};
  std::vector<std::string> payloads;
  {
    std::mt19937_64 rng(20261122);
    records::ExampleBuilder builder;
    payloads.reserve(o.records);
    for (uint64_t i = 0; i < o.records; ++i) {
      payloads.push_back(SampleExample(i, rng, builder));
    }
  }
  uint64_t payload_bytes = 0;
  for (const auto& p : payloads) payload_bytes += p.size();
  say(fmt::format("1. wrote {} sample tf.Examples ({:.1f} MB of payload):",
                  o.records, payload_bytes / 1e6));
  std::vector<std::string> files;
  for (Compression c : kinds) {
    const std::string path =
        (dir / fmt::format("sample.tfrecord{}", records::CompressionSuffix(c)))
            .string();
    const auto start = std::chrono::steady_clock::now();
    records::TFRecordWriter writer(path, {.compression = c});
    for (const auto& p : payloads) writer.Write(p);
    writer.Close();
    const double s = Seconds(start);
    say(fmt::format("   {:<5} {:>11} bytes  {:>7.3f} s  {:>12}  {}",
                    records::CompressionName(c), writer.file_bytes(), s,
                    FormatRate(static_cast<double>(writer.stream_bytes()), s),
                    path));
    report["write"][std::string(records::CompressionName(c))] = {
        {"bytes", writer.file_bytes()}, {"seconds", s}};
    files.push_back(path);
  }

  // 2. Count them back, verifying every CRC.
  say("2. counted and verified every record (both CRCs) of each file:");
  for (const std::string& path : files) {
    const auto start = std::chrono::steady_clock::now();
    records::TFRecordReader reader(path);
    std::string_view record;
    while (reader.ReadRecord(&record)) {
    }
    const double s = Seconds(start);
    const auto stats = reader.stats();
    if (stats.records != o.records) {
      throw records::Error(fmt::format("{}: read {} records, wrote {}", path,
                                       stats.records, o.records));
    }
    say(fmt::format(
        "   {:<5} {:>8} records  {:>7.3f} s  {:>12} (of the "
        "uncompressed stream)",
        records::CompressionName(reader.compression()), stats.records, s,
        FormatRate(static_cast<double>(stats.stream_bytes), s)));
  }

  // 3. Reshard into 8 zstd shards with indexes.
  const uint64_t kShards = 8;
  {
    const auto start = std::chrono::steady_clock::now();
    const auto shards =
        Reshard({files[0]}, (dir / "shards" / "sample").string(), kShards,
                {.compression = Compression::kZstd}, {}, /*write_index=*/true);
    const double s = Seconds(start);
    uint64_t min = UINT64_MAX, max = 0, bytes = 0;
    for (const auto& shard : shards) {
      min = std::min(min, shard.records);
      max = std::max(max, shard.records);
      bytes += shard.bytes;
    }
    say(
        fmt::format("3. resharded into {} zstd shards with indexes in {:.3f} "
                    "s: {}..{} records per shard, {} bytes, in {}",
                    kShards, s, min, max, bytes, (dir / "shards").string()));
    report["reshard"] = {{"shards", kShards}, {"seconds", s}};
  }

  // 4. Index the uncompressed file and read records at random through it,
  // and through a zstd shard's index.
  {
    const std::string idx = records::IndexPathFor(files[0]);
    const auto start = std::chrono::steady_clock::now();
    records::WriteIndex(idx, records::BuildIndex(files[0]));
    const double index_s = Seconds(start);
    records::IndexedReader reader(files[0], records::ReadIndex(idx));
    std::mt19937_64 rng(7);
    const int kReads = 10000;
    const auto read_start = std::chrono::steady_clock::now();
    for (int i = 0; i < kReads; ++i) {
      const uint64_t r = rng() % o.records;
      if (reader.Read(r) != payloads[r]) {
        throw records::Error(
            fmt::format("{}: record {} read through the index differs from "
                        "what was written",
                        files[0], r));
      }
    }
    const double read_s = Seconds(read_start);
    const std::string shard =
        ShardName((dir / "shards" / "sample").string(), 3, kShards, ".zst");
    records::IndexedReader zstd_reader(
        shard, records::ReadIndex(records::IndexPathFor(shard)));
    const uint64_t first_of_shard = 3 * o.records / kShards;
    const uint64_t last = zstd_reader.size() - 1;
    if (zstd_reader.Read(last) != payloads[first_of_shard + last] ||
        zstd_reader.Read(0) != payloads[first_of_shard]) {
      throw records::Error(
          fmt::format("{}: records read through the zstd index differ", shard));
    }
    say(fmt::format(
        "4. indexed {} in {:.3f} s ({}); {} random reads through "
        "the index matched what was written ({:.1f} us each); "
        "zstd shard {} reads through its frame index too",
        files[0], index_s, idx, kReads, read_s / kReads * 1e6, shard));
    report["random_read_us"] = read_s / kReads * 1e6;
  }

  // 5. Damage a copy, detect it, salvage it.
  {
    const std::string damaged = (dir / "damaged.tfrecord").string();
    fs::copy_file(files[0], damaged);
    const records::Index index = records::BuildIndex(files[0]);
    const uint64_t bad_data = o.records / 3, bad_length = 2 * o.records / 3;
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    auto flip = [&](uint64_t offset) {
      f.seekg(static_cast<std::streamoff>(offset));
      char c;
      f.read(&c, 1);
      c ^= 0x20;
      f.seekp(static_cast<std::streamoff>(offset));
      f.write(&c, 1);
    };
    flip(index.entries[bad_data].offset + 20);   // a payload byte
    flip(index.entries[bad_length].offset + 1);  // a length byte
    f.close();
    CountingReporter reporter;
    const std::string salvaged = (dir / "salvaged.tfrecord").string();
    records::ReaderOptions salvage;
    salvage.salvage = true;
    salvage.reporter = &reporter;
    records::TFRecordReader reader(damaged, salvage);
    records::TFRecordWriter writer(salvaged);
    std::string_view record;
    while (reader.ReadRecord(&record)) writer.Write(record);
    writer.Close();
    say(
        fmt::format("5. damaged a copy ({}: one payload byte of record {}, "
                    "one length byte of record {}); verify found:",
                    damaged, bad_data, bad_length));
    for (const auto& line : reporter.lines) say("   " + line);
    say(fmt::format("   salvage kept {} of {} records in {}",
                    writer.records_written(), o.records, salvaged));
    report["salvaged_records"] = writer.records_written();
    report["problems_found"] = reporter.lines.size();
  }
  // 6. A real dataset: Fashion-MNIST from Debian's package, converted and
  // streamed back through the input pipeline.
  if (fashion.missing.empty()) {
    convert::ConvertJob job;
    job.format = "idx";
    job.inputs.images = fashion.train_images;
    job.inputs.labels = fashion.train_labels;
    records::MakeDirectories((dir / "fashion-mnist").string());
    job.output = (dir / "fashion-mnist" / "train").string();
    job.shards = 8;
    job.writer.build_index = true;
    const convert::ConvertSummary converted = convert::Convert(job);
    const records::FeatureSpec spec = records::FeatureSpec::FromJsonText(
        R"({"features": {"image": {"kind": "fixed", "dtype": "bytes", "shape": []},
                         "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
    std::vector<std::string> shard_paths;
    for (const auto& shard : converted.shards)
      shard_paths.push_back(shard.path);

    // Stream them through the input pipeline: 4 shards read at once,
    // shuffled, batched, parsed in parallel, prefetched.
    pipeline::TFRecordOptions source;
    source.num_parallel_reads = 4;
    source.shuffle_files = true;
    source.seed = 1;
    pipeline::ParseOptions parse;
    parse.num_parallel_calls = pipeline::kAutotune;
    const pipeline::Dataset ds =
        pipeline::Dataset::FromTFRecords(shard_paths, source)
            .Shuffle(10'000, 7)
            .Batch(256)
            .Parse(spec, parse)
            .Prefetch(2);
    auto labels_of = [](const pipeline::Element& e) {
      const auto v = e["label"].values<int64_t>();
      return std::vector<int64_t>(v.begin(), v.end());
    };
    const auto parse_start = std::chrono::steady_clock::now();
    std::vector<uint64_t> per_class(10);
    std::vector<std::vector<int64_t>> second_half;
    std::string state;
    uint64_t parsed = 0, batches = 0;
    {
      pipeline::Iterator it = ds.MakeIterator();
      pipeline::Element e;
      while (it.Next(&e)) {
        for (int64_t label : labels_of(e))
          ++per_class.at(static_cast<size_t>(label));
        parsed += static_cast<uint64_t>(e["label"].num_elements());
        if (++batches == 100) state = it.Save();
        if (batches > 100) second_half.push_back(labels_of(e));
      }
    }
    const double parse_s = Seconds(parse_start);
    // A new iterator restored from the state saved after batch 100
    // continues with exactly the same batches.
    pipeline::Iterator resumed = ds.MakeIterator();
    resumed.Restore(state);
    pipeline::Element e;
    size_t same = 0, resumed_batches = 0;
    while (resumed.Next(&e)) {
      if (resumed_batches < second_half.size() &&
          labels_of(e) == second_half[resumed_batches]) {
        ++same;
      }
      ++resumed_batches;
    }
    say(fmt::format(
        "6. converted Fashion-MNIST's {} training images from "
        "IDX into 8 indexed shards in {:.2f} s ({}), and streamed "
        "them through the input pipeline (4 shards at once, shuffle 10,000, "
        "batch 256, parallel parse, prefetch) at {:.0f} records/s: {} images "
        "per class",
        converted.records, converted.seconds, (dir / "fashion-mnist").string(),
        parsed / parse_s, fmt::join(per_class, "/")));
    say(fmt::format(
        "   saved the iterator after batch 100 ({} bytes of state); a new "
        "iterator restored from it delivered {} of the remaining {} batches "
        "identically",
        state.size(), same, second_half.size()));

    // 7. A global shuffle through the shards' indexes: every image once, in
    // a uniform random order over all shards.
    pipeline::GlobalShuffleOptions global;
    global.seed = 3;
    pipeline::Iterator shuffled =
        pipeline::Dataset::FromTFRecordsGlobalShuffle(shard_paths, global)
            .Batch(1000)
            .Parse(spec)
            .MakeIterator();
    std::vector<uint64_t> global_class(10);
    uint64_t global_records = 0;
    const auto global_start = std::chrono::steady_clock::now();
    while (shuffled.Next(&e)) {
      for (int64_t label : labels_of(e))
        ++global_class.at(static_cast<size_t>(label));
      global_records += static_cast<uint64_t>(e["label"].num_elements());
    }
    say(fmt::format(
        "7. read all {} images again in a global random order through the "
        "indexes at {:.0f} records/s: {} per class, each image once",
        global_records, global_records / Seconds(global_start),
        fmt::join(global_class, "/")));

    // 8. Train on the shards, evaluate on the 10,000 test images.
    convert::ConvertJob test_job = job;
    test_job.inputs.images = fashion.test_images;
    test_job.inputs.labels = fashion.test_labels;
    test_job.output = (dir / "fashion-mnist" / "test").string();
    test_job.shards = 2;
    const convert::ConvertSummary test_converted = convert::Convert(test_job);
    std::vector<std::string> test_paths;
    for (const auto& shard : test_converted.shards)
      test_paths.push_back(shard.path);
    TrainJob train;
    train.model = o.model;
    train.spec = spec;
    train.train_files = shard_paths;
    train.eval_files = test_paths;
    train.device = o.device;
    train.cuda_graphs = o.cuda_graphs;
    train.model_dir =
        (dir / ("model-" + o.model +
                (o.device == "cpu" ? std::string() : "-" + o.device)))
            .string();
    train.image_shape = {28, 28, 1};
    train.n_classes = 10;
    // About 19 epochs of the DNN (~13 s on 2 cores) and 5 of the CNN
    // (~60 s): each past its accuracy target with room to spare.  The DNN
    // overfits by its 19th epoch without dropout (seeds 1-4: 88.4-89.0%
    // test accuracy); 0.1 gives 88.7-89.4% (docs/PERFORMANCE.md).
    train.steps =
        o.train_steps > 0 ? o.train_steps : (o.model == "cnn" ? 2400 : 9000);
    train.eval_every = o.model == "cnn" ? 800 : 3000;
    train.dropout = o.model == "cnn" ? 0.25f : 0.1f;
    train.live = !o.json && isatty(STDERR_FILENO);
    std::vector<std::string> log_lines;
    train.log = [&](std::string_view line) { log_lines.emplace_back(line); };
    const TrainResult trained = RunTraining(train);
    const double accuracy = trained.eval.at("accuracy");
    say(fmt::format(
        "8. trained a {} on them ({} steps of {} images, shuffled through the "
        "pipeline) in {:.1f} s at {:.0f} images/s on {}, and evaluated it on "
        "the "
        "{} test images: accuracy {:.2f}% (loss {:.4f})",
        o.model == "cnn" ? "CNN (conv 32, conv 64, dense 128)"
                         : "DNN (hidden 256, 128)",
        trained.global_step, train.batch, trained.train_seconds,
        trained.examples_per_s, trained.device, test_converted.records,
        100 * accuracy, trained.eval.at("loss")));
    say(
        fmt::format("   checkpoints (with the input's position) and "
                    "TensorBoard logs: {}   (tensorboard --logdir {})",
                    trained.model_dir, trained.model_dir));
    report["test_accuracy"] = accuracy;
    report["model"] = o.model;
    report["device"] = trained.device;
    report["model_dir"] = trained.model_dir;
    report["train_seconds"] = trained.train_seconds;
    report["examples_per_s"] = trained.examples_per_s;
    report["global_step"] = trained.global_step;
    report["cuda_graph_launches"] = trained.graph_launches;
    report["fashion_mnist"] = {
        {"data", fashion.dir.string()},
        {"records", converted.records},
        {"convert_seconds", converted.seconds},
        {"pipeline_records_per_s", parsed / parse_s},
        {"restored_batches_identical", same},
        {"restored_batches_expected", second_half.size()},
        {"state_bytes", state.size()},
        {"global_shuffle_records", global_records}};
  } else {
    say("6. skipped Fashion-MNIST: " + FashionMnistHelp(fashion));
    report["fashion_mnist_missing"] = fashion.missing;
  }
  say("Try: recflow verify " + (dir / "damaged.tfrecord").string() +
      "   recflow count --json " + (dir / "shards").string() +
      "   recflow inspect " + (dir / "fashion-mnist").string());
  report["records"] = o.records;
  if (o.json) fmt::print("{}\n", report.dump());
  return kExitOk;
}

}  // namespace

Runner AddDemoCommand(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  app.add_option("--workdir", o->workdir,
                 "where to write the sample files (default: $TMPDIR/"
                 "recflow-demo); emptied first, so it must be new, empty, "
                 "or a folder of an earlier demo");
  app.add_option("--records", o->records, "records in the sample dataset")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{100}, uint64_t{100000000}));
  app.add_option("--device", o->device,
                 "where the model trains: cpu, cuda (GPU 0) or cuda:N")
      ->capture_default_str();
  app.add_flag("--cuda-graphs,!--no-cuda-graphs", o->cuda_graphs,
               "on a GPU, launch each training step as one CUDA graph (the "
               "default), or each call by itself");
  app.add_option("--model", o->model,
                 "the model trained on Fashion-MNIST: dnn or cnn")
      ->capture_default_str()
      ->check(CLI::IsMember({"dnn", "cnn"}));
  app.add_option("--train-steps", o->train_steps,
                 "training steps (default: 9000 dnn, 2400 cnn)")
      ->check(Positive());
  app.add_option("--data", o->data,
                 "folder with Fashion-MNIST's four IDX files (train-images-"
                 "idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                 "t10k-labels-idx1-ubyte; each .gz or not); default: "
                 "/usr/share/datasets/fashion-mnist (Debian's "
                 "dataset-fashion-mnist)");
  app.add_flag("--json", o->json,
               "print one JSON object as the last line instead of the story");
  return [o] { return RunDemo(*o); };
}

}  // namespace recflow::tools
