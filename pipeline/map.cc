// Map and Prefetch.  Map with num_parallel_calls 1 runs the function on the
// consumer's thread; otherwise both are AsyncIterators.
#include <fmt/format.h>

#include <deque>
#include <optional>

#include "pipeline/async_iterator.h"
#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

int ParallelCalls(int requested, const IteratorContext& ctx) {
  return requested == kAutotune ? ctx.threads() : requested;
}

class MapDataset final : public UnaryDataset {
 public:
  MapDataset(DatasetPtr input, MapFn fn, MapOptions options,
             std::shared_ptr<const ParseInfo> parse)
      : UnaryDataset(std::move(input)),
        fn_(std::move(fn)),
        options_(std::move(options)),
        parse_(std::move(parse)) {}

  // The parallelism is not part of the description: a state saved with one
  // thread count restores with another.
  std::string Label() const override {
    return fmt::format("Map({}{})", options_.name,
                       options_.deterministic ? "" : ", deterministic=false");
  }
  std::string StageName() const override {
    return parse_ ? "parse" : "map:" + options_.name;
  }
  int64_t Cardinality() const override { return input_->Cardinality(); }
  int Parallelism(const IteratorContext& ctx) const override {
    return ParallelCalls(options_.num_parallel_calls, ctx);
  }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    const int calls = ParallelCalls(options_.num_parallel_calls, *ctx);
    if (parse_) {
      if (auto fused =
              MakeFusedBatchParse(*this, input_, *parse_, calls, ctx, salt)) {
        return fused;
      }
    }
    auto in = input_->MakeIterator(ctx, salt);
    if (calls <= 1) return std::make_unique<SyncIt>(this, std::move(in));
    AsyncIterator::Config config;
    config.stage = "map";
    // Room for 64 elements (at least twice the calls) and 64 MiB: a
    // buffer of 2 x calls made the threads hand over every element one by
    // one, 4x slower for per-record functions (docs/PERFORMANCE.md).
    config.max_elements = static_cast<size_t>(std::max(2 * calls, 64));
    config.max_bytes = uint64_t{64} << 20;
    config.fn = fn_;
    if (parse_) {
      // A Parse of batches: the batches in flight (the buffer, the calls
      // at work and the consumer's) give their buffers back for reuse
      // while the iterator, whose function holds this, lives.
      config.fn = [fn = fn_, held = HoldParsedBuffers(
                                 *parse_, config.max_elements +
                                              static_cast<size_t>(calls) + 1)](
                      Element e) { return fn(std::move(e)); };
    }
    config.parallel_calls = calls;
    config.deterministic = options_.deterministic;
    return std::make_unique<AsyncIterator>(
        ctx, std::move(in), ctx->Counter(this, StageName()), std::move(config));
  }

 private:
  // The same state layout as the AsyncIterator ("map": input ended,
  // buffered results, the input), so a state moves between thread counts.
  class SyncIt final : public IteratorBase {
   public:
    SyncIt(const MapDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      if (!pending_.empty()) {
        Pending p = std::move(pending_.front());
        pending_.pop_front();
        if (p.error) std::rethrow_exception(p.error);
        *out = std::move(p.element);
        return true;
      }
      if (end_) return false;
      Element e;
      if (!in_->GetNext(&e)) {
        end_ = true;
        return false;
      }
      *out = d_->fn_(std::move(e));
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("map");
      w->Bool(end_);
      w->U64(pending_.size() + (end_ ? 1 : 0));
      for (const auto& p : pending_) {
        WriteResult(w, false, p.error, p.element);
      }
      if (end_) WriteResult(w, true, nullptr, Element{});
      in_->Save(w);
    }
    // Results a parallel map had buffered when the state was saved come
    // first.
    void Restore(StateReader* r) override {
      r->BeginStage("map");
      end_ = r->Bool();
      const uint64_t n = r->U64();
      pending_.clear();
      for (uint64_t i = 0; i < n; ++i) {
        Pending p;
        bool end = false;
        ReadResult(r, &end, &p.error, &p.element);
        if (!end) pending_.push_back(std::move(p));
      }
      in_->Restore(r);
    }

   private:
    struct Pending {
      Element element;
      std::exception_ptr error;
    };
    const MapDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    bool end_ = false;
    std::deque<Pending> pending_;
  };

  MapFn fn_;
  MapOptions options_;
  std::shared_ptr<const ParseInfo> parse_;
};

class PrefetchDataset final : public UnaryDataset {
 public:
  PrefetchDataset(DatasetPtr input, int64_t buffer_size, uint64_t max_bytes)
      : UnaryDataset(std::move(input)),
        buffer_size_(buffer_size),
        max_bytes_(max_bytes) {}
  std::string Label() const override { return "Prefetch()"; }
  std::string StageName() const override { return "prefetch"; }
  int64_t Cardinality() const override { return input_->Cardinality(); }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    AsyncIterator::Config config;
    config.stage = "prefetch";
    if (buffer_size_ == kAutotune) {
      config.autotune = true;
      config.max_elements = static_cast<size_t>(kAutotunePrefetchElements);
      config.max_bytes = max_bytes_ != 0 ? max_bytes_ : kAutotunePrefetchBytes;
    } else {
      config.max_elements = static_cast<size_t>(buffer_size_);
      config.max_bytes = max_bytes_;
    }
    return std::make_unique<AsyncIterator>(ctx, input_->MakeIterator(ctx, salt),
                                           ctx->Counter(this, StageName()),
                                           std::move(config));
  }

 private:
  int64_t buffer_size_;
  uint64_t max_bytes_;
};

}  // namespace

DatasetPtr Map(DatasetPtr input, MapFn fn, MapOptions options,
               std::shared_ptr<const ParseInfo> parse) {
  return std::make_shared<MapDataset>(std::move(input), std::move(fn),
                                      std::move(options), std::move(parse));
}
DatasetPtr Prefetch(DatasetPtr input, int64_t buffer_size, uint64_t max_bytes) {
  return std::make_shared<PrefetchDataset>(std::move(input), buffer_size,
                                           max_bytes);
}

}  // namespace recflow::pipeline::stages
