// FromTFRecordsGlobalShuffle: every record of every file once per epoch, in
// the order of a FeistelPermutation, read through the files' indexes.
//
// Shards: reader k of W takes positions k, k + W, k + 2W, ... of the
// epoch's order.  Its state is (epoch start, W, k, records taken); all
// positions before `start + W * taken` have been taken by the group when
// every reader has taken as many (as after synchronous training steps).
// Restored with another W' or k', a reader continues from that prefix with
// the new stride: the epoch goes on with no record repeated or skipped.
//
// Epochs (num_epochs != 1): positions run on through the concatenation of
// the epochs' orders (position p is record order_e(p mod n) of epoch
// e = p / n, each epoch its own permutation), so shards keep their stride
// across epoch boundaries: after every reader took k records the group
// has taken exactly the first W * k positions, whether or not W divides n.
// That is what keeps data-parallel ranks in step, and a restart with
// another W exact, in a job that trains for several epochs.
#include "pipeline/global_shuffle.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "pipeline/io.h"
#include "pipeline/process.h"
#include "pipeline/stages.h"
#include "records/file_list.h"
#include "records/index.h"
#include "records/tfrecord_format.h"

namespace recflow::pipeline {

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t seed) : n_(n) {
  const int bits = n <= 1 ? 2 : std::bit_width(n - 1);
  half_bits_ = std::max(1, (bits + 1) / 2);
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < kRounds; ++r) {
    keys_[r] = MixSeed(seed, static_cast<uint64_t>(r));
  }
}

uint64_t FeistelPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = MixSeed(right, keys_[r]) & half_mask_;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t FeistelPermutation::operator()(uint64_t i) const {
  // The domain is at most 4n, so the walk takes under 4 steps on average.
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);
  return x;
}

namespace stages {

GlobalShuffleCursor::GlobalShuffleCursor(const GlobalShuffleSource* source,
                                         uint64_t seed)
    : source_(source),
      seed_(seed),
      order_(source->total, seed),
      stride_(static_cast<uint64_t>(source->options.num_shards)),
      shard_(static_cast<uint64_t>(source->options.shard_index)) {}

bool GlobalShuffleCursor::Exists(uint64_t t) const {
  const uint64_t total = source_->total;
  if (total == 0) return false;
  const uint64_t epoch = (start_ + shard_ + t * stride_) / total;
  const int64_t epochs = source_->options.num_epochs;
  return epochs < 0 || epoch < static_cast<uint64_t>(epochs);
}

GlobalShuffleCursor::Planned GlobalShuffleCursor::Find(uint64_t t) {
  const uint64_t total = source_->total;
  const uint64_t position = start_ + shard_ + t * stride_;
  const uint64_t epoch = position / total;
  if (epoch != epoch_) {
    // Epoch 0 keeps the seed as it is: one epoch orders as before.
    const bool fresh = source_->options.reshuffle_each_iteration && epoch > 0;
    order_ = FeistelPermutation(total, fresh ? MixSeed(seed_, epoch) : seed_);
    epoch_ = epoch;
  }
  const uint64_t id = order_(position % total);
  const auto& starts = source_->starts;
  Planned p;
  p.file = static_cast<size_t>(
      std::upper_bound(starts.begin(), starts.end(), id) - starts.begin() - 1);
  p.record = id - starts[p.file];
  return p;
}

bool GlobalShuffleCursor::Next(size_t* file, uint64_t* record) {
  if (!Exists(taken_)) return false;
  planned_until_ = std::max(planned_until_, taken_);
  while (planned_until_ < taken_ + kAhead && Exists(planned_until_)) {
    const Planned p = Find(planned_until_);
    const auto& entries = source_->indexes[p.file]->entries;
    if (p.record < entries.size()) __builtin_prefetch(&entries[p.record]);
    planned_[planned_until_ % kAhead] = p;
    ++planned_until_;
  }
  const Planned& p = planned_[taken_ % kAhead];
  *file = p.file;
  *record = p.record;
  ++taken_;
  return true;
}

void GlobalShuffleCursor::Save(StateWriter* w) const {
  w->BeginStage("global_shuffle");
  w->U64(start_);
  w->U64(stride_);
  w->U64(shard_);
  w->U64(taken_);
}

void GlobalShuffleCursor::Restore(StateReader* r) {
  r->BeginStage("global_shuffle");
  const uint64_t start = r->U64();
  const uint64_t stride = r->U64();
  const uint64_t shard = r->U64();
  const uint64_t taken = r->U64();
  if (stride == 0 || shard >= stride) {
    throw Error("global shuffle state: bad shard");
  }
  // Positions past the epoch's records end it; ones past 64 bits would
  // wrap around into it.
  const unsigned __int128 position =
      static_cast<unsigned __int128>(start) + shard +
      static_cast<unsigned __int128>(stride) * taken;
  const int64_t epochs = source_->options.num_epochs;
  const unsigned __int128 end =
      epochs < 0 ? (static_cast<unsigned __int128>(1) << 64)
                 : static_cast<unsigned __int128>(source_->total) *
                           static_cast<uint64_t>(epochs) +
                       stride;
  if (position > end) {
    r->Fail(fmt::format(
        "position {} + {} + {} x {} is past the {} records x {} epochs", start,
        shard, stride, taken, source_->total, epochs));
  }
  planned_until_ = 0;  // planned for the old position
  if (stride == stride_ && shard == shard_) {
    start_ = start;
    taken_ = taken;
  } else {
    // Elastic: every reader of the old group took `taken` records, so
    // the epoch's first start + stride * taken positions are done.
    start_ = start + stride * taken;
    taken_ = 0;
  }
}

UnreadFiles::UnreadFiles(const GlobalShuffleSource* source,
                         const std::shared_ptr<const std::string>* paths)
    : source_(source),
      paths_(paths != nullptr ? paths : source->paths.data()),
      files_(new std::atomic<
             const records::ReadableFile*>[source->paths.size()]()) {}

UnreadFiles::~UnreadFiles() {
  for (size_t i = 0; i < source_->paths.size(); ++i) delete files_[i].load();
}

const records::ReadableFile& UnreadFiles::File(size_t i) {
  const records::ReadableFile* f = files_[i].load(std::memory_order_acquire);
  if (f != nullptr) return *f;
  std::lock_guard<std::mutex> lock(mu_);
  f = files_[i].load(std::memory_order_relaxed);
  if (f == nullptr) {
    f = new records::ReadableFile(*source_->paths[i]);
    files_[i].store(f, std::memory_order_release);
  }
  return *f;
}

std::pair<size_t, uint64_t> UnreadFiles::Read(std::vector<RecordView>* views) {
  // The reads, each checked to lie in its file before a buffer is sized
  // for them; unread[j] is the view reads[j] is for.
  std::vector<size_t> unread;
  std::vector<RangeRead> reads;
  uint64_t bytes = 0;
  for (size_t k = 0; k < views->size(); ++k) {
    const RecordView& v = (*views)[k];
    // (std::less: a total order over pointers into other lists too.)
    if (!v.unread || std::less<>{}(v.path, paths_) ||
        !std::less<>{}(v.path, paths_ + source_->paths.size())) {
      continue;
    }
    const size_t file = static_cast<size_t>(v.path - paths_);
    const records::ReadableFile& f = File(file);
    records::CheckIndexedFrameFits(f, v.index,
                                   source_->indexes[file]->entries[v.index]);
    unread.push_back(k);
    reads.push_back({&f, v.offset, v.size, nullptr, 0});
    bytes += v.size;
  }
  if (unread.empty()) return {0, 0};
  // One buffer for the batch's frames (one allocation; the records lie
  // one after another, as parsing likes them), read all at once.
  auto buffer = std::make_shared<records::AlignedVector<char>>(bytes);
  char* at = buffer->data();
  for (RangeRead& r : reads) {
    r.dst = at;
    at += r.length;
  }
  ReadRanges(reads);
  std::shared_ptr<const void> owner = buffer;
  uint64_t payload_bytes = 0;
  for (size_t j = 0; j < unread.size(); ++j) {
    RecordView& v = (*views)[unread[j]];
    const size_t file = static_cast<size_t>(v.path - paths_);
    const std::string_view payload = records::CheckIndexedFrame(
        **v.path, v.index, source_->indexes[file]->entries[v.index],
        reads[j].dst, reads[j].done);
    v.data = payload.data();
    v.size = payload.size();
    v.owner = owner;
    v.storage_bytes = buffer->size();
    v.frame_crc = records::StoredDataCrc(payload.data(), payload.size());
    v.unread = false;
    payload_bytes += payload.size();
  }
  return {unread.size(), payload_bytes};
}

namespace {

class GlobalShuffleDataset final : public DatasetBase {
 public:
  GlobalShuffleDataset(std::vector<std::string> files,
                       GlobalShuffleOptions options)
      : files_(std::move(files)) {
    source_.options = options;
    if (files_.empty()) throw Error("FromTFRecordsGlobalShuffle: no files");
    if (options.num_shards < 1 || options.shard_index < 0 ||
        options.shard_index >= options.num_shards) {
      throw Error(fmt::format(
          "FromTFRecordsGlobalShuffle: shard {} of {} is not a shard",
          options.shard_index, options.num_shards));
    }
    if (options.num_epochs == 0 || options.num_epochs < -1) {
      throw Error(fmt::format(
          "FromTFRecordsGlobalShuffle: num_epochs {} (expected >= 1, or -1 "
          "for as many as are read)",
          options.num_epochs));
    }
    records::RequireRegularFiles(files_, kSourcesNeedRegularFiles);
    uint64_t total = 0;
    for (const auto& f : files_) {
      records::Index index = records::LoadOrBuildIndex(
          f, records::ReadableFile(f).size(), [&](const std::string& idx) {
            LogLine(fmt::format(
                "recflow: {}: no index {}; indexing it in memory (`recflow "
                "index` writes one)",
                f, idx));
          });
      total += index.entries.size();
      source_.starts.push_back(total - index.entries.size());
      source_.indexes.push_back(
          std::make_shared<const records::Index>(std::move(index)));
      source_.paths.push_back(std::make_shared<const std::string>(f));
    }
    source_.total = total;
  }

  std::string Describe() const override {
    // Not the shards: a state restores with another sharding.
    const GlobalShuffleOptions& o = source_.options;
    return fmt::format(
        "GlobalShuffle({} files {:016x}, {} records, seed={}, "
        "reshuffle_each_iteration={}{})",
        files_.size(), FilesFingerprint(files_), source_.total,
        o.seed ? fmt::format("{}", *o.seed) : "none",
        o.reshuffle_each_iteration,
        o.num_epochs == 1 ? "" : fmt::format(", num_epochs={}", o.num_epochs));
  }
  std::string StageName() const override { return "global_shuffle"; }
  // This shard's positions shard_index, shard_index + num_shards, ... of
  // the epochs' stream.
  int64_t Cardinality() const override {
    const auto& o = source_.options;
    if (source_.total == 0) return 0;
    if (o.num_epochs < 0) return kInfiniteCardinality;
    const __int128 positions =
        static_cast<__int128>(source_.total) * o.num_epochs;
    if (positions <= o.shard_index) return 0;
    const __int128 n = (positions - o.shard_index - 1) / o.num_shards + 1;
    return n > INT64_MAX ? kUnknownCardinality : static_cast<int64_t>(n);
  }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, Seed(ctx, salt));
  }

  // Fused (Parse(Batch(...))): records are planned here and read by the
  // parse calls, many at once.  ZSTD files decode frames a reader caches,
  // so they stay stage by stage.
  bool DescribeForFusion(FusableStage* out) const override {
    for (const auto& index : source_.indexes) {
      if (index->compression != records::Compression::kNone) return false;
    }
    out->kind = FusableStage::Kind::kGlobalShuffle;
    out->global = &source_;
    out->paths = &source_.paths;
    out->shuffle_seed = [this](IteratorContext* ctx, uint64_t salt) {
      return Seed(ctx, salt);
    };
    return true;
  }

 private:
  uint64_t Seed(IteratorContext* ctx, uint64_t salt) const {
    const GlobalShuffleOptions& o = source_.options;
    return StageSeed(*this, o.seed, *ctx, salt, o.reshuffle_each_iteration);
  }

  class It final : public IteratorBase {
   public:
    It(const GlobalShuffleDataset* d, uint64_t seed)
        : d_(d), cursor_(&d->source_, seed), readers_(d->files_.size()) {}

    bool GetNext(Element* out) override {
      size_t file = 0;
      uint64_t local = 0;
      if (!cursor_.Next(&file, &local)) return false;
      const GlobalShuffleSource& source = d_->source_;
      auto& reader = readers_[file];
      if (!reader) {
        reader = std::make_unique<records::IndexedReader>(d_->files_[file],
                                                          source.indexes[file]);
      }
      const std::string_view record = reader->Read(local);
      // IndexedReader::Read checked the frame; its CRC follows the payload.
      const bool at_frame =
          source.indexes[file]->compression == records::Compression::kNone;
      SetRecord(out, arena_.Copy(record), source.paths[file],
                source.indexes[file]->entries[local].offset, local,
                at_frame ? std::optional<uint32_t>(records::StoredDataCrc(
                               record.data(), record.size()))
                         : std::nullopt);
      return true;
    }

    void Save(StateWriter* w) override { cursor_.Save(w); }
    void Restore(StateReader* r) override { cursor_.Restore(r); }

   private:
    const GlobalShuffleDataset* d_;
    GlobalShuffleCursor cursor_;
    std::vector<std::unique_ptr<records::IndexedReader>> readers_;
    RecordArena arena_;
  };

  std::vector<std::string> files_;
  GlobalShuffleSource source_;
};

}  // namespace

DatasetPtr GlobalShuffle(std::vector<std::string> files,
                         GlobalShuffleOptions options) {
  return std::make_shared<GlobalShuffleDataset>(
      ExpandFiles(files, "FromTFRecordsGlobalShuffle"), options);
}

}  // namespace stages
}  // namespace recflow::pipeline
