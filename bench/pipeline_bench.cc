// Pipeline benchmarks: each next to its baseline in the same run.
//
//   Parse/*          read -> batch(256) -> parse: the parse-only throughput
//   ParseInto/threads:T/memory:M  Parse with M = 1: every batch copied into
//                    an output memory (IteratorOptions::output_memory, a
//                    caching allocator as the GPU's pinned one), M = 0: not;
//                    what delivering batches in pinned memory costs the
//                    pipeline's threads
//   Full/*           read -> shuffle(10000) -> batch(256) -> parse
//   FullPerRecord/*  read -> parse -> shuffle(10000) -> batch(256)
//   ProtobufParse    read -> protobuf ParseFromArray into a reused Example
//   Read/*           records only, io_uring vs pread (cached files)
//   Epochs/grace_ms:G  Full, a new iterator per epoch (as a Python loop
//                    makes), with the block arena's grace G ms (0: empty
//                    slabs unmapped as each iterator ends, the old way)
//   ConsumerNext/threads:T/work_us:W  what the consumer's thread pays in
//                    Next() per batch (a GPU's training thread busy W us
//                    a step), Prefetch(2) over the fused shuffled pipeline
//   RecordsFromMemory/MiB/random  the memory cost of a shuffle buffer:
//                    850-byte records copied out of an arena of MiB, in
//                    order against in a random order (next to each other)
//   RaggedSlices/N   FromTensorSlices over N ragged rows: items/s must not
//                    fall as N grows (10,000 against 80,000)
//   FusedPlanner/threads:T/planner_task:P/shuffle:S  the fused stage's
//                    planner on the consumer's thread (P = 0, the default)
//                    against in a task of its own (P = 1), over
//                    Fashion-MNIST-like files (16 x
//                    4,096 Examples of ~850 bytes: 784 image bytes, label,
//                    height, width; all 16 read at once), shuffled
//                    (10,000; S = 1), each file shuffled by its reader
//                    (16 buffers of 625, shuffle_buffer_per_file; S = 2) or
//                    not (S = 0), 4 epochs, batches of 256 parsed on T
//                    threads (on 16 cores P = 1 made 0.80-0.98x P = 0's
//                    records/s at 8 and 16 threads)
//   DataSource/order:O  random access (TFRecordDataSource) on one thread:
//                    batches of 256 parsed, the epoch's records in order
//                    (O = 0, slices) or in a seeded random order (O = 1),
//                    next to GlobalShuffle/threads:1 (O = 2: the
//                    streaming form of the same random reads, indexes
//                    built in memory) and Parse/1 (the stream in order)
//   BytesColumn/values:N/use:U  a batch's image column (N values of 784
//                    bytes, as the fused parse makes it) asked on the
//                    thread that launches a GPU step: U = 0, one pass over
//                    its offsets (the floor), 1, decode_raw's length check
//                    (FirstBytesNotOfLength), 2, BytesAsUInt8 (HostNumeric,
//                    Prefetch's KeyOf); three of these a step
//   TextLines/gzip:G FromTextLines over 400,000 lines of 10-90 bytes (~20
//                    MB; G = 1: the same gzipped), next to GetLine/gzip:G,
//                    the floor: the same lines read with std::getline
//                    (G = 0) or zlib's gzgets (G = 1) into one reused
//                    buffer, with no element made per line
//   TextLinesParallel/reads:R  the same lines as 4 gzipped files, through
//                    FromTextLines with num_parallel_reads R (1: one file
//                    after another; 2, 4: a parallel Interleave)
//   FixedLengthParallel/reads:R  the same over 4 gzipped files of 2,500
//                    CIFAR-10-sized records (3,073 bytes)
//
// The files: 4 x 8,192 MNIST-like Examples (784 floats and an int64 label,
// about 3.2 KB each, ~100 MB) written once under $TMPDIR.  Items are
// records; compare ratios within one run (docs/PERFORMANCE.md).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "pipeline/block_arena.h"
#include "pipeline/data_source.h"
#include "pipeline/dataset.h"
#include "pipeline/maps.h"
#include "pipeline/process.h"
#include "pipeline/stages.h"
#include "records/example.pb.h"
#include "records/example_builder.h"
#include "records/feature_spec.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

namespace recflow::pipeline {
namespace {

constexpr int kFiles = 4;
constexpr int kRecordsPerFile = 8192;
constexpr int64_t kBatch = 256;
constexpr int64_t kShuffle = 10000;

// $TMPDIR/recflow_pipeline_bench (made if missing), where the benchmarks'
// files are written once and kept for later runs.
std::filesystem::path BenchDir() {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(tmp ? tmp : "/tmp") / "recflow_pipeline_bench";
  std::filesystem::create_directories(dir);
  return dir;
}

// `files` files STEM-F.tfrecord (with `compression`'s suffix) under
// BenchDir(), each written by `write` unless it is there already (from an
// earlier run; the writer is atomic, so a file there is whole).
std::vector<std::string> WrittenOnce(
    std::string_view stem, int files,
    const std::function<void(records::TFRecordWriter&)>& write,
    records::Compression compression = records::Compression::kNone) {
  const std::filesystem::path dir = BenchDir();
  std::vector<std::string> out;
  for (int f = 0; f < files; ++f) {
    out.push_back((dir / fmt::format("{}-{}.tfrecord{}", stem, f,
                                     records::CompressionSuffix(compression)))
                      .string());
    if (std::filesystem::exists(out.back())) continue;
    records::TFRecordWriter w(out.back(), {.compression = compression});
    write(w);
    w.Close();
  }
  return out;
}

const std::vector<std::string>& Files() {
  static const std::vector<std::string> files = [] {
    TuneAllocatorForBatches();
    std::mt19937_64 rng(3);
    records::ExampleBuilder b;
    std::vector<float> image(784);
    return WrittenOnce("mnist", kFiles, [&](records::TFRecordWriter& w) {
      for (int r = 0; r < kRecordsPerFile; ++r) {
        for (auto& v : image) v = static_cast<float>(rng() % 256) / 255.f;
        b.Clear();
        b.AddFloatList("image", image);
        b.AddInt64("label", static_cast<int64_t>(rng() % 10));
        w.Write(b.Serialize());
      }
    });
  }();
  return files;
}

records::FeatureSpec Spec() {
  return records::FeatureSpec::FromJsonText(R"({"features": {
    "image": {"kind": "fixed", "dtype": "float32", "shape": [784]},
    "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
}

// Runs the pipeline to its end once per iteration; items = records.
void Drain(benchmark::State& state, const Dataset& ds, int threads,
           std::shared_ptr<Allocator> memory = nullptr, bool optimize = true) {
  int64_t records = 0;
  for (auto _ : state) {
    Iterator it = ds.MakeIterator(
        {.threads = threads, .optimize = optimize, .output_memory = memory});
    Element e;
    while (it.Next(&e)) {
      records += e.components[0].tensor.shape().rank() > 0
                     ? e.components[0].tensor.num_rows()
                     : 1;
    }
  }
  state.SetItemsProcessed(records);
}

ParseOptions Calls(int n) {
  ParseOptions p;
  p.num_parallel_calls = n;
  return p;
}

void BM_Parse(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Drain(state,
        Dataset::FromTFRecords(Files()).Batch(kBatch).Parse(Spec(),
                                                            Calls(threads)),
        threads);
}
BENCHMARK(BM_Parse)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Parse's pipeline with its files split in two datasets and mixed again
// by `mix`, every record once: state.range(1) (mixed) 1 fused (each input
// read by reader tasks, the picks planned, the batches parsed straight
// from the read buffers), next to the same pipeline unmixed (mixed:0,
// BM_Parse's) and to the mixture run stage by stage (mixed:2,
// IteratorOptions::optimize false: each input read record by record, the
// batch stacked, then parsed), which is how a mixture ran before it was
// fused.  `first` reads the first half (and, unmixed, all the files); the
// second half is streamed.
using FilesSource = std::function<Dataset(std::vector<std::string>)>;
Dataset Streamed(std::vector<std::string> files) {
  return Dataset::FromTFRecords(std::move(files));
}
void DrainMixed(benchmark::State& state,
                const std::function<Dataset(Dataset, Dataset)>& mix,
                const FilesSource& first = Streamed) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t mixed = state.range(1);
  const std::vector<std::string>& files = Files();
  if (mixed == 0) {
    Drain(state, first(files).Batch(kBatch).Parse(Spec(), Calls(threads)),
          threads);
    return;
  }
  const auto half = static_cast<std::ptrdiff_t>(files.size() / 2);
  const Dataset a = first({files.begin(), files.begin() + half});
  const Dataset b = Streamed({files.begin() + half, files.end()});
  Drain(state, mix(a, b).Batch(kBatch).Parse(Spec(), Calls(threads)), threads,
        nullptr, /*optimize=*/mixed == 1);
}

// SampleFromDatasets, weights alike.
void BM_SampleFromDatasets(benchmark::State& state) {
  DrainMixed(state, [](Dataset a, Dataset b) {
    return Dataset::SampleFromDatasets({a, b}, {.seed = 1});
  });
}
BENCHMARK(BM_SampleFromDatasets)
    ->ArgNames({"threads", "mixed"})
    ->ArgsProduct({{1, 2}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ChooseFromDatasets round robin (tf.data's example: a range repeated),
// on past the first input's end: its choice dataset runs as written, a
// choice a record, fused or not; mixed:3 runs as many choices alone (as
// many as BM_Parse's records), what they cost on their own.
void BM_ChooseFromDatasets(benchmark::State& state) {
  const Dataset choices = Dataset::Range(0, 2).Repeat();
  if (state.range(1) == 3) {
    Drain(state, choices.Take(kFiles * kRecordsPerFile), 1);
    return;
  }
  DrainMixed(state, [&](Dataset a, Dataset b) {
    return Dataset::ChooseFromDatasets({a, b}, choices,
                                       /*stop_on_empty_dataset=*/false);
  });
}
BENCHMARK(BM_ChooseFromDatasets)
    ->ArgNames({"threads", "mixed"})
    ->ArgsProduct({{1, 2}, {0, 1, 2}})
    ->Args({1, 3})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A global shuffle of half of BM_Parse's files mixed with the other half
// streamed (SampleFromDatasets, weights alike): mixed:1 fused (the global
// shuffle's records read by the parse calls, the stream's by reader
// tasks), mixed:2 stage by stage, as it ran before; mixed:0 the global
// shuffle of all the files alone, fused.
void BM_GlobalShuffleInAMixture(benchmark::State& state) {
  DrainMixed(
      state,
      [](Dataset g, Dataset b) {
        return Dataset::SampleFromDatasets({g, b}, {.seed = 1});
      },
      [](std::vector<std::string> files) {
        GlobalShuffleOptions o;
        o.seed = 1;
        return Dataset::FromTFRecordsGlobalShuffle(std::move(files), o);
      });
}
BENCHMARK(BM_GlobalShuffleInAMixture)
    ->ArgNames({"threads", "mixed"})
    ->ArgsProduct({{1, 2}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A hold-out split as tutorials write it: the first 10,000 records
// skipped (kept for evaluation), the rest shuffled, batched and parsed;
// fused:1 runs Skip on the fused path, fused:0 stage by stage
// (IteratorOptions::optimize false), as it ran before Skip was fused.
void BM_SkipThenShuffle(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Drain(state,
        Dataset::FromTFRecords(Files())
            .Skip(10000)
            .Shuffle(kShuffle, 1)
            .Batch(kBatch)
            .Parse(Spec(), Calls(threads)),
        threads, nullptr, /*optimize=*/state.range(1) == 1);
}
BENCHMARK(BM_SkipThenShuffle)
    ->ArgNames({"threads", "fused"})
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Host memory that keeps freed blocks by size for the next request, as
// the CUDA backend's pinned caching allocator does (without pinning).
class CachingHostMemory final : public Allocator {
 public:
  ~CachingHostMemory() override {
    for (auto& [bytes, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
  }
  void* Allocate(size_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& blocks = free_[bytes];
      if (!blocks.empty()) {
        void* p = blocks.back();
        blocks.pop_back();
        return p;
      }
    }
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) throw Error("out of memory");
    return p;
  }
  void Deallocate(void* p, size_t bytes) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    free_[bytes].push_back(p);
  }
  MemoryKind kind() const override { return MemoryKind::kPinnedHost; }
  std::string name() const override { return "caching host memory"; }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
};

void BM_ParseInto(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Drain(state,
        Dataset::FromTFRecords(Files()).Batch(kBatch).Parse(Spec(),
                                                            Calls(threads)),
        threads,
        state.range(1) ? std::make_shared<CachingHostMemory>() : nullptr);
}
BENCHMARK(BM_ParseInto)
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->ArgNames({"threads", "memory"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Full(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Drain(state,
        Dataset::FromTFRecords(Files())
            .Shuffle(kShuffle, 1)
            .Batch(kBatch)
            .Parse(Spec(), Calls(threads)),
        threads);
}
BENCHMARK(BM_Full)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_FullPerRecord(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Drain(state,
        Dataset::FromTFRecords(Files())
            .Parse(Spec(), Calls(threads))
            .Shuffle(kShuffle, 1)
            .Batch(kBatch),
        threads);
}
void BM_DataSource(benchmark::State& state) {
  const int64_t order = state.range(0);
  if (order == 2) {
    GlobalShuffleOptions o;
    o.seed = 1;
    Drain(state,
          Dataset::FromTFRecordsGlobalShuffle(Files(), o)
              .Batch(kBatch)
              .Parse(Spec(), Calls(1)),
          1);
    return;
  }
  const TFRecordDataSource source(Files(), Spec());
  std::vector<uint64_t> rows(source.size());
  std::iota(rows.begin(), rows.end(), uint64_t{0});
  if (order == 1) std::shuffle(rows.begin(), rows.end(), std::mt19937_64(1));
  int64_t records = 0;
  for (auto _ : state) {
    for (size_t first = 0; first < rows.size(); first += kBatch) {
      const size_t n = std::min<size_t>(kBatch, rows.size() - first);
      const Element e =
          source.Get(std::span<const uint64_t>(rows.data() + first, n), true);
      records += e.components[0].tensor.num_rows();
    }
  }
  state.SetItemsProcessed(records);
}
BENCHMARK(BM_DataSource)
    ->ArgName("order")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Four epochs of Full, each through a new iterator, as `for batch in
// dataset` makes one per epoch.  With grace 0 the read blocks' slabs are
// unmapped when each iterator ends and the next one faults in and clears
// them again; with the default grace it reuses them.
void BM_Epochs(benchmark::State& state) {
  SetBlockSlabGrace(std::chrono::milliseconds(state.range(0)));
  const Dataset ds = Dataset::FromTFRecords(Files())
                         .Shuffle(kShuffle, 1)
                         .Batch(kBatch)
                         .Parse(Spec(), Calls(1));
  int64_t records = 0;
  for (auto _ : state) {
    for (int epoch = 0; epoch < 4; ++epoch) {
      Iterator it = ds.MakeIterator({.threads = 1});
      Element e;
      while (it.Next(&e)) records += e.components[0].tensor.num_rows();
    }
  }
  state.SetItemsProcessed(records);
  SetBlockSlabGrace(kDefaultBlockSlabGrace);
}
BENCHMARK(BM_Epochs)
    ->ArgName("grace_ms")
    ->Arg(0)
    ->Arg(kDefaultBlockSlabGrace.count())
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_FullPerRecord)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The generic baseline: protobuf's parser on the same records, one thread.
void BM_ProtobufParse(benchmark::State& state) {
  int64_t records = 0;
  tensorflow::Example example;
  for (auto _ : state) {
    for (const auto& f : Files()) {
      records::TFRecordReader reader(f);
      std::string_view r;
      while (reader.ReadRecord(&r)) {
        if (!example.ParseFromArray(r.data(), static_cast<int>(r.size()))) {
          state.SkipWithError("not an Example");
          return;
        }
        benchmark::DoNotOptimize(example);
        ++records;
      }
    }
  }
  state.SetItemsProcessed(records);
}
BENCHMARK(BM_ProtobufParse)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Read(benchmark::State& state) {
  TFRecordOptions o;
  o.io.backend = state.range(0) ? IoBackend::kIoUring : IoBackend::kPread;
  state.SetLabel(state.range(0) ? "io_uring" : "pread");
  int64_t records = 0, bytes = 0;
  for (auto _ : state) {
    Iterator it =
        Dataset::FromTFRecords(Files(), o).MakeIterator({.threads = 1});
    Element e;
    while (it.Next(&e)) {
      ++records;
      bytes += static_cast<int64_t>(e.components[0].tensor.byte_size());
    }
  }
  state.SetItemsProcessed(records);
  state.SetBytesProcessed(bytes);
}
BENCHMARK(BM_Read)
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// What a shuffle's records cost in memory alone, with no parsing: a
// Fashion-MNIST Example is 850 bytes, and a shuffle of 10,000 of them
// reads each from anywhere in the ~30 MiB of read blocks it holds, where
// a parse-only pipeline reads records just copied in, in order.  Each
// record is copied out (as the parser copies an image's bytes) with the
// parser's prefetch (the lines of the record 4 ahead), from an arena of
// range(0) MiB in huge-page slabs (as the read blocks are), in order
// (range(1) = 0) or in a random order (1).  An arena that fits the
// last-level cache against one that does not says how much of a shuffled
// pipeline's extra time per record is the memory's (docs/PERFORMANCE.md).
void BM_RecordsFromMemory(benchmark::State& state) {
  constexpr size_t kRecord = 850, kStride = 896, kAhead = 4;
  const size_t slabs =
      std::max<size_t>(static_cast<size_t>(state.range(0)) / 2, 1);
  std::vector<char*> arena(slabs);
  for (char*& slab : arena) {
    slab = AllocateBlock(kBlockSlabBytes);
    std::memset(slab, 1, kBlockSlabBytes);
  }
  const size_t per_slab = kBlockSlabBytes / kStride;
  const size_t n = slabs * per_slab;
  std::vector<const char*> order(n);
  for (size_t i = 0; i < n; ++i) {
    order[i] = arena[i / per_slab] + (i % per_slab) * kStride;
  }
  if (state.range(1) != 0) {
    std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  }
  std::vector<char> out(kRecord);
  int64_t records = 0;
  for (auto _ : state) {
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) {
        for (size_t k = 0; k < kRecord; k += 64) {
          __builtin_prefetch(order[i + kAhead] + k, 0, 3);
        }
      }
      std::memcpy(out.data(), order[i], kRecord);
      benchmark::DoNotOptimize(out.data());
      benchmark::ClobberMemory();
    }
    records += static_cast<int64_t>(n);
  }
  for (char* slab : arena) FreeBlock(slab, kBlockSlabBytes);
  state.SetItemsProcessed(records);
  state.SetLabel(fmt::format("{} MiB, {}", slabs * 2,
                             state.range(1) ? "random" : "in order"));
}
BENCHMARK(BM_RecordsFromMemory)
    ->ArgsProduct({{8, 16, 32}, {0, 1}})
    ->ArgNames({"MiB", "random"})
    ->UseRealTime();

// The last stage's counters where it is asynchronous (a Prefetch's), else
// a default StageStats (no buffer, no wakes).
StageStats LastAsyncStage(const Iterator& it) {
  StageStats last;
  for (const StageStats& s : it.Stats()) {
    if (s.buffered >= 0) last = s;
  }
  return last;
}

// Takes 100 elements of `it` (buffers filled), then one per iteration,
// the consumer busy `work` after each (the host's share of a step); the
// mean time inside Next() alone goes to counter next_us.  Of the last
// asynchronous stage (a Prefetch): the takes that woke its driver
// (StageStats::wakes, a system call each) and those that left its buffer
// empty (the next take may wait), a share of the takes each
// (wakes_per_take, emptied_per_take).  Returns the elements taken in the
// timed loop.
int64_t TimeNext(benchmark::State& state, Iterator& it,
                 std::chrono::microseconds work) {
  Element e;
  for (int i = 0; i < 100; ++i) it.Next(&e);
  double in_next = 0;
  int64_t taken = 0;
  int64_t emptied = 0;
  const uint64_t wakes_before = LastAsyncStage(it).wakes;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    it.Next(&e);
    const auto t1 = std::chrono::steady_clock::now();
    in_next += std::chrono::duration<double>(t1 - t0).count();
    ++taken;
    // Inside the consumer's work: read after Next, not timed in it.
    emptied += LastAsyncStage(it).buffered == 0 ? 1 : 0;
    while (std::chrono::steady_clock::now() - t1 < work) {
    }
  }
  const auto per_take = [&](double n) {
    return n / static_cast<double>(std::max<int64_t>(taken, 1));
  };
  state.counters["next_us"] = per_take(in_next) * 1e6;
  state.counters["wakes_per_take"] =
      per_take(static_cast<double>(LastAsyncStage(it).wakes - wakes_before));
  state.counters["emptied_per_take"] = per_take(static_cast<double>(emptied));
  return taken;
}

// What the consumer's thread pays per batch for its input when the
// pipeline keeps up, as a GPU's training thread takes a batch between
// launching steps: Prefetch(2) over the fused shuffle -> batch(128) ->
// parse on range(0) threads, the consumer busy range(1) us per batch (the
// host's share of a step) and timed inside Next() alone (next_us).  With
// work 0 the consumer waits for each batch: the pipeline's own rate.
void BM_ConsumerNext(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Iterator it = Dataset::FromTFRecords(Files())
                    .Shuffle(kShuffle, 1)
                    .Repeat()
                    .Batch(128)
                    .Parse(Spec(), Calls(threads))
                    .Prefetch(2)
                    .MakeIterator({.threads = threads});
  const int64_t batches =
      TimeNext(state, it, std::chrono::microseconds(state.range(1)));
  state.SetItemsProcessed(batches * 128);
}
// 1 and 2 threads, and every core where there are more.
void ConsumerArgs(benchmark::internal::Benchmark* b) {
  const int all = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<int> counts = {1, 2};
  if (all > 2) counts.push_back(all);
  for (int threads : counts) {
    for (int work_us : {0, 200}) b->Args({threads, work_us});
  }
  b->ArgNames({"threads", "work_us"})->UseRealTime();
}
BENCHMARK(BM_ConsumerNext)->Apply(ConsumerArgs);

// A cheap per-element map (a cast, well under a microsecond) with
// range(0) parallel calls, next to range(0) = 1, the map on the consumer's
// thread, in the same run: what the parallel map's hand-over costs per
// element, on range(1) iterator threads.
void BM_MapCalls(benchmark::State& state) {
  const int calls = static_cast<int>(state.range(0));
  MapOptions o;
  o.num_parallel_calls = calls;
  constexpr int64_t kElements = 100000;
  for (auto _ : state) {
    Iterator it =
        Dataset::Range(0, kElements)
            .Map(maps::Cast("value", DType::kInt32), o)
            .Batch(256)
            .MakeIterator({.threads = static_cast<int>(state.range(1))});
    Element e;
    int64_t n = 0;
    while (it.Next(&e)) n += e["value"].shape().dims()[0];
    if (n != kElements) state.SkipWithError("elements lost");
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}
BENCHMARK(BM_MapCalls)
    ->ArgsProduct({{1, 2}, {1, 2}})
    ->ArgNames({"calls", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// What taking an element from a full Prefetch(2) costs the consumer when
// the input is not the bottleneck (Range -> Batch(128), ~40 us a batch
// on this project's VM, under the consumer's range(0) us): no waiting
// for data, only the hand-off, which wakes the driver sleeping on a full
// buffer (a system call; where its core went idle, an interrupt to it).
// The training thread of a GPU step paid this in Next() every step;
// polls:1 is IteratorOptions::prefetch_polls, which the Estimator sets on
// a GPU: the driver looks for room on a timer and a take that leaves an
// element buffered wakes nothing.
void BM_PrefetchPop(benchmark::State& state) {
  Iterator it =
      Dataset::Range(0, int64_t{1} << 40)
          .Batch(128)
          .Prefetch(2)
          .MakeIterator({.threads = 1, .prefetch_polls = state.range(1) != 0});
  TimeNext(state, it, std::chrono::microseconds(state.range(0)));
}
BENCHMARK(BM_PrefetchPop)
    ->ArgsProduct({{50, 100, 130, 200, 400}, {0, 1}})
    ->ArgNames({"work_us", "polls"})
    ->UseRealTime();

// FromTensorSlices over a ragged tensor of N rows of 3 values: the time a
// row must not grow with N (it did: each row's start was summed anew).
void BM_RaggedSlices(benchmark::State& state) {
  const int64_t n = state.range(0);
  records::AlignedVector<int64_t> lengths(static_cast<size_t>(n), 3);
  records::AlignedVector<int64_t> values(static_cast<size_t>(3 * n), 7);
  Element e;
  e.Set("ids", Tensor::Ragged(Tensor::Adopt(std::move(values), Shape{3 * n}),
                              Tensor::Adopt(std::move(lengths), Shape{n})));
  const Dataset ds = Dataset::FromTensorSlices(e);
  for (auto _ : state) {
    Iterator it = ds.MakeIterator();
    Element row;
    int64_t rows = 0;
    while (it.Next(&row)) ++rows;
    benchmark::DoNotOptimize(rows);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_RaggedSlices)
    ->Arg(10000)
    ->Arg(80000)
    ->Unit(benchmark::kMillisecond);

// A bytes column of one length, back to back (the parser's output), and
// what the launching thread of a GPU step does with it (the header).
void BM_BytesColumn(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  const int64_t use = state.range(1);
  constexpr uint64_t kEach = 784;
  std::string data(n * kEach, 'x');
  records::AlignedVector<uint64_t> offsets;
  for (size_t k = 0; k <= n; ++k) offsets.push_back(k * kEach);
  // The floor's own copy of the offsets: one pass over n + 1 integers.
  const std::vector<uint64_t> floor(offsets.begin(), offsets.end());
  const Tensor column = Tensor::AdoptBytes(std::move(data), std::move(offsets),
                                           Shape{static_cast<int64_t>(n)});
  for (auto _ : state) {
    if (use == 0) {
      bool one_length = true;
      for (size_t k = 0; k < n; ++k) {
        one_length &= floor[k + 1] - floor[k] == kEach;
      }
      benchmark::DoNotOptimize(one_length);
      benchmark::ClobberMemory();
    } else if (use == 1) {
      benchmark::DoNotOptimize(column.FirstBytesNotOfLength(kEach));
    } else {
      const Tensor raw = column.BytesAsUInt8();
      benchmark::DoNotOptimize(raw.raw_data());
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_BytesColumn)
    ->ArgsProduct({{128, 256}, {0, 1, 2}})
    ->ArgNames({"values", "use"});

// 16 files of 4,096 Fashion-MNIST-like Examples (random image bytes),
// written once under $TMPDIR.
const std::vector<std::string>& FashionFiles() {
  static const std::vector<std::string> files = [] {
    std::mt19937_64 rng(5);
    records::ExampleBuilder b;
    std::string image(784, '\0');
    return WrittenOnce("fashion", 16, [&](records::TFRecordWriter& w) {
      for (int r = 0; r < 4096; ++r) {
        for (char& c : image) c = static_cast<char>(rng() % 256);
        b.Clear();
        b.AddBytes("image", image);
        b.AddInt64("label", static_cast<int64_t>(rng() % 10));
        b.AddInt64("height", 28);
        b.AddInt64("width", 28);
        w.Write(b.Serialize());
      }
    });
  }();
  return files;
}

void BM_FusedPlanner(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  stages::SetPlanInTask(static_cast<int>(state.range(1)));
  TFRecordOptions all_at_once;
  all_at_once.num_parallel_reads = 16;
  if (state.range(2) == 2) {
    all_at_once.shuffle_buffer_per_file = kShuffle / 16;
    all_at_once.seed = 1;
  }
  Dataset ds = Dataset::FromTFRecords(FashionFiles(), all_at_once);
  if (state.range(2) == 1) ds = ds.Shuffle(kShuffle, 1);
  ds = ds.Repeat(4).Batch(kBatch).Parse(
      records::FeatureSpec::FromJsonText(R"({"features": {
        "height": {"kind": "fixed", "dtype": "int64", "shape": []},
        "image": {"kind": "fixed", "dtype": "bytes", "shape": []},
        "label": {"kind": "fixed", "dtype": "int64", "shape": []},
        "width": {"kind": "fixed", "dtype": "int64", "shape": []}}})"),
      Calls(threads));
  Drain(state, ds, threads);
  stages::SetPlanInTask(-1);
}
// 4 and 8 threads, and every core where there are more.
void FusedPlannerArgs(benchmark::internal::Benchmark* b) {
  const int all = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<int> counts = {4, 8};
  if (all > 8) counts.push_back(all);
  for (int threads : counts) {
    for (int shuffle : {1, 2, 0}) {
      for (int task : {0, 1}) b->Args({threads, task, shuffle});
    }
  }
  b->ArgNames({"threads", "planner_task", "shuffle"})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}
BENCHMARK(BM_FusedPlanner)->Apply(FusedPlannerArgs);

constexpr int64_t kTextLines = 400000;

// `data` gzipped into `path`, through a temporary name (so that a file
// there is whole).
void WriteGzip(const std::string& path, const std::string& data) {
  gzFile gz = gzopen((path + ".tmp").c_str(), "wb");
  gzwrite(gz, data.data(), static_cast<unsigned>(data.size()));
  gzclose(gz);
  std::filesystem::rename(path + ".tmp", path);
}

// Iterates `ds` on one thread, counting its elements, each as
// `items_per_element` items (a batch's records); an iteration that gives
// other than `expected` elements is an error.
void CountElements(benchmark::State& state, const Dataset& ds, int64_t expected,
                   int64_t items_per_element = 1) {
  int64_t total = 0;
  for (auto _ : state) {
    Iterator it = ds.MakeIterator({.threads = 1});
    Element e;
    int64_t n = 0;
    while (it.Next(&e)) ++n;
    if (n != expected) state.SkipWithError("elements lost");
    total += n;
  }
  state.SetItemsProcessed(total * items_per_element);
}

// The files `names` under BenchDir(), written by `write` (given their
// paths) unless every one is there.
std::vector<std::string> EnsureFiles(
    const std::vector<std::string>& names,
    const std::function<void(const std::vector<std::string>&)>& write) {
  const std::filesystem::path dir = BenchDir();
  std::vector<std::string> paths;
  for (const std::string& name : names) paths.push_back((dir / name).string());
  if (!std::all_of(paths.begin(), paths.end(), [](const std::string& path) {
        return std::filesystem::exists(path);
      })) {
    write(paths);
  }
  return paths;
}

// [plain, gzipped]: kTextLines lines of 10-90 bytes, written once under
// BenchDir() (through a temporary name, so that a file there is whole).
const std::vector<std::string>& TextFiles() {
  static const std::vector<std::string> files = EnsureFiles(
      {"lines.txt", "lines.txt.gz"}, [](const std::vector<std::string>& out) {
        std::mt19937_64 rng(5);
        std::string text;
        for (int64_t i = 0; i < kTextLines; ++i) {
          std::string line(10 + rng() % 81, ' ');
          for (char& c : line) c = static_cast<char>('a' + rng() % 26);
          text += line + "\n";
        }
        std::ofstream(out[0] + ".tmp", std::ios::binary) << text;
        std::filesystem::rename(out[0] + ".tmp", out[0]);
        WriteGzip(out[1], text);
      });
  return files;
}

void BM_TextLines(benchmark::State& state) {
  const std::string& path = TextFiles()[static_cast<size_t>(state.range(0))];
  CountElements(state, Dataset::FromTextLines({path}), kTextLines);
}
BENCHMARK(BM_TextLines)
    ->ArgName("gzip")
    ->DenseRange(0, 1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_GetLine(benchmark::State& state) {
  const std::string& path = TextFiles()[static_cast<size_t>(state.range(0))];
  int64_t lines = 0;
  for (auto _ : state) {
    int64_t n = 0;
    if (state.range(0) == 0) {
      std::ifstream in(path, std::ios::binary);
      std::string line;
      while (std::getline(in, line)) ++n;
    } else {
      gzFile gz = gzopen(path.c_str(), "rb");
      gzbuffer(gz, 256 << 10);
      char line[4096];
      while (gzgets(gz, line, sizeof line) != nullptr) ++n;
      gzclose(gz);
    }
    if (n != kTextLines) state.SkipWithError("lines lost");
    lines += n;
  }
  state.SetItemsProcessed(lines);
}
BENCHMARK(BM_GetLine)
    ->ArgName("gzip")
    ->DenseRange(0, 1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// names[f]: `pattern` formatted with f and `files`.
std::vector<std::string> ShardNames(std::string_view pattern, int files) {
  std::vector<std::string> names;
  for (int f = 0; f < files; ++f) {
    names.push_back(fmt::format(fmt::runtime(pattern), f, files));
  }
  return names;
}

// The same lines gzipped as kTextFiles files of kTextLines / kTextFiles
// lines each, written once as TextFiles' are.
constexpr int kTextFiles = 4;
const std::vector<std::string>& GzipTextShards() {
  static const std::vector<std::string> files =
      EnsureFiles(ShardNames("lines.txt.{}-of-{}.gz", kTextFiles),
                  [](const std::vector<std::string>& out) {
                    std::ifstream in(TextFiles()[0], std::ios::binary);
                    std::string line;
                    for (const std::string& path : out) {
                      std::string text;
                      for (int64_t i = 0; i < kTextLines / kTextFiles; ++i) {
                        std::getline(in, line);
                        text += line + "\n";
                      }
                      WriteGzip(path, text);
                    }
                  });
  return files;
}

// The options of a benchmark's plain-file source: compression by each
// file's name, num_parallel_reads its argument.
PlainFileOptions ParallelReads(const benchmark::State& state) {
  return {.compression = std::nullopt,
          .num_parallel_reads = static_cast<int>(state.range(0)),
          .buffer_bytes = size_t{256} << 10};
}
void ParallelReadsArgs(benchmark::internal::Benchmark* b) {
  b->ArgName("reads")
      ->Arg(1)
      ->Arg(2)
      ->Arg(4)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

// FromTextLines over the gzipped shards with num_parallel_reads R: R = 1
// reads the files one after another on the consumer's thread, R > 1 reads
// and decodes R files at once, each on a thread of its own (a parallel
// Interleave), in the same order.
void BM_TextLinesParallel(benchmark::State& state) {
  CountElements(state,
                Dataset::FromTextLines(GzipTextShards(), ParallelReads(state)),
                kTextLines);
}
BENCHMARK(BM_TextLinesParallel)->Apply(ParallelReadsArgs);

// CIFAR-10's layout: kRecordFiles gzipped files of kFixedRecords records
// of 3,073 bytes (a label byte and 32x32x3 pixels of 16 levels, so that
// gzip has work to do), written once as TextFiles' are.
constexpr int kRecordFiles = 4;
constexpr int64_t kFixedRecords = 2500;
constexpr uint64_t kFixedRecordBytes = 3073;
const std::vector<std::string>& GzipRecordShards() {
  static const std::vector<std::string> files =
      EnsureFiles(ShardNames("records.{}-of-{}.bin.gz", kRecordFiles),
                  [](const std::vector<std::string>& out) {
                    std::mt19937_64 rng(11);
                    for (const std::string& path : out) {
                      std::string data(kFixedRecords * kFixedRecordBytes, '\0');
                      for (char& c : data)
                        c = static_cast<char>((rng() & 15) * 16);
                      WriteGzip(path, data);
                    }
                  });
  return files;
}

// FromFixedLengthRecords over those files with num_parallel_reads R, as
// TextLinesParallel: elements that cost more to read than to hand over.
void BM_FixedLengthParallel(benchmark::State& state) {
  CountElements(
      state,
      Dataset::FromFixedLengthRecords(GzipRecordShards(), kFixedRecordBytes, 0,
                                      0, ParallelReads(state)),
      kRecordFiles * kFixedRecords);
}
BENCHMARK(BM_FixedLengthParallel)->Apply(ParallelReadsArgs);

// kCsvFiles CSV files of kCsvRows rows each: an int64 id, four float32
// columns and a word (53 bytes a row), written once as TextFiles' are.
constexpr int kCsvFiles = 4;
constexpr int64_t kCsvRows = 50'000;
const std::vector<std::string>& CsvShards() {
  static const std::vector<std::string> files = EnsureFiles(
      ShardNames("rows.{}-of-{}.csv", kCsvFiles),
      [](const std::vector<std::string>& out) {
        std::mt19937_64 rng(13);
        std::uniform_real_distribution<float> value(-100, 100);
        int64_t id = 0;
        for (const std::string& path : out) {
          std::string text = "id,a,b,c,d,word\n";
          for (int64_t i = 0; i < kCsvRows; ++i) {
            text += fmt::format("{},{:.4f},{:.4f},{:.4f},{:.4f},w{}\n", id++,
                                value(rng), value(rng), value(rng), value(rng),
                                rng() % 1000);
          }
          std::ofstream(path, std::ios::binary) << text;
        }
      });
  return files;
}

// FromCsv over those files, R = 1: one after another on the consumer's
// thread; R > 1: R files parsed and typed at once, each on a thread of its
// own, as a user would write it (Interleave of one FromCsv per file with
// num_parallel_calls R).  FromCsv has no num_parallel_reads because R > 1
// measured slower on two cores (docs/PERFORMANCE.md): each row is six
// tensors allocated on a reader's thread and freed on the consumer's.
void BM_CsvParallel(benchmark::State& state) {
  const int reads = static_cast<int>(state.range(0));
  Dataset ds = Dataset::FromCsv(CsvShards());
  if (reads > 1) {
    InterleaveOptions o;
    o.num_parallel_calls = reads;
    ds = Dataset::ListFiles(CsvShards(), /*shuffle=*/false)
             .Interleave(
                 [](const Element& e) {
                   return Dataset::FromCsv(
                       {std::string(e["filename"].bytes(0))});
                 },
                 reads, o);
  }
  CountElements(state, ds, kCsvFiles * kCsvRows);
}
BENCHMARK(BM_CsvParallel)->Apply(ParallelReadsArgs);

// Shard 0 of 4 of FromCsv over those files: whole files (by_file:1, one
// file of the four read), or by element (by_file:0, a Filter that keeps
// every row in between, as Shard went before CSV sources sharded by file:
// every row read and typed, three in four dropped).
void BM_CsvShard(benchmark::State& state) {
  const Dataset csv = Dataset::FromCsv(CsvShards());
  const Dataset ds =
      state.range(0) == 1
          ? csv.Shard(kCsvFiles, 0)
          : csv.Filter([](const Element&) { return true; }).Shard(kCsvFiles, 0);
  CountElements(state, ds, kCsvRows);
}
BENCHMARK(BM_CsvShard)
    ->ArgName("by_file")
    ->DenseRange(0, 1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// TFRecord files of Fashion-MNIST-like Examples (~850 bytes; pixels of
// 16 levels, so that gzip has work to do), written once uncompressed
// (gzip 0) or gzipped (1): kLevelFiles of kLevelRecords, or (small, and
// only gzipped: no benchmark reads others) kSmallFiles of kSmallRecords,
// the same records.
constexpr int kLevelFiles = 4;
constexpr int kLevelRecords = 8192;
constexpr int kSmallFiles = 256;
constexpr int kSmallRecords = 128;
const std::vector<std::string>& LevelFiles(bool gzip, bool small = false) {
  static const std::array<std::vector<std::string>, 4> files = [] {
    TuneAllocatorForBatches();  // as the CLI does
    std::array<std::vector<std::string>, 4> out;
    for (int i : {0, 1, 3}) {
      const bool z = i % 2 == 1, few = i < 2;
      std::mt19937_64 rng(13);
      records::ExampleBuilder b;
      std::string image(784, '\0');
      out[i] = WrittenOnce(
          few ? "levels" : "small", few ? kLevelFiles : kSmallFiles,
          [&](records::TFRecordWriter& w) {
            for (int r = 0; r < (few ? kLevelRecords : kSmallRecords); ++r) {
              for (char& c : image) c = static_cast<char>((rng() % 16) * 16);
              b.Clear();
              b.AddBytes("image", image);
              b.AddInt64("label", static_cast<int64_t>(rng() % 10));
              w.Write(b.Serialize());
            }
          },
          z ? records::Compression::kGzip : records::Compression::kNone);
    }
    return out;
  }();
  return files[(small ? 2 : 0) + (gzip ? 1 : 0)];
}

// FromTFRecords over those files with num_parallel_reads R (range 0) and
// gzip (range 1), the records counted on the consumer's thread (parse 0),
// or each parsed there first (1: Parse with one call, a stage of its
// own), or batched by 256 and parsed by one call (2: the fused batch-parse
// path; items are records): R = 1 reads the files one after another;
// R > 1 reads them in turn on the consumer's thread (read_ahead 0, the
// baseline) or each open file ahead (1, the default: on a thread of its
// own, or fused on reader tasks), in the same order either way.
void BM_TFRecordsParallel(benchmark::State& state) {
  stages::SetTFRecordReadAhead(state.range(2) != 0);
  TFRecordOptions o;
  o.num_parallel_reads = static_cast<int>(state.range(0));
  Dataset ds = Dataset::FromTFRecords(LevelFiles(state.range(1) != 0), o);
  const auto spec = records::FeatureSpec::FromJsonText(R"({"features": {
      "image": {"kind": "fixed", "dtype": "string", "shape": []},
      "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  constexpr int64_t kRecords = int64_t{kLevelFiles} * kLevelRecords;
  constexpr int64_t kBatch = 256;
  static_assert(kRecords % kBatch == 0);
  if (state.range(3) == 2) {
    CountElements(state, ds.Batch(kBatch).Parse(spec), kRecords / kBatch,
                  kBatch);
  } else {
    CountElements(state, state.range(3) == 1 ? ds.Parse(spec) : ds, kRecords);
  }
  stages::SetTFRecordReadAhead(true);
}
BENCHMARK(BM_TFRecordsParallel)
    ->ArgNames({"reads", "gzip", "read_ahead", "parse"})
    ->ArgsProduct({{1}, {0, 1}, {0}, {0, 1, 2}})
    ->ArgsProduct({{2, 4}, {0, 1}, {0, 1}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same records as kSmallFiles gzipped files of kSmallRecords: a file
// opened every 128 records, where a reader's start (its thread, the
// file's first records) is paid often.
void BM_TFRecordsSmallFiles(benchmark::State& state) {
  stages::SetTFRecordReadAhead(state.range(1) != 0);
  TFRecordOptions o;
  o.num_parallel_reads = static_cast<int>(state.range(0));
  CountElements(state, Dataset::FromTFRecords(LevelFiles(true, true), o),
                int64_t{kSmallFiles} * kSmallRecords);
  stages::SetTFRecordReadAhead(true);
}
BENCHMARK(BM_TFRecordsSmallFiles)
    ->ArgNames({"reads", "read_ahead"})
    ->Args({1, 0})
    ->ArgsProduct({{2, 4}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace recflow::pipeline
