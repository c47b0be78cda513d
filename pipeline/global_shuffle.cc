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
namespace {

class GlobalShuffleDataset final : public DatasetBase {
 public:
  GlobalShuffleDataset(std::vector<std::string> files,
                       GlobalShuffleOptions options)
      : files_(std::move(files)), options_(options) {
    if (files_.empty()) throw Error("FromTFRecordsGlobalShuffle: no files");
    if (options_.num_shards < 1 || options_.shard_index < 0 ||
        options_.shard_index >= options_.num_shards) {
      throw Error(fmt::format(
          "FromTFRecordsGlobalShuffle: shard {} of {} is not a shard",
          options_.shard_index, options_.num_shards));
    }
    if (options_.num_epochs == 0 || options_.num_epochs < -1) {
      throw Error(fmt::format(
          "FromTFRecordsGlobalShuffle: num_epochs {} (expected >= 1, or -1 "
          "for as many as are read)",
          options_.num_epochs));
    }
    uint64_t total = 0;
    for (const auto& f : files_) {
      const std::string idx = records::IndexPathFor(f);
      records::Index index;
      records::ReadableFile probe(f);
      if (FileExists(idx)) {
        index = records::ReadIndex(idx, probe.size());
      } else {
        LogLine(
            fmt::format("recflow: {}: no index {}; indexing it in memory "
                        "(`recflow index` writes one)",
                        f, idx));
        index = records::BuildIndex(f);
      }
      total += index.entries.size();
      starts_.push_back(total - index.entries.size());
      indexes_.push_back(
          std::make_shared<const records::Index>(std::move(index)));
      paths_.push_back(std::make_shared<const std::string>(f));
    }
    total_ = total;
  }

  std::string Describe() const override {
    // Not the shards: a state restores with another sharding.
    return fmt::format(
        "GlobalShuffle({} files {:016x}, {} records, seed={}, "
        "reshuffle_each_iteration={}{})",
        files_.size(), FilesFingerprint(files_), total_,
        options_.seed ? fmt::format("{}", *options_.seed) : "none",
        options_.reshuffle_each_iteration,
        options_.num_epochs == 1
            ? ""
            : fmt::format(", num_epochs={}", options_.num_epochs));
  }
  std::string StageName() const override { return "global_shuffle"; }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    const uint64_t base = options_.seed
                              ? *options_.seed
                              : MixSeed(ctx->seed(), Fingerprint(Describe()));
    const uint64_t seed =
        options_.reshuffle_each_iteration ? MixSeed(base, salt) : base;
    return std::make_unique<It>(this, seed);
  }

 private:
  static bool FileExists(const std::string& path) {
    try {
      records::ReadableFile f(path);
      return true;
    } catch (const records::IoError&) {
      return false;
    }
  }

  class It final : public IteratorBase {
   public:
    It(const GlobalShuffleDataset* d, uint64_t seed)
        : d_(d),
          seed_(seed),
          order_(d->total_, seed),
          stride_(static_cast<uint64_t>(d->options_.num_shards)),
          shard_(static_cast<uint64_t>(d->options_.shard_index)),
          readers_(d->files_.size()) {}

    bool GetNext(Element* out) override {
      if (d_->total_ == 0) return false;
      const uint64_t position = start_ + shard_ + taken_ * stride_;
      const uint64_t epoch = position / d_->total_;
      if (d_->options_.num_epochs >= 0 &&
          epoch >= static_cast<uint64_t>(d_->options_.num_epochs)) {
        return false;
      }
      if (epoch != epoch_) {
        // Epoch 0 keeps the seed as it is: one epoch orders as before.
        const bool fresh = d_->options_.reshuffle_each_iteration && epoch > 0;
        order_ = FeistelPermutation(d_->total_,
                                    fresh ? MixSeed(seed_, epoch) : seed_);
        epoch_ = epoch;
      }
      const uint64_t id = order_(position % d_->total_);
      const size_t file = static_cast<size_t>(
          std::upper_bound(d_->starts_.begin(), d_->starts_.end(), id) -
          d_->starts_.begin() - 1);
      const uint64_t local = id - d_->starts_[file];
      auto& reader = readers_[file];
      if (!reader) {
        reader = std::make_unique<records::IndexedReader>(d_->files_[file],
                                                          *d_->indexes_[file]);
      }
      const std::string_view record = reader->Read(local);
      // IndexedReader::Read checked the frame; its CRC follows the payload.
      const bool at_frame =
          d_->indexes_[file]->compression == records::Compression::kNone;
      SetRecord(out, arena_.Copy(record), d_->paths_[file],
                d_->indexes_[file]->entries[local].offset, local,
                at_frame ? std::optional<uint32_t>(records::StoredDataCrc(
                               record.data(), record.size()))
                         : std::nullopt);
      ++taken_;
      return true;
    }

    void Save(StateWriter* w) override {
      w->BeginStage("global_shuffle");
      w->U64(start_);
      w->U64(stride_);
      w->U64(shard_);
      w->U64(taken_);
    }

    void Restore(StateReader* r) override {
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
      const int64_t epochs = d_->options_.num_epochs;
      const unsigned __int128 end =
          epochs < 0 ? (static_cast<unsigned __int128>(1) << 64)
                     : static_cast<unsigned __int128>(d_->total_) *
                               static_cast<uint64_t>(epochs) +
                           stride;
      if (position > end) {
        r->Fail(fmt::format(
            "position {} + {} + {} x {} is past the {} records x {} epochs",
            start, shard, stride, taken, d_->total_, epochs));
      }
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

   private:
    const GlobalShuffleDataset* d_;
    const uint64_t seed_;
    FeistelPermutation order_;  // of epoch_
    uint64_t epoch_ = 0;
    const uint64_t stride_;
    const uint64_t shard_;
    uint64_t start_ = 0;
    uint64_t taken_ = 0;
    std::vector<std::unique_ptr<records::IndexedReader>> readers_;
    RecordArena arena_;
  };

  std::vector<std::string> files_;
  GlobalShuffleOptions options_;
  std::vector<std::shared_ptr<const records::Index>> indexes_;
  std::vector<std::shared_ptr<const std::string>> paths_;
  std::vector<uint64_t> starts_;  // id of each file's first record
  uint64_t total_ = 0;
};

}  // namespace

DatasetPtr GlobalShuffle(std::vector<std::string> files,
                         GlobalShuffleOptions options) {
  return std::make_shared<GlobalShuffleDataset>(
      ExpandFiles(files, "FromTFRecordsGlobalShuffle"), options);
}

}  // namespace stages
}  // namespace recflow::pipeline
