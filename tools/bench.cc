// recflow bench: runs an input pipeline over real files and reports its
// throughput, memory, per-stage statistics and the bottleneck.
//
// The pipeline is built the way the tf.data performance guide recommends:
//   files ─▶ [shuffle N] ─▶ [repeat N] ─▶ [batch B] ─▶ [parse SPEC] ─▶
//   [prefetch N]
// (parse after batch is vectorised: one call per batch).  With
// --global-shuffle the source itself reads in a global random order.
#include <fmt/format.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "pipeline/dataset.h"
#include "records/crc32c.h"
#include "records/example.pb.h"
#include "records/feature_spec.h"
#include "records/tfrecord_reader.h"
#include "tools/cli.h"
#include "tools/svg_chart.h"

namespace recflow::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::vector<std::string> inputs;
  std::string spec;
  int parallel_reads = 1;
  int block_length = 1;
  bool nondeterministic = false;
  int map_threads = 1;
  int64_t shuffle = 0;
  int64_t shuffle_per_file = 0;
  bool global_shuffle = false;
  uint64_t seed = 0;
  bool seed_given = false;
  int64_t batch = 0;
  bool drop_remainder = false;
  int64_t repeat = 1;
  int64_t prefetch = 0;
  std::string threads = "0";  // one count, or a comma-separated sweep
  bool fusion = true;
  double duration = 0;
  int64_t warmup = 0;  // elements taken before the clock starts
  bool json = false;
  std::string io = "auto";
  size_t block_bytes = pipeline::IoOptions{}.block_bytes;
  bool direct = false;
  bool compare_protobuf = false;
  std::string svg;               // a sweep's scaling curve, drawn here
  std::string digest = "order";  // what order_digest hashes: order or data
};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

uint64_t PeakRssBytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// The CPU's model as the kernel names it ("model name" in /proc/cpuinfo;
// on a VM, what the hypervisor reports), or "unknown": the same figures
// from machines with other CPUs differ by it (docs/PERFORMANCE.md).
std::string ReadCpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start == std::string::npos) break;
    return line.substr(start);
  }
  return "unknown";
}
// Read once a process (one run per thread count reports it).
const std::string& CpuModel() {
  static const std::string model = ReadCpuModel();
  return model;
}

// CPU time (user and system) of the whole process, and of the calling
// thread, in seconds.
double ProcessCpuSeconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Folds an element into the order digest: names, dtypes, shapes, values.
uint64_t Digest(uint64_t digest, const pipeline::Element& e) {
  for (const auto& c : e.components) {
    uint32_t crc = records::crc32c::Value(c.name.data(), c.name.size());
    const auto& t = c.tensor;
    const uint64_t meta[2] = {static_cast<uint64_t>(t.dtype()),
                              static_cast<uint64_t>(t.num_elements())};
    crc = records::crc32c::Extend(crc, reinterpret_cast<const char*>(meta),
                                  sizeof meta);
    if (t.dtype() == pipeline::DType::kBytes) {
      // The CRC of the values one after another, taken over each run of
      // values that lie one after another in memory (a parsed batch's
      // are one run): the same digest, at the CRC's long-block speed
      // rather than a call per value (this loop was ~10% of a
      // one-thread parse-only run, all of it the benchmark's own work).
      const char* run = nullptr;
      size_t run_size = 0;
      for (int64_t k = 0; k < t.num_elements(); ++k) {
        const auto v = t.bytes(k);
        if (run != nullptr && v.data() == run + run_size) {
          run_size += v.size();
          continue;
        }
        if (run_size > 0) crc = records::crc32c::Extend(crc, run, run_size);
        run = v.data();
        run_size = v.size();
      }
      if (run_size > 0) crc = records::crc32c::Extend(crc, run, run_size);
    } else {
      crc = records::crc32c::Extend(crc, t.raw_data(), t.byte_size());
    }
    digest = pipeline::MixSeed(digest, crc);
  }
  return digest;
}

// The order digest: folds each delivered element by where its records
// came from (file, offset, record index, in order; plus the components'
// names, dtypes and shapes).  A few nanoseconds a record, where hashing
// the values took ~13% of a one-thread run's time: work a consumer does,
// not the pipeline (--digest data still hashes them).  A record's hash
// depends on it alone, so the records' multiplies overlap; a batch's rows
// are chained by one multiply-add each and mixed into the digest once.
// File names are hashed once per run (a shuffle's rows change file nearly
// every record).
class OriginDigest {
 public:
  // Folds `e` into *digest and returns true; false, with *digest
  // untouched, when a record's origin is not known (then Digest hashes
  // its values).
  bool Fold(uint64_t* digest, const pipeline::Element& e) {
    uint64_t d = *digest;
    for (const auto& c : e.components) {
      const auto& t = c.tensor;
      d = pipeline::MixSeed(
          d, records::crc32c::Value(c.name.data(), c.name.size()));
      d = pipeline::MixSeed(d, static_cast<uint64_t>(t.dtype()));
      for (int64_t dim : t.shape().dims()) {
        d = pipeline::MixSeed(d, static_cast<uint64_t>(dim));
      }
    }
    // A record's hash: its file's (FileHash), offset and index.
    auto hash = [](uint64_t file, uint64_t offset, uint64_t record) {
      return pipeline::MixSeed(pipeline::MixSeed(file, offset), record);
    };
    if (e.batch_origins) {
      // The rows' hashes as a polynomial (order matters; one multiply-add
      // a row is chained), mixed into the digest once a batch.
      const pipeline::BatchOrigins& origins = *e.batch_origins;
      // By a table of the files' hashes where a batch names no more files
      // than it has rows (checking the table is a look at each file).
      const std::vector<uint64_t>* table =
          origins.files().size() <= origins.size()
              ? &FileHashes(origins.files())
              : nullptr;
      uint64_t rows = 0;
      for (size_t i = 0; i < origins.size(); ++i) {
        const pipeline::BatchOrigins::Row& r = origins.row(i);
        if (r.file == pipeline::BatchOrigins::kNoFile) return false;
        const uint64_t file = table != nullptr
                                  ? (*table)[r.file]
                                  : FileHash(origins.files()[r.file]);
        rows = rows * kRowMultiplier + hash(file, r.offset, r.record);
      }
      d = pipeline::MixSeed(d, rows);
    } else if (e.origin.file) {
      d = pipeline::MixSeed(
          d, hash(FileHash(e.origin.file), e.origin.offset, e.origin.record));
    } else {
      return false;
    }
    *digest = d;
    return true;
  }

 private:
  static constexpr uint64_t kRowMultiplier = 0x9e3779b97f4a7c15ULL;  // odd

  // FileHash of each of a batch's files, by index: the rows of a shuffled
  // batch change file nearly every row, and looking each up by name cost
  // the consumer ~20 ns a record (a quarter of a 16-thread run's time on
  // this thread, where it also plans).  The table is kept while batches
  // name the same files (the fused stage's list, kept for the run);
  // holding the names keeps their addresses theirs.
  const std::vector<uint64_t>& FileHashes(
      const pipeline::BatchOrigins::Files& files) {
    bool same = files.size() == table_files_.size();
    for (size_t i = 0; same && i < files.size(); ++i) {
      same = files[i].get() == table_files_[i].get();
    }
    if (!same) {
      table_files_ = files;
      table_hashes_.clear();
      for (const auto& f : files) table_hashes_.push_back(FileHash(f));
    }
    return table_hashes_;
  }

  uint64_t FileHash(const std::shared_ptr<const std::string>& name) {
    if (name.get() == last_) return last_hash_;
    auto [it, added] = hashes_.try_emplace(name.get());
    if (added) {
      it->second = {name, records::crc32c::Value(name->data(), name->size())};
    }
    last_ = name.get();
    last_hash_ = it->second.second;
    return last_hash_;
  }

  // By the name's address, holding the name so that the address stays
  // its own for the run.
  std::unordered_map<const std::string*,
                     std::pair<std::shared_ptr<const std::string>, uint64_t>>
      hashes_;
  const std::string* last_ = nullptr;
  uint64_t last_hash_ = 0;
  pipeline::BatchOrigins::Files table_files_;
  std::vector<uint64_t> table_hashes_;
};

// Records in a delivered element: its first dimension after Batch.
uint64_t RecordsIn(const pipeline::Element& e, bool batched) {
  if (!batched || e.components.empty()) return 1;
  return static_cast<uint64_t>(e.components[0].tensor.num_rows());
}

// Record bytes read so far: the source stage's output.
uint64_t SourceBytes(const std::vector<pipeline::StageStats>& stats) {
  for (const auto& st : stats) {
    if (st.name == "tfrecord" || st.name == "global_shuffle") return st.bytes;
  }
  return 0;
}

pipeline::Dataset BuildPipeline(const BenchOptions& o,
                                const std::vector<std::string>& files) {
  pipeline::IoOptions io;
  if (o.io == "auto") {
    io.backend = pipeline::IoBackend::kAuto;
  } else if (o.io == "io_uring") {
    io.backend = pipeline::IoBackend::kIoUring;
  } else if (o.io == "pread") {
    io.backend = pipeline::IoBackend::kPread;
  } else {
    throw UsageError(
        fmt::format("--io {}: expected auto, io_uring or pread", o.io));
  }
  io.block_bytes = o.block_bytes;
  io.direct = o.direct;
  std::optional<uint64_t> seed;
  if (o.seed_given) seed = o.seed;

  std::optional<pipeline::Dataset> ds;
  if (o.global_shuffle) {
    pipeline::GlobalShuffleOptions g;
    g.seed = seed;
    ds = pipeline::Dataset::FromTFRecordsGlobalShuffle(files, g);
  } else {
    pipeline::TFRecordOptions t;
    t.num_parallel_reads = o.parallel_reads;
    t.block_length = o.block_length;
    t.deterministic = !o.nondeterministic;
    t.shuffle_buffer_per_file = o.shuffle_per_file;
    if (o.shuffle_per_file > 0) t.seed = seed;
    t.io = io;
    ds = pipeline::Dataset::FromTFRecords(files, t);
  }
  if (o.shuffle > 0) ds = ds->Shuffle(o.shuffle, seed);
  if (o.repeat != 1) ds = ds->Repeat(o.repeat);
  if (o.batch > 0) ds = ds->Batch(o.batch, o.drop_remainder);
  if (!o.spec.empty()) {
    pipeline::ParseOptions p;
    p.num_parallel_calls = o.map_threads;
    ds = ds->Parse(records::FeatureSpec::FromFile(o.spec), p);
  }
  if (o.prefetch != 0) ds = ds->Prefetch(o.prefetch);
  return *ds;
}

struct ProtobufBaseline {
  double records_per_s = 0;       // reading + protobuf parse (+ extraction)
  double read_records_per_s = 0;  // the same reading alone
};

// Reads `limit` records of `files` in order (records::TFRecordReader, CRCs
// checked), going through the files again as often as that takes (as the
// pipeline's --repeat does: one pass over a small dataset lasts a few
// milliseconds, too short to time), calls each(file, reader, record, index)
// for each, and returns records per second.
template <typename Each>
double TimedPass(const std::vector<std::string>& files, uint64_t limit,
                 Each each) {
  uint64_t n = 0;
  const auto start = Clock::now();
  while (n < limit) {
    const uint64_t before = n;
    for (const auto& f : files) {
      records::TFRecordReader reader(f);
      std::string_view r;
      while (n < limit && reader.ReadRecord(&r)) each(f, reader, r, n++);
    }
    if (n == before) break;  // no records at all
  }
  const double s = Seconds(Clock::now() - start);
  return s > 0 ? static_cast<double>(n) / s : 0;
}

// The baseline for parsing: the same records read in file order, parsed
// by protobuf into a reused tf.train.Example and, with a spec, each
// feature's values copied into batch buffers as a parse_example built on
// protobuf does (the baseline of docs/PERFORMANCE.md's parse figures).
// The reading alone is timed too: no pipeline that reads these files can
// beat the baseline by more than the baseline's time over that.
ProtobufBaseline MeasureProtobuf(const std::vector<std::string>& files,
                                 const records::FeatureSpec* spec,
                                 uint64_t limit, int64_t batch) {
  ProtobufBaseline out;
  out.read_records_per_s = TimedPass(
      files, limit,
      [](const std::string&, const auto&, std::string_view, uint64_t) {});
  tensorflow::Example example;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::string bytes;
  out.records_per_s = TimedPass(
      files, limit,
      [&](const std::string& f, const auto& reader, std::string_view r,
          uint64_t n) {
        if (!example.ParseFromArray(r.data(), static_cast<int>(r.size()))) {
          throw UsageError(fmt::format("{}: record {} is not a tf.Example", f,
                                       reader.last_index()));
        }
        if (spec == nullptr) return;
        if (batch > 0 && n % static_cast<uint64_t>(batch) == 0) {
          floats.clear();
          ints.clear();
          bytes.clear();
        }
        const auto& map = example.features().feature();
        for (const auto& [name, config] : spec->features) {
          const auto it = map.find(name);
          if (it == map.end()) continue;
          const tensorflow::Feature& feature = it->second;
          for (float x : feature.float_list().value()) floats.push_back(x);
          for (int64_t x : feature.int64_list().value()) ints.push_back(x);
          for (const auto& x : feature.bytes_list().value()) bytes += x;
        }
      });
  return out;
}

// The thread counts of --threads: "4" or "1,2,4,8,16".
std::vector<int> ThreadCounts(const std::string& text) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    int n = -1;
    const auto [end, ec] =
        std::from_chars(item.data(), item.data() + item.size(), n);
    if (ec != std::errc() || end != item.data() + item.size() || n < 0) {
      throw UsageError(fmt::format(
          "--threads {}: expected a count or a comma-separated list of "
          "counts (0: one per core), such as 1,2,4,8,16",
          text));
    }
    out.push_back(n);
    start = comma + 1;
  }
  return out;
}

// Each stage's figures less what it had done by the end of the warm-up
// (`warm`, from the same iterator: the same stages in the same order).
void SinceWarmUp(const std::vector<pipeline::StageStats>& warm,
                 std::vector<pipeline::StageStats>* stats) {
  for (size_t i = 0; i < stats->size() && i < warm.size(); ++i) {
    pipeline::StageStats& s = (*stats)[i];
    const pipeline::StageStats& w = warm[i];
    if (s.name != w.name) continue;
    s.elements -= std::min(s.elements, w.elements);
    s.bytes -= std::min(s.bytes, w.bytes);
    s.busy_seconds = std::max(0.0, s.busy_seconds - w.busy_seconds);
    s.wait_seconds = std::max(0.0, s.wait_seconds - w.wait_seconds);
    s.errors_ignored -= std::min(s.errors_ignored, w.errors_ignored);
    s.wakes -= std::min(s.wakes, w.wakes);
  }
}

// One run of the pipeline on an arena of `threads`: the --json object of
// that run (without the protobuf baseline), and the busiest stage's busy
// fraction in *worst.
nlohmann::json RunOnce(const BenchOptions& o,
                       const std::vector<std::string>& files, int threads,
                       double* worst) {
  const pipeline::Dataset ds = BuildPipeline(o, files);
  pipeline::IteratorOptions io;
  io.threads = threads;
  io.optimize = o.fusion;
  pipeline::Iterator it = ds.MakeIterator(io);
  const bool live = !o.json && isatty(STDERR_FILENO);
  const bool batched = o.batch > 0;

  uint64_t records = 0, batches = 0, digest = 0;
  const bool order_only = o.digest == "order";
  OriginDigest origins;
  pipeline::Element e;
  // The warm-up's elements go into the digest (the stream is the same
  // whatever is timed), not into the counts, the clock or the stages'
  // figures: what they did by then is taken off at the end.
  auto nothing_timed = [&](int64_t delivered) {
    return UsageError(fmt::format(
        "--warmup {}: the pipeline delivered only {} elements, nothing was "
        "left to time (more --repeat, or a shorter warm-up)",
        o.warmup, delivered));
  };
  for (int64_t i = 0; i < o.warmup; ++i) {
    if (!it.Next(&e)) throw nothing_timed(i);
    if (!order_only || !origins.Fold(&digest, e)) digest = Digest(digest, e);
  }
  const std::vector<pipeline::StageStats> warm =
      o.warmup > 0 ? it.Stats() : std::vector<pipeline::StageStats>{};
  const auto start = Clock::now();
  // What the run took of the machine's cores (workers spinning for work
  // included), and whether the consumer's thread, which plans the fused
  // stage's batches, was on a core all along (a serial bound) or waited.
  const double start_cpu = ProcessCpuSeconds();
  const double start_thread_cpu = ThreadCpuSeconds();
  // The consumer's time inside Next() (the fused stage plans there, on
  // this thread), on the stage clock: a few ns a call.
  const uint64_t start_ticks = pipeline::StageTicks();
  uint64_t next_ticks = 0;
  auto last_report = start;
  while (true) {
    if (o.duration > 0 && Seconds(Clock::now() - start) >= o.duration) break;
    const uint64_t before_next = pipeline::StageTicks();
    const bool got = it.Next(&e);
    next_ticks += pipeline::StageTicks() - before_next;
    if (!got) break;
    ++batches;
    records += RecordsIn(e, batched);
    if (!order_only || !origins.Fold(&digest, e)) digest = Digest(digest, e);
    if (live && (batches & 63) == 0) {
      const auto now = Clock::now();
      if (now - last_report > std::chrono::milliseconds(500)) {
        last_report = now;
        const double s = Seconds(now - start);
        const uint64_t bytes = SourceBytes(it.Stats());
        fmt::print(stderr, "\r{:>12.0f} records/s {:>9.1f} MB/s {:>10} batches",
                   records / s, bytes / s / 1e6, batches);
      }
    }
  }
  const double seconds = Seconds(Clock::now() - start);
  const double cpu_seconds = ProcessCpuSeconds() - start_cpu;
  const double consumer_cpu_seconds = ThreadCpuSeconds() - start_thread_cpu;
  const uint64_t run_ticks = pipeline::StageTicks() - start_ticks;
  const double in_next =
      run_ticks > 0 ? static_cast<double>(next_ticks) / run_ticks : 0;
  if (live) fmt::print(stderr, "\n");
  if (o.warmup > 0 && batches == 0) throw nothing_timed(o.warmup);
  std::vector<pipeline::StageStats> stats = it.Stats();
  if (!warm.empty()) SinceWarmUp(warm, &stats);
  const uint64_t bytes = SourceBytes(stats);

  nlohmann::json stages = nlohmann::json::array();
  std::string bottleneck;
  *worst = -1;
  for (const auto& st : stats) {
    const double busy =
        seconds > 0 ? st.busy_seconds / (seconds * st.parallelism) : 0;
    const double wait = seconds > 0 ? st.wait_seconds / seconds : 0;
    if (busy > *worst) {
      *worst = busy;
      bottleneck = st.name;
    }
    nlohmann::json s = {
        {"name", st.name},
        {"elements", st.elements},
        {"bytes", st.bytes},
        {"elements_per_s", seconds > 0 ? st.elements / seconds : 0},
        {"busy_seconds", st.busy_seconds},
        {"wait_seconds", st.wait_seconds},
        {"parallelism", st.parallelism},
        {"busy_fraction", busy},
        {"wait_fraction", wait}};
    if (st.errors_ignored) s["errors_ignored"] = st.errors_ignored;
    if (st.buffered >= 0) s["wakes"] = st.wakes;
    stages.push_back(std::move(s));
  }
  return {{"records", records},
          {"batches", batches},
          {"seconds", seconds},
          {"records_per_s", seconds > 0 ? records / seconds : 0},
          {"bytes_per_s", seconds > 0 ? bytes / seconds : 0},
          {"peak_rss_bytes", PeakRssBytes()},
          {"stages", stages},
          {"bottleneck", bottleneck},
          {"order_digest", fmt::format("{:016x}", digest)},
          {"digest", o.digest},
          {"warmup_elements", o.warmup},
          {"consumer_in_next_fraction", in_next},
          {"cpu_seconds", cpu_seconds},
          {"cores_busy", seconds > 0 ? cpu_seconds / seconds : 0},
          {"consumer_cpu_fraction",
           seconds > 0 ? consumer_cpu_seconds / seconds : 0},
          {"pipeline", ds.Describe()},
          {"fusion", o.fusion},
          {"threads", it.context().threads()},
          // Which CRC-32C code checked the records: figures from
          // machines with and without AVX-512 VPCLMULQDQ differ by it.
          {"crc32c", records::crc32c::ImplementationName()},
          {"cpu", CpuModel()}};
}

void AddProtobufBaseline(const BenchOptions& o,
                         const std::vector<std::string>& files,
                         uint64_t records, nlohmann::json* out) {
  std::optional<records::FeatureSpec> spec;
  if (!o.spec.empty()) spec = records::FeatureSpec::FromFile(o.spec);
  const ProtobufBaseline pb =
      MeasureProtobuf(files, spec ? &*spec : nullptr, records, o.batch);
  const double rps = (*out)["records_per_s"].get<double>();
  (*out)["protobuf_records_per_s"] = pb.records_per_s;
  (*out)["speedup_vs_protobuf"] =
      pb.records_per_s > 0 ? rps / pb.records_per_s : 0;
  (*out)["protobuf_read_records_per_s"] = pb.read_records_per_s;
  (*out)["speedup_bound_from_reading"] =
      pb.records_per_s > 0 ? pb.read_records_per_s / pb.records_per_s : 0;
}

void PrintProtobufBaseline(const nlohmann::json& out) {
  fmt::print(
      "protobuf parse, one thread: {:.0f} records/s; this pipeline "
      "{:.2f}x\n",
      out["protobuf_records_per_s"].get<double>(),
      out["speedup_vs_protobuf"].get<double>());
  fmt::print(
      "reading alone (CRCs checked), one thread: {:.0f} records/s: a "
      "pipeline reading these files is at most {:.2f}x the protobuf "
      "baseline\n",
      out["protobuf_read_records_per_s"].get<double>(),
      out["speedup_bound_from_reading"].get<double>());
}

// The sweep's records/s and speed-up over threads, each next to linear
// scaling from the first count, as an SVG file.
void WriteScalingSvg(const std::string& path,
                     const std::vector<nlohmann::json>& runs) {
  ChartSeries rate{"records/s", {}}, speedup{"speed-up", {}};
  for (const auto& r : runs) {
    const double threads = r["threads"].get<int>();
    rate.points.emplace_back(threads, r["records_per_s"].get<double>());
    speedup.points.emplace_back(threads, r["speedup"].get<double>());
  }
  const std::vector<ChartPanel> panels = {
      {"records/s by threads (dashed: linear scaling)",
       "threads",
       "records/s",
       {rate},
       true},
      {"speed-up over the first count (dashed: linear)",
       "threads",
       "speed-up",
       {speedup},
       true}};
  WriteSvg(path, "recflow bench: the pipeline's scaling over threads", panels);
}

// --threads 1,2,4,...: the same pipeline at each count, and the scaling
// table (or one JSON object per count, each with its speed-up over the
// first count).
int RunSweep(const BenchOptions& o, const std::vector<std::string>& files,
             const std::vector<int>& counts) {
  std::vector<nlohmann::json> runs;
  std::vector<double> worst(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    runs.push_back(RunOnce(o, files, counts[i], &worst[i]));
  }
  const double base = runs[0]["records_per_s"].get<double>();
  bool same_order = true;
  for (auto& r : runs) {
    r["speedup"] = base > 0 ? r["records_per_s"].get<double>() / base : 0;
    same_order = same_order && r["order_digest"] == runs[0]["order_digest"];
  }
  if (o.compare_protobuf) {
    for (auto& r : runs) {
      AddProtobufBaseline(o, files, r["records"].get<uint64_t>(), &r);
      if (!o.json) break;  // the table prints it once
    }
  }
  if (!o.svg.empty()) WriteScalingSvg(o.svg, runs);
  if (o.json) {
    for (const auto& r : runs) fmt::print("{}\n", r.dump());
    return kExitOk;
  }
  fmt::print("{}\n", runs[0]["pipeline"].get<std::string>());
  fmt::print("{:>7} {:>14} {:>9} {:>22} {:>6} {:>9} {:>10} {:>16}\n", "threads",
             "records/s", "speed-up", "bottleneck (busy %)", "cores",
             "consumer", "peak RSS", "order digest");
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    fmt::print(
        "{:>7} {:>14.0f} {:>8.2f}x {:>22} {:>6.2f} {:>8.0f}% {:>6.1f} MiB "
        "{:>16}\n",
        r["threads"].get<int>(), r["records_per_s"].get<double>(),
        r["speedup"].get<double>(),
        fmt::format("{} ({:.0f}%)", r["bottleneck"].get<std::string>(),
                    100 * worst[i]),
        r["cores_busy"].get<double>(),
        100 * r["consumer_cpu_fraction"].get<double>(),
        r["peak_rss_bytes"].get<uint64_t>() / 1048576.0,
        r["order_digest"].get<std::string>());
  }
  fmt::print(
      "speed-up over {} thread(s); cores: CPU time over the run's time "
      "(idle workers looking for work included); consumer: the share of the "
      "run its thread was on a core; peak RSS is the process's so far; "
      "order {} at every count\n",
      runs[0]["threads"].get<int>(), same_order ? "the same" : "NOT the same");
  if (o.warmup > 0) {
    fmt::print("each count after {} elements of warm-up, not timed\n",
               o.warmup);
  }
  if (o.compare_protobuf) PrintProtobufBaseline(runs[0]);
  if (!o.svg.empty()) fmt::print("scaling curve: {}\n", o.svg);
  return kExitOk;
}

int RunBench(const BenchOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  const std::vector<int> counts = ThreadCounts(o.threads);
  if (o.map_threads == 0 || o.parallel_reads == 0 || o.parallel_reads < -1 ||
      o.block_length < 1) {
    throw UsageError(
        "--map-threads, --parallel-reads, --block-length and --threads must be "
        "positive (--map-threads -1: one per arena thread; --parallel-reads "
        "-1: one file per core)");
  }
  if (o.global_shuffle && o.shuffle_per_file > 0) {
    throw UsageError(
        "--global-shuffle and --shuffle-per-file: the global shuffle reads "
        "by index in its own order; give one of them");
  }
  // 0 epochs measure nothing; -1 without --duration never ends.
  if (o.repeat == 0 || o.repeat < -1) {
    throw UsageError(fmt::format(
        "--repeat {}: expected a number of epochs, or -1 (forever) with "
        "--duration",
        o.repeat));
  }
  if (o.repeat == -1 && o.duration <= 0) {
    throw UsageError("--repeat -1 (forever) needs --duration SECONDS");
  }
  if (counts.size() > 1) return RunSweep(o, files, counts);
  if (!o.svg.empty()) {
    throw UsageError(
        "--svg draws a --threads sweep: give a list of counts, such as "
        "--threads 1,2,4,8,16");
  }
  double worst = 0;
  nlohmann::json out = RunOnce(o, files, counts[0], &worst);
  if (o.compare_protobuf) {
    AddProtobufBaseline(o, files, out["records"].get<uint64_t>(), &out);
  }
  if (o.json) {
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  const double seconds = out["seconds"].get<double>();
  fmt::print("{}\n", out["pipeline"].get<std::string>());
  fmt::print(
      "{} records in {} elements, {:.3f} s: {:.0f} records/s, {:.1f} "
      "MB/s; peak RSS {:.1f} MiB; {} thread{}{}\n",
      out["records"].get<uint64_t>(), out["batches"].get<uint64_t>(), seconds,
      out["records_per_s"].get<double>(),
      out["bytes_per_s"].get<double>() / 1e6,
      out["peak_rss_bytes"].get<uint64_t>() / 1048576.0,
      out["threads"].get<int>(), out["threads"].get<int>() == 1 ? "" : "s",
      o.fusion ? "" : "; stages not fused");
  if (o.warmup > 0) {
    fmt::print("(after {} elements of warm-up, not timed)\n", o.warmup);
  }
  fmt::print("{:<22} {:>12} {:>14} {:>7} {:>8}\n", "stage", "elements",
             "elements/s", "busy %", "wait %");
  for (const auto& s : out["stages"]) {
    fmt::print("{:<22} {:>12} {:>14.0f} {:>7.1f} {:>8.1f}\n",
               s["name"].get<std::string>(), s["elements"].get<uint64_t>(),
               s["elements_per_s"].get<double>(),
               100 * s["busy_fraction"].get<double>(),
               100 * s["wait_fraction"].get<double>());
  }
  fmt::print("bottleneck: {} ({:.0f}% busy)\n",
             out["bottleneck"].get<std::string>(), 100 * worst);
  fmt::print(
      "the consumer's thread: {:.1f}% of the time in Next() (waits and the "
      "work stages do on it included), the rest its own (the digest); on a "
      "core {:.1f}% of the time\n",
      100 * out["consumer_in_next_fraction"].get<double>(),
      100 * out["consumer_cpu_fraction"].get<double>());
  fmt::print(
      "CPU: {:.3f} core-seconds, {:.2f} cores busy on average; CRCs checked "
      "by {}; {}\n",
      out["cpu_seconds"].get<double>(), out["cores_busy"].get<double>(),
      out["crc32c"].get<std::string>(), out["cpu"].get<std::string>());
  if (o.compare_protobuf) PrintProtobufBaseline(out);
  fmt::print("order digest {}\n", out["order_digest"].get<std::string>());
  return kExitOk;
}

}  // namespace

Runner AddBenchCommand(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  app.add_option("FILE", o->inputs,
                 "record files, directories or glob patterns")
      ->required();
  app.add_option("--spec", o->spec,
                 "FeatureSpec JSON: parse the records (after --batch, one "
                 "vectorised call per batch); without it, records only");
  app.add_option("--parallel-reads", o->parallel_reads,
                 "files read at once, interleaved record by record (-1: one "
                 "per core, at most one per file, as tf.data.AUTOTUNE)")
      ->capture_default_str();
  app.add_option("--block-length", o->block_length,
                 "records taken from each of those files in turn")
      ->capture_default_str();
  app.add_flag("--nondeterministic", o->nondeterministic,
               "let the file interleave take whichever file has a record "
               "read (tf.data's deterministic=false): each file's records "
               "keep their order, the interleaving (and the order digest) "
               "depends on timing");
  app.add_option("--map-threads", o->map_threads,
                 "parse calls at once (-1: one per arena thread)")
      ->capture_default_str();
  app.add_option("--shuffle", o->shuffle, "shuffle buffer (records)")
      ->check(Positive());
  app.add_option("--shuffle-per-file", o->shuffle_per_file,
                 "shuffle each file's records in a buffer of this many of its "
                 "own before the interleave (tf.data's interleave(lambda f: "
                 "TFRecordDataset(f).shuffle(N))): the reader tasks shuffle, "
                 "on every core; alone or with --shuffle")
      ->check(Positive());
  app.add_flag("--global-shuffle", o->global_shuffle,
               "read every record once per epoch in a global random order, "
               "through the files' indexes");
  app.add_option("--seed", o->seed, "seed of the shuffles (default: random)")
      ->each([o](const std::string&) { o->seed_given = true; });
  app.add_option("--batch", o->batch, "records per batch")->check(Positive());
  app.add_flag("--drop-remainder", o->drop_remainder,
               "drop a last batch smaller than --batch");
  app.add_option("--repeat", o->repeat, "epochs (-1: forever, with --duration)")
      ->capture_default_str();
  app.add_option("--prefetch", o->prefetch,
                 "elements prefetched on a thread of their own (0: none; "
                 "-1: a depth tuned as it runs, as tf.data.AUTOTUNE)")
      ->check(AutotuneOrNonNegative());
  app.add_option("--threads", o->threads,
                 "threads that run the pipeline's stages (0: one per core; "
                 "a fused parse counts its consumer's thread among them "
                 "where they take every core); a list such "
                 "as 1,2,4,8,16 runs the pipeline at each count and prints "
                 "a scaling table (--json: one object per count, with its "
                 "speedup over the first)")
      ->capture_default_str();
  app.add_option("--svg", o->svg,
                 "with a --threads list: draw records/s and the speed-up "
                 "over threads, next to linear scaling, into this SVG file");
  app.add_flag("!--no-fusion", o->fusion,
               "run every stage as written, rather than Parse(Batch(shuffle, "
               "repeat, files)) as one fused stage (for comparison)");
  app.add_option("--duration", o->duration, "stop after this many seconds")
      ->check(Positive());
  app.add_option("--warmup", o->warmup,
                 "elements (batches, with --batch) taken before the clock "
                 "starts: start-up (threads, first reads, filling the "
                 "shuffle buffer, memory first touched) is then left out of "
                 "records/s and of the stages' figures; the order digest "
                 "still covers them")
      ->check(NonNegative())
      ->capture_default_str();
  app.add_flag("--json", o->json,
               "print one JSON object as the last line: records, batches, "
               "seconds, records_per_s, bytes_per_s, peak_rss_bytes, stages, "
               "bottleneck, order_digest (see --digest; equal digests, "
               "equal streams), warmup_elements, consumer_in_next_fraction "
               "(the consumer's share of the timed run inside Next()), "
               "cpu_seconds (the process's CPU time over the timed run), "
               "cores_busy (that over the run's time), consumer_cpu_fraction "
               "(the share of the run the consumer's thread was on a core), "
               "crc32c (the CRC-32C code that checked the records), cpu "
               "(the CPU's model, as /proc/cpuinfo names it)");
  app.add_option("--digest", o->digest,
                 "what order_digest hashes: order (where each delivered "
                 "record came from, file, offset and record, in order: nearly "
                 "free) or data (the delivered values themselves, as a "
                 "consumer reading every byte; ~13% of a one-thread run's "
                 "time on Fashion-MNIST)")
      ->check(CLI::IsMember({"order", "data"}))
      ->capture_default_str();
  app.add_option("--io", o->io, "how files are read: auto, io_uring or pread")
      ->capture_default_str();
  app.add_option("--block-bytes", o->block_bytes, "bytes per read")
      ->capture_default_str();
  app.add_flag("--direct", o->direct, "O_DIRECT reads (bypass the page cache)");
  app.add_flag("--compare-protobuf", o->compare_protobuf,
               "also time a generic parse of the same records on one thread "
               "(protobuf's ParseFromArray, plus copying the spec's features "
               "into batch buffers when there is a spec), and print the "
               "ratio, and the bound on it that reading the files alone "
               "sets");
  app.footer(
      "The pipeline: files (each shuffled with --shuffle-per-file) -> "
      "[shuffle] -> [repeat] -> [batch] -> [parse] -> [prefetch].  busy % is a "
      "stage's own work over the wall time (per "
      "thread it may use); wait % is the time its consumer waited on it.  The "
      "busiest stage is named the bottleneck.  With --spec and --batch, the "
      "stages up to parse run fused (unless --no-fusion): tfrecord (reading "
      "and checksums, and --shuffle-per-file's draws, on every thread), "
      "batch (the one-thread plan: shuffle, repeat and batch order) and "
      "parse (on every thread).");
  return [o] { return RunBench(*o); };
}

}  // namespace recflow::tools
