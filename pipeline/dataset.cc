#include "pipeline/dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <tbb/global_control.h>

#include <cmath>
#include <limits>
#include <random>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "pipeline/block_arena.h"
#include "pipeline/stages.h"
#include "records/file_list.h"

namespace recflow::pipeline {
namespace {

// Stage timing reads a clock twice per element per stage.  The time stamp
// counter costs a few nanoseconds where clock_gettime costs 20-50 in a VM
// (a tenth of a small record's whole cost through a pipeline), so the
// counters add up ticks, and Stats() converts them with a rate measured
// against steady_clock over the time since the first context was made:
// nothing is measured on the pipeline's threads.  (Measuring the rate on
// the first scope's exit, with a 5 ms sleep, stopped a stage for 5 ms in
// every process: 3-4% of a 0.15 s benchmark run.)
#if defined(__x86_64__)
uint64_t Ticks() { return __rdtsc(); }
constexpr bool kTicksAreNanos = false;
#else
uint64_t Ticks() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}
constexpr bool kTicksAreNanos = true;
#endif

struct ClockAnchor {
  std::chrono::steady_clock::time_point time;
  uint64_t ticks;
};
const ClockAnchor& Anchor() {
  static const ClockAnchor anchor{std::chrono::steady_clock::now(), Ticks()};
  return anchor;
}

// Seconds per tick, over at least kCalibration since Anchor() (a context
// made and read back at once waits out the rest, off the pipeline).
double SecondsPerTick() {
  if (kTicksAreNanos) return 1e-9;
  constexpr auto kCalibration = std::chrono::milliseconds(5);
  const ClockAnchor& a = Anchor();
  const auto waited = std::chrono::steady_clock::now() - a.time;
  if (waited < kCalibration) std::this_thread::sleep_for(kCalibration - waited);
  const auto now = std::chrono::steady_clock::now();
  const uint64_t ticks = Ticks();
  const double seconds = std::chrono::duration<double>(now - a.time).count();
  return ticks > a.ticks ? seconds / static_cast<double>(ticks - a.ticks)
                         : 1e-9;
}

// Self time: each thread keeps a stack of BusyScopes (the stages whose
// work it is in); entering a nested one stops the clock of its parent.
thread_local BusyScope* current_frame = nullptr;

// Counts a stage's output and time.
class CountedIterator final : public IteratorBase {
 public:
  CountedIterator(std::unique_ptr<IteratorBase> inner, StageCounter* counter)
      : inner_(std::move(inner)), counter_(counter) {}

  bool GetNext(Element* out) override {
    BusyScope scope(counter_);
    if (!inner_->GetNext(out)) return false;
    counter_->elements.fetch_add(1, std::memory_order_relaxed);
    counter_->bytes.fetch_add(out->byte_size(), std::memory_order_relaxed);
    return true;
  }
  void Save(StateWriter* w) override { inner_->Save(w); }
  void Restore(StateReader* r) override { inner_->Restore(r); }
  bool DeliverIn(std::shared_ptr<Allocator> memory) override {
    return inner_->DeliverIn(std::move(memory));
  }
  bool PrepareWith(std::function<void(const Element&)> fn) override {
    return inner_->PrepareWith(std::move(fn));
  }
  bool Draining() const override { return inner_->Draining(); }
  void FillAhead(size_t n) override {
    BusyScope scope(counter_);
    inner_->FillAhead(n);
  }

 private:
  std::unique_ptr<IteratorBase> inner_;
  StageCounter* counter_;
};

}  // namespace

uint64_t Fingerprint(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t StageTicks() { return Ticks(); }

BusyScope::BusyScope(StageCounter* counter)
    : counter_(counter), resumed_(Ticks()), parent_(current_frame) {
  if (parent_ != nullptr) {
    parent_->counter_->busy_ticks += resumed_ - parent_->resumed_;
  }
  current_frame = this;
}

BusyScope::~BusyScope() {
  const uint64_t now = Ticks();
  counter_->busy_ticks += now - resumed_;
  current_frame = parent_;
  if (parent_ != nullptr) parent_->resumed_ = now;
}

WaitScope::WaitScope(StageCounter* counter)
    : counter_(counter), start_(Ticks()) {
  if (current_frame != nullptr) {
    current_frame->counter_->busy_ticks += start_ - current_frame->resumed_;
  }
}

WaitScope::~WaitScope() {
  const uint64_t now = Ticks();
  if (counter_ != nullptr) counter_->wait_ticks += now - start_;
  if (current_frame != nullptr) current_frame->resumed_ = now;
}

// --- IteratorContext -------------------------------------------------------

namespace {
// oneTBB starts at most (cores - 1) workers by default, counting on the
// calling thread to join an arena.  Ours never do, so an arena of n
// threads needs n workers: raise the process-wide limit to the largest
// arena made so far (the limit is kept for the life of the process).
void EnsureWorkers(int n) {
  static std::mutex mu;
  static std::unique_ptr<tbb::global_control> control;
  static int allowed = static_cast<int>(tbb::global_control::active_value(
      tbb::global_control::max_allowed_parallelism));
  std::lock_guard<std::mutex> lock(mu);
  if (n + 1 <= allowed) return;
  allowed = n + 1;
  control = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism,
      static_cast<size_t>(allowed));
}
}  // namespace

IteratorContext::IteratorContext(const IteratorOptions& options)
    : keep_slabs_(std::make_unique<BlockSlabKeeper>()),
      threads_(options.threads > 0 ? options.threads : MachineCores()),
      optimize_(options.optimize),
      prefetch_polls_(options.prefetch_polls),
      seed_(stages::SeedOrRandom(std::nullopt)),
      // No slot is reserved for an external thread: the consumer and the
      // drivers never run arena work, so every slot is a worker's.
      arena_(std::make_unique<tbb::task_arena>(threads_, 0)) {
  EnsureWorkers(threads_);
  Anchor();  // the stage clock's rate is measured from here
}

IteratorContext::~IteratorContext() = default;

namespace {
thread_local CounterNesting::Frame current_nesting;
}  // namespace

CounterNesting::CounterNesting(Frame frame) : previous_(current_nesting) {
  current_nesting = frame;
}
CounterNesting::~CounterNesting() { current_nesting = previous_; }
CounterNesting::Frame CounterNesting::Current() { return current_nesting; }

StageCounter* IteratorContext::Counter(const void* key, std::string_view name,
                                       int parallelism) {
  const CounterNesting::Frame nesting = CounterNesting::Current();
  const bool nested = nesting.ctx == this && nesting.parent != nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<StageCounter>& slot =
      nested ? nested_counters_[{nesting.parent, std::string(name)}]
             : counters_[key];
  if (!slot) {
    slot = std::make_unique<StageCounter>();
    slot->name = nested ? fmt::format("{}/{}", nesting.parent->name, name)
                        : std::string(name);
    slot->parallelism = nested ? parallelism * nesting.at_once : parallelism;
    order_.push_back(slot.get());
  }
  return slot.get();
}

std::vector<StageStats> IteratorContext::Stats() const {
  const double seconds_per_tick = SecondsPerTick();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StageStats> out;
  for (const StageCounter* counter : order_) {
    const StageCounter& c = *counter;
    StageStats s;
    s.name = c.name;
    s.elements = c.elements.load();
    s.bytes = c.bytes.load();
    s.busy_seconds =
        static_cast<double>(c.busy_ticks.load()) * seconds_per_tick;
    s.wait_seconds =
        static_cast<double>(c.wait_ticks.load()) * seconds_per_tick;
    s.parallelism = c.parallelism;
    s.buffered = c.buffered.load();
    s.errors_ignored = c.errors_ignored.load();
    s.wakes = c.wakes.load();
    out.push_back(std::move(s));
  }
  return out;
}

void IteratorContext::Cancel() {
  cancelled_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, fn] : wake_ups_) fn();
}

uint64_t IteratorContext::AddWakeUp(WakeUp fn) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ups_[next_wake_up_] = std::move(fn);
  return next_wake_up_++;
}

void IteratorContext::RemoveWakeUp(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ups_.erase(id);
}

namespace {
// Whether two weak_ptrs share one owner (both empty included).
bool SameOwner(const std::weak_ptr<const DatasetBase>& a,
               const std::weak_ptr<const DatasetBase>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}
}  // namespace

std::shared_ptr<void> IteratorContext::SharedSlot(
    const DatasetBase* key, std::type_index type,
    const std::function<std::shared_ptr<void>()>& make) {
  std::weak_ptr<const DatasetBase> owner = key->weak_from_this();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shared_.find({key, type});
  if (it != shared_.end() && SameOwner(it->second.owner, owner)) {
    return it->second.state;
  }
  // New state (for a new dataset, or one at a destroyed one's address):
  // first the state of the datasets destroyed since goes, so that the
  // entries stay as many as the live datasets.
  std::erase_if(shared_, [](const auto& kv) {
    const std::weak_ptr<const DatasetBase>& o = kv.second.owner;
    return o.expired() && !SameOwner(o, {});
  });
  SharedEntry& entry = shared_[{key, type}];
  entry.owner = std::move(owner);
  entry.state = make();
  return entry.state;
}

std::unique_ptr<IteratorBase> DatasetBase::MakeIterator(IteratorContext* ctx,
                                                        uint64_t salt) const {
  StageCounter* counter = ctx->Counter(this, StageName(), Parallelism(*ctx));
  return std::make_unique<CountedIterator>(MakeIteratorInternal(ctx, salt),
                                           counter);
}

namespace stages {
uint64_t SeedOrRandom(const std::optional<uint64_t>& seed) {
  if (seed) return *seed;
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}
}  // namespace stages

// --- Dataset ---------------------------------------------------------------

namespace {
void CheckPositive(int64_t v, std::string_view what) {
  if (v <= 0) throw Error(fmt::format("{} must be positive, not {}", what, v));
}
// {"filename": bytes [n]}: the n names, for FromTensorSlices (ListFiles,
// and the plain-file sources' interleave).
Element FileNames(const std::vector<std::string>& files) {
  Element names;
  names.components.push_back(
      {"filename",
       Tensor::FromStrings(files, Shape{static_cast<int64_t>(files.size())})});
  return names;
}
}  // namespace

Dataset Dataset::FromTFRecords(std::vector<std::string> paths,
                               TFRecordOptions options) {
  return Dataset(stages::TFRecord(std::move(paths), std::move(options)));
}
Dataset Dataset::FromTFRecordsGlobalShuffle(std::vector<std::string> paths,
                                            GlobalShuffleOptions options) {
  return Dataset(stages::GlobalShuffle(std::move(paths), options));
}
Dataset Dataset::FromTensorSlices(Element arrays) {
  return Dataset(stages::TensorSlices(std::move(arrays)));
}
Dataset Dataset::FromTensors(Element arrays) {
  return Dataset(stages::Tensors(std::move(arrays)));
}
Dataset Dataset::Range(int64_t start, int64_t stop, int64_t step) {
  if (step == 0) throw Error("Range: step must not be 0");
  return Dataset(stages::Range(start, stop, step));
}
Dataset Dataset::Counter(int64_t start, int64_t step) {
  return Dataset(stages::Counter(start, step));
}
Dataset Dataset::Random(std::optional<uint64_t> seed,
                        bool rerandomize_each_iteration) {
  return Dataset(stages::Random(seed, rerandomize_each_iteration));
}
Dataset Dataset::ListFiles(const std::vector<std::string>& patterns,
                           bool shuffle, std::optional<uint64_t> seed) {
  const std::vector<std::string> files = records::MatchFiles(patterns);
  if (files.empty()) {
    throw records::FileListError(fmt::format(
        "ListFiles: no file matches {}",
        patterns.empty() ? std::string("(no patterns given)")
                         : fmt::format("'{}'", fmt::join(patterns, "', '"))));
  }
  Dataset d = FromTensorSlices(FileNames(files));
  if (!shuffle) return d;
  return d.Shuffle(static_cast<int64_t>(files.size()), seed);
}
Dataset Dataset::FromGenerator(GeneratorFn generator, std::string name) {
  return Dataset(stages::Generator(std::move(generator), std::move(name)));
}
namespace {
// FromTextLines' and FromFixedLengthRecords' `files`, their options
// checked: one stage reading every file in turn, or, with
// num_parallel_reads > 1, one per file under an interleave (the order of
// tf.data's readers, which are built the same way) that Shard takes whole
// files of, as it does of the one stage.
DatasetPtr PlainFilesOf(std::vector<std::string> files,
                        stages::PlainFraming framing,
                        const PlainFileOptions& options) {
  const int64_t cycle = std::min<int64_t>(options.num_parallel_reads,
                                          static_cast<int64_t>(files.size()));
  if (cycle <= 1) return stages::PlainFile(std::move(files), framing, options);
  InterleaveOptions interleave;
  interleave.num_parallel_calls = static_cast<int>(cycle);
  interleave.name =
      framing.record_bytes == 0 ? "text_line" : "fixed_length_record";
  DatasetPtr names = stages::TensorSlices(FileNames(files));
  stages::InterleavedFiles read;
  read.fingerprint = stages::FilesFingerprint(files);
  read.shard = [files = std::move(files), framing, options](int64_t num_shards,
                                                            int64_t index) {
    std::optional<std::vector<std::string>> mine =
        stages::FilesOfShard(files, num_shards, index);
    return mine ? PlainFilesOf(std::move(*mine), framing, options) : nullptr;
  };
  return stages::Interleave(
      std::move(names),
      [framing, options](const Element& e) {
        return Dataset(stages::PlainFile({std::string(e["filename"].bytes(0))},
                                         framing, options));
      },
      cycle, std::move(interleave), std::move(read));
}
Dataset PlainFiles(std::vector<std::string> paths, stages::PlainFraming framing,
                   PlainFileOptions options, std::string_view who) {
  if (options.num_parallel_reads == kAutotune) {
    options.num_parallel_reads = MachineCores();
  }
  if (options.num_parallel_reads <= 0) {
    throw Error(fmt::format(
        "{}: num_parallel_reads must be positive, or -1 for one file per "
        "core, not {}",
        who, options.num_parallel_reads));
  }
  if (options.buffer_bytes == 0) {
    throw Error(fmt::format("{}: buffer_bytes must be positive", who));
  }
  if (options.max_line_bytes == 0) {
    throw Error(fmt::format("{}: max_line_bytes must be positive", who));
  }
  return Dataset(
      PlainFilesOf(stages::ExpandFiles(paths, who), framing, options));
}
}  // namespace

Dataset Dataset::FromTextLines(std::vector<std::string> paths,
                               PlainFileOptions options) {
  return PlainFiles(std::move(paths), {}, options, "FromTextLines");
}
Dataset Dataset::FromFixedLengthRecords(std::vector<std::string> paths,
                                        uint64_t record_bytes,
                                        uint64_t header_bytes,
                                        uint64_t footer_bytes,
                                        PlainFileOptions options) {
  // A record and the footer after it are held in memory at once.
  constexpr uint64_t kMaxHeld = uint64_t{1} << 30;
  if (record_bytes == 0 || record_bytes > kMaxHeld ||
      footer_bytes > kMaxHeld - record_bytes) {
    throw Error(fmt::format(
        "FromFixedLengthRecords: record_bytes must be positive and, with "
        "footer_bytes, at most {} bytes; got {} and {}",
        kMaxHeld, record_bytes, footer_bytes));
  }
  // No file is larger; and header + footer + offsets stay far from
  // wrapping around.
  constexpr uint64_t kMaxHeader = uint64_t{1} << 62;
  if (header_bytes > kMaxHeader) {
    throw Error(fmt::format(
        "FromFixedLengthRecords: header_bytes {} is more than any file holds "
        "(at most {})",
        header_bytes, kMaxHeader));
  }
  return PlainFiles(std::move(paths),
                    {record_bytes, header_bytes, footer_bytes}, options,
                    "FromFixedLengthRecords");
}
Dataset Dataset::FromCsv(std::vector<std::string> paths, CsvOptions options) {
  return Dataset(
      stages::Csv(stages::ExpandFiles(paths, "FromCsv"), std::move(options)));
}

Dataset Dataset::Zip(const std::vector<Dataset>& datasets) {
  if (datasets.empty()) throw Error("Zip: no datasets given");
  std::vector<DatasetPtr> inputs;
  for (const Dataset& d : datasets) inputs.push_back(d.base_);
  return Dataset(stages::Zip(std::move(inputs)));
}
Dataset Dataset::SampleFromDatasets(const std::vector<Dataset>& datasets,
                                    SampleOptions options) {
  if (datasets.empty()) throw Error("SampleFromDatasets: no datasets given");
  if (options.weights.empty()) options.weights.assign(datasets.size(), 1.0);
  if (options.weights.size() != datasets.size()) {
    throw Error(fmt::format(
        "SampleFromDatasets: {} weights for {} datasets; give one weight per "
        "dataset",
        options.weights.size(), datasets.size()));
  }
  double total = 0;
  for (size_t i = 0; i < options.weights.size(); ++i) {
    const double w = options.weights[i];
    if (!std::isfinite(w) || w < 0) {
      throw Error(fmt::format(
          "SampleFromDatasets: weight {} is {}; weights must be finite and "
          ">= 0",
          i, w));
    }
    total += w;
  }
  if (!(total > 0) || !std::isfinite(total)) {
    throw Error(fmt::format(
        "SampleFromDatasets: the weights sum to {}; they must sum to a "
        "finite number > 0",
        total));
  }
  std::vector<DatasetPtr> inputs;
  for (const Dataset& d : datasets) inputs.push_back(d.base_);
  return Dataset(stages::SampleFrom(std::move(inputs), std::move(options)));
}
Dataset Dataset::ChooseFromDatasets(const std::vector<Dataset>& datasets,
                                    const Dataset& choices,
                                    bool stop_on_empty_dataset) {
  if (datasets.empty()) throw Error("ChooseFromDatasets: no datasets given");
  std::vector<DatasetPtr> inputs;
  for (const Dataset& d : datasets) inputs.push_back(d.base_);
  return Dataset(stages::ChooseFrom(std::move(inputs), choices.base_,
                                    stop_on_empty_dataset));
}
Dataset Dataset::Concatenate(const Dataset& other) const {
  return Dataset(stages::Concatenate(base_, other.base_));
}
Dataset Dataset::Enumerate(int64_t start, std::string name) const {
  if (name.empty()) throw Error("Enumerate: the index needs a name");
  return Dataset(stages::Enumerate(base_, start, std::move(name)));
}

Dataset Dataset::Map(MapFn fn, MapOptions options) const {
  if (options.num_parallel_calls == 0 ||
      options.num_parallel_calls < kAutotune) {
    throw Error("Map: num_parallel_calls must be positive or kAutotune");
  }
  return Dataset(stages::Map(base_, std::move(fn), std::move(options)));
}
Dataset Dataset::Parse(records::FeatureSpec spec, ParseOptions options) const {
  if (options.num_parallel_calls == 0 ||
      options.num_parallel_calls < kAutotune) {
    throw Error("Parse: num_parallel_calls must be positive or kAutotune");
  }
  return Dataset(stages::Parse(base_, std::move(spec), std::move(options)));
}
Dataset Dataset::ParseSequence(records::FeatureSpec context,
                               records::FeatureSpec sequence,
                               ParseOptions options) const {
  if (options.num_parallel_calls == 0 ||
      options.num_parallel_calls < kAutotune) {
    throw Error(
        "ParseSequence: num_parallel_calls must be positive or kAutotune");
  }
  return Dataset(stages::ParseSequence(
      base_, std::move(context), std::move(sequence), std::move(options)));
}
Dataset Dataset::Filter(PredicateFn predicate, std::string name) const {
  return Dataset(stages::Filter(base_, std::move(predicate), std::move(name)));
}
Dataset Dataset::TakeWhile(PredicateFn predicate, std::string name) const {
  if (!predicate) throw Error("TakeWhile: no predicate given");
  return Dataset(
      stages::TakeWhile(base_, std::move(predicate), std::move(name)));
}
Dataset Dataset::Unique() const { return Dataset(stages::Unique(base_)); }
Dataset Dataset::Scan(Element initial_state, ScanFn fn,
                      std::string name) const {
  if (!fn) throw Error("Scan: no function given");
  return Dataset(stages::Scan(base_, std::move(initial_state), std::move(fn),
                              std::move(name)));
}
Dataset Dataset::Shuffle(int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration) const {
  CheckPositive(buffer_size, "Shuffle: buffer_size");
  return Dataset(
      stages::Shuffle(base_, buffer_size, seed, reshuffle_each_iteration));
}
Dataset Dataset::Batch(int64_t batch_size, bool drop_remainder) const {
  CheckPositive(batch_size, "Batch: batch_size");
  return Dataset(stages::Batch(base_, batch_size, drop_remainder));
}
Dataset Dataset::PaddedBatch(int64_t batch_size,
                             PaddedBatchOptions options) const {
  CheckPositive(batch_size, "PaddedBatch: batch_size");
  return Dataset(stages::PaddedBatch(base_, batch_size, std::move(options)));
}
Dataset Dataset::RaggedBatch(int64_t batch_size, bool drop_remainder) const {
  CheckPositive(batch_size, "RaggedBatch: batch_size");
  return Dataset(stages::RaggedBatch(base_, batch_size, drop_remainder));
}
Dataset Dataset::Unbatch() const { return Dataset(stages::Unbatch(base_)); }
Dataset Dataset::Rebatch(std::vector<int64_t> batch_sizes,
                         bool drop_remainder) const {
  if (batch_sizes.empty()) throw Error("Rebatch: no batch size given");
  for (int64_t n : batch_sizes) CheckPositive(n, "Rebatch: a batch size");
  return Dataset(
      stages::Rebatch(base_, std::move(batch_sizes), drop_remainder));
}
Dataset Dataset::Window(int64_t size, WindowOptions options) const {
  CheckPositive(size, "Window: size");
  if (options.shift == 0) options.shift = size;
  CheckPositive(options.shift, "Window: shift");
  CheckPositive(options.stride, "Window: stride");
  // The elements one window spans, (size - 1) * stride + 1, are buffered.
  if (size - 1 > (INT64_MAX - 1) / options.stride) {
    throw Error(fmt::format(
        "Window: size {} with stride {} spans more than 2^63 elements", size,
        options.stride));
  }
  return Dataset(stages::Window(base_, size, options));
}
Dataset Dataset::BucketBySequenceLength(LengthFn element_length,
                                        BucketOptions options,
                                        std::string name) const {
  constexpr std::string_view kWhat = "BucketBySequenceLength";
  if (!element_length) throw Error("BucketBySequenceLength: no length given");
  const auto& bounds = options.bucket_boundaries;
  if (options.bucket_batch_sizes.size() != bounds.size() + 1) {
    throw Error(fmt::format(
        "{}: {} batch sizes for {} boundaries; give one more batch size than "
        "boundaries (the last bucket holds the lengths from the last "
        "boundary up)",
        kWhat, options.bucket_batch_sizes.size(), bounds.size()));
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] <= 0 || (i > 0 && bounds[i] <= bounds[i - 1])) {
      throw Error(
          fmt::format("{}: boundaries [{}] must be positive and increasing",
                      kWhat, fmt::join(bounds, ", ")));
    }
  }
  for (int64_t size : options.bucket_batch_sizes) {
    CheckPositive(size, "BucketBySequenceLength: a batch size");
  }
  if (options.pad_to_bucket_boundary) {
    if (options.no_padding) {
      throw Error(fmt::format(
          "{}: pad_to_bucket_boundary and no_padding contradict each other",
          kWhat));
    }
    bool any = false;
    for (const auto& [key, dims] : options.padded_shapes) {
      for (int64_t d : dims) any = any || d < 0;
    }
    if (!any) {
      throw Error(fmt::format(
          "{}: pad_to_bucket_boundary pads the dimensions padded_shapes gives "
          "as -1, and it gives none",
          kWhat));
    }
  }
  if (options.no_padding &&
      (!options.padded_shapes.empty() || !options.padding_values.empty())) {
    throw Error(fmt::format(
        "{}: padded_shapes and padding_values pad, which no_padding does not",
        kWhat));
  }
  return Dataset(stages::BucketBySequenceLength(
      base_, std::move(element_length), std::move(options), std::move(name)));
}
Dataset Dataset::GroupByWindow(KeyFn key_func, int64_t window_size,
                               GroupOptions options) const {
  if (!key_func) throw Error("GroupByWindow: no key_func given");
  CheckPositive(window_size, "GroupByWindow: window_size");
  return Dataset(stages::GroupByWindow(base_, std::move(key_func), window_size,
                                       nullptr, std::move(options)));
}
Dataset Dataset::GroupByWindow(KeyFn key_func, WindowSizeFn window_size_func,
                               GroupOptions options) const {
  if (!key_func) throw Error("GroupByWindow: no key_func given");
  if (!window_size_func) {
    throw Error("GroupByWindow: no window_size_func given");
  }
  return Dataset(stages::GroupByWindow(base_, std::move(key_func), 0,
                                       std::move(window_size_func),
                                       std::move(options)));
}
Dataset::KeyFn Dataset::ComponentKey(std::string component) {
  return [component = std::move(component)](const Element& e) -> int64_t {
    const Tensor& t = e[component];
    const DType d = t.dtype();
    if (t.shape().rank() != 0 || t.ragged() ||
        (d != DType::kInt64 && d != DType::kInt32 && d != DType::kUInt8)) {
      throw Error(
          fmt::format("component '{}' is {}{}; a key must be an integer scalar",
                      component, DTypeName(d), t.shape().ToString()));
    }
    if (d == DType::kInt64) return t.scalar<int64_t>();
    if (d == DType::kInt32) return t.scalar<int32_t>();
    return t.scalar<uint8_t>();
  };
}
Dataset Dataset::BucketBySequenceLength(const std::string& component,
                                        BucketOptions options) const {
  LengthFn length = [component](const Element& e) -> int64_t {
    const Tensor& t = e[component];
    if (t.shape().rank() > 0) return t.shape()[0];
    if (t.dtype() == DType::kBytes) {
      return static_cast<int64_t>(t.bytes(0).size());
    }
    throw Error(fmt::format(
        "BucketBySequenceLength: component '{}' is a scalar ({}), which "
        "has no length (a bytes scalar's is its size)",
        component, DTypeName(t.dtype())));
  };
  return BucketBySequenceLength(std::move(length), std::move(options),
                                fmt::format("length of '{}'", component));
}
Dataset Dataset::Repeat(int64_t count) const {
  return Dataset(stages::Repeat(base_, count));
}
Dataset Dataset::Take(int64_t count) const {
  return Dataset(stages::Take(base_, count));
}
namespace {

// A class distribution `what` of ResampleOptions: probabilities that sum
// to 1 (to within rounding).
void CheckDistribution(const std::vector<double>& dist, const char* what) {
  double sum = 0;
  for (size_t i = 0; i < dist.size(); ++i) {
    if (!std::isfinite(dist[i]) || dist[i] < 0) {
      throw Error(
          fmt::format("RejectionResample: {}[{}] is {}; a probability is >= 0",
                      what, i, dist[i]));
    }
    sum += dist[i];
  }
  if (std::abs(sum - 1) > 1e-6) {
    throw Error(
        fmt::format("RejectionResample: {} sums to {}, not 1", what, sum));
  }
}

}  // namespace

Dataset Dataset::RejectionResample(KeyFn class_func,
                                   ResampleOptions options) const {
  if (!class_func) throw Error("RejectionResample: no class_func given");
  if (options.target_dist.empty()) {
    throw Error("RejectionResample: target_dist is empty");
  }
  CheckDistribution(options.target_dist, "target_dist");
  if (!options.initial_dist.empty()) {
    if (options.initial_dist.size() != options.target_dist.size()) {
      throw Error(fmt::format(
          "RejectionResample: initial_dist has {} classes, target_dist {}",
          options.initial_dist.size(), options.target_dist.size()));
    }
    CheckDistribution(options.initial_dist, "initial_dist");
  }
  return Dataset(stages::RejectionResample(base_, std::move(class_func),
                                           std::move(options)));
}

Dataset Dataset::AssertCardinality(int64_t expected) const {
  if (expected < 0 && expected != kInfiniteCardinality) {
    throw Error(fmt::format(
        "AssertCardinality: expected {} is neither a count (>= 0) nor "
        "kInfiniteCardinality ({})",
        expected, kInfiniteCardinality));
  }
  return Dataset(stages::AssertCardinality(base_, expected));
}
Dataset Dataset::Skip(int64_t count) const {
  return Dataset(stages::Skip(base_, count));
}
Dataset Dataset::Shard(int64_t num_shards, int64_t index) const {
  CheckPositive(num_shards, "Shard: num_shards");
  if (index < 0 || index >= num_shards) {
    throw Error(
        fmt::format("Shard: index {} is not in [0, {})", index, num_shards));
  }
  if (DatasetPtr by_file = base_->ShardByFiles(num_shards, index)) {
    return Dataset(std::move(by_file));
  }
  return Dataset(stages::Shard(base_, num_shards, index));
}
Dataset Dataset::FlatMap(InterleaveFn fn) const {
  return Interleave(std::move(fn), /*cycle_length=*/1, /*block_length=*/1,
                    "flat_map");
}
Dataset Dataset::Interleave(InterleaveFn fn, int64_t cycle_length,
                            int64_t block_length, std::string name) const {
  InterleaveOptions options;
  options.block_length = block_length;
  options.name = std::move(name);
  return Interleave(std::move(fn), cycle_length, std::move(options));
}
Dataset Dataset::Interleave(InterleaveFn fn, int64_t cycle_length,
                            InterleaveOptions options) const {
  if (cycle_length == kAutotune) {
    cycle_length = MachineCores();
  }
  if (cycle_length <= 0) {
    throw Error(fmt::format(
        "Interleave: cycle_length must be positive, or -1 for one input per "
        "core, not {}",
        cycle_length));
  }
  CheckPositive(options.block_length, "Interleave: block_length");
  if (options.num_parallel_calls == kAutotune) {
    options.num_parallel_calls = static_cast<int>(
        std::min<int64_t>(cycle_length, std::numeric_limits<int>::max()));
  }
  if (options.num_parallel_calls <= 0) {
    throw Error(fmt::format(
        "Interleave: num_parallel_calls must be positive, or -1 for "
        "cycle_length, not {}",
        options.num_parallel_calls));
  }
  if (options.buffer_output_elements != kAutotune) {
    CheckPositive(options.buffer_output_elements,
                  "Interleave: buffer_output_elements (or -1 to autotune it)");
  }
  return Dataset(stages::Interleave(base_, std::move(fn), cycle_length,
                                    std::move(options)));
}
Dataset Dataset::Prefetch(int64_t buffer_size, uint64_t max_bytes) const {
  if (buffer_size <= 0 && buffer_size != kAutotune) {
    throw Error(fmt::format(
        "Prefetch: buffer_size must be positive, or -1 to autotune it, not {}",
        buffer_size));
  }
  return Dataset(stages::Prefetch(base_, buffer_size, max_bytes));
}
Dataset Dataset::Cache(std::string filename) const {
  return Dataset(stages::Cache(base_, std::move(filename)));
}
Dataset Dataset::IgnoreErrors() const {
  return Dataset(stages::IgnoreErrors(base_));
}

Iterator Dataset::MakeIterator(IteratorOptions options) const {
  return Iterator(base_, options);
}

// --- Iterator --------------------------------------------------------------

Iterator::Iterator(DatasetPtr dataset, IteratorOptions options)
    : dataset_(std::move(dataset)),
      ctx_(std::make_unique<IteratorContext>(options)),
      output_memory_(std::move(options.output_memory)),
      prepare_(std::move(options.prepare)) {
  if (output_memory_ && output_memory_->kind() == MemoryKind::kDevice) {
    throw Error(fmt::format(
        "IteratorOptions.output_memory must be host memory: the pipeline "
        "delivers host tensors, and {} is a GPU's",
        output_memory_->name()));
  }
  root_ = dataset_->MakeIterator(ctx_.get(), 0);
  AskRootToDeliver();
}

void Iterator::AskRootToDeliver() {
  root_delivers_ = output_memory_ && root_->DeliverIn(output_memory_);
  root_prepares_ = prepare_ && root_->PrepareWith(prepare_);
}

Iterator::~Iterator() {
  if (ctx_) ctx_->Cancel();
  root_.reset();
}

Iterator::Iterator(Iterator&&) noexcept = default;
Iterator& Iterator::operator=(Iterator&& o) noexcept {
  if (this != &o) {
    if (ctx_) ctx_->Cancel();
    root_.reset();
    dataset_ = std::move(o.dataset_);
    root_ = std::move(o.root_);
    ctx_ = std::move(o.ctx_);
    started_ = o.started_;
    output_memory_ = std::move(o.output_memory_);
    root_delivers_ = o.root_delivers_;
    prepare_ = std::move(o.prepare_);
    root_prepares_ = o.root_prepares_;
  }
  return *this;
}

bool Iterator::Next(Element* out) {
  started_ = true;
  if (!root_->GetNext(out)) return false;
  if (output_memory_ && !root_delivers_) out->CopyInto(output_memory_);
  if (prepare_ && !root_prepares_) prepare_(*out);
  return true;
}

std::optional<Element> Iterator::Next() {
  Element e;
  if (!Next(&e)) return std::nullopt;
  return e;
}

std::string Iterator::Save() {
  StateWriter w(dataset_->Describe());
  w.U64(ctx_->seed());
  root_->Save(&w);
  return std::move(w).Finish();
}

void Iterator::Restore(std::string_view state) {
  if (started_) {
    throw Error("Iterator::Restore: only before the first Next()");
  }
  StateReader r(state, dataset_->Describe());
  // A fresh tree, so that nothing read ahead before the restore survives.
  root_.reset();
  ctx_->set_seed(r.U64());
  root_ = dataset_->MakeIterator(ctx_.get(), 0);
  AskRootToDeliver();
  root_->Restore(&r);
  r.Finish();
}

std::vector<StageStats> Iterator::Stats() const { return ctx_->Stats(); }

}  // namespace recflow::pipeline
