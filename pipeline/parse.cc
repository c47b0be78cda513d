// Parse: serialized tf.Examples to tensors, through records::ExampleParser.
// A batch of records (a vector) is parsed in one vectorised call; its
// outputs are adopted as tensors without a copy, and their buffers come
// back for the next batches when the tensors go (ParsedBuffers).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "pipeline/stages.h"
#include "records/example_parser.h"

namespace recflow::pipeline::stages {
namespace {

Shape FeatureShape(const records::ParsedFeature& f, bool batched, int64_t n) {
  if (f.config.kind != records::FeatureConfig::Kind::kFixed) {
    return Shape{static_cast<int64_t>(f.num_values())};
  }
  Shape shape(std::span<const int64_t>(f.config.shape));
  return batched ? shape.Prepend(n) : shape;
}

// Buffers freed because their list was full (ParsedBuffersFreed).
std::atomic<uint64_t> parsed_buffers_freed{0};

}  // namespace

class ParsedBuffers : public std::enable_shared_from_this<ParsedBuffers> {
 public:
  // Batches come back one by one, and each new batch takes what came
  // back: so many batches' buffers per feature wait here, at least kKeep,
  // and as many as the iterators parsing now have in flight (Hold).
  // Why: a fused stage of 16 parse calls has 33 batches in flight, and
  // with 4 kept half of its batch buffers were freed by the consumer's
  // thread and allocated again by a parse task (glibc's arena locks and a
  // heap per arena: ~150 against ~100 MiB peak RSS shuffled, and 4-17%
  // of the records/s, on this project's VM; docs/PERFORMANCE.md).
  static constexpr size_t kKeep = 4;

  // For `parser`'s batches: a batch taken when no shell waits is shaped
  // for its spec here, so that it too is parsed into buffers given back.
  explicit ParsedBuffers(std::shared_ptr<const records::ExampleParser> parser)
      : parser_(std::move(parser)), free_(parser_->spec().features.size()) {}

  // An iterator that has up to `batches` batches in flight (parsed ahead
  // and not yet given back), until it calls Release(batches).
  void Hold(size_t batches) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ += batches;
  }
  // Lets go of a Hold: what waits beyond the new limit is freed.
  void Release(size_t batches) {
    std::vector<Free> excess;
    std::vector<records::ParsedBatch> shells;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ -= std::min(held_, batches);
      const size_t keep = Limit();
      excess.resize(free_.size());
      for (size_t d = 0; d < free_.size(); ++d) {
        MoveExcess(&free_[d].floats, &excess[d].floats, keep);
        MoveExcess(&free_[d].ints, &excess[d].ints, keep);
        MoveExcess(&free_[d].rows, &excess[d].rows, keep);
        MoveExcess(&free_[d].bytes, &excess[d].bytes, keep);
      }
      MoveExcess(&shells_, &shells, keep);
    }
    // Freed here, out of the lock.
  }

  // A batch to parse into, shaped for the spec (an earlier one's shell
  // where one waits), with recycled buffers where there are.  Why shaped
  // here: a shell is made for each batch parsed at once, and an unshaped
  // one would take no buffers; when more tasks than before parsed at once,
  // its new buffers came on top of those waiting, one batch's more than
  // the hold for each, and as many were freed later (a flaky count in
  // BatchBuffersInFlightAreReusedNotFreed under ASan).
  records::ParsedBatch Take() {
    records::ParsedBatch b;
    std::unique_lock<std::mutex> lock(mu_);
    if (!shells_.empty()) {
      b = std::move(shells_.back());
      shells_.pop_back();
    } else {
      lock.unlock();  // the names are allocated out of the lock
      parser_->ShapeOutput(&b);
      lock.lock();
    }
    for (size_t d = 0; d < b.features.size() && d < free_.size(); ++d) {
      records::ParsedFeature& f = b.features[d];
      Free& free = free_[d];
      Lend(&free.floats, &f.floats);
      Lend(&free.ints, &f.ints);
      Lend(&free.rows, &f.row_lengths);
      if (f.bytes_data.capacity() <= std::string().capacity() &&
          !free.bytes.empty()) {
        Tensor::BytesBuffers b = TakeAt(&free.bytes, Pick(free.bytes));
        f.bytes_data = std::move(b.data);
        f.bytes_offsets = std::move(b.offsets);
      }
    }
    return b;
  }

  // The shell of a batch whose buffers went into tensors.
  void Return(records::ParsedBatch&& b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (shells_.size() < Limit()) shells_.push_back(std::move(b));
  }

  // Feature `d`'s tensor.  A batch's buffers come back here when it goes;
  // one record's are too small to be worth it (and parse calls of single
  // records would all meet at this lock), so they are freed.
  Tensor TensorOf(size_t d, records::ParsedFeature& f, bool batched,
                  int64_t n) {
    const Shape shape = FeatureShape(f, batched, n);
    const auto keep = [&]<typename T>(T&& buffer,
                                      std::vector<Kept<T>> Free::*list) {
      return batched ? Recycling(std::move(buffer), list, d)
                     : std::make_shared<const T>(std::move(buffer));
    };
    Tensor values;
    switch (f.config.dtype) {
      case DType::kFloat32:
        values = Tensor::Adopt(keep(std::move(f.floats), &Free::floats), shape);
        break;
      case DType::kInt64:
        values = Tensor::Adopt(keep(std::move(f.ints), &Free::ints), shape);
        break;
      case DType::kBytes:
        values = Tensor::AdoptBytes(
            keep(Tensor::BytesBuffers{std::move(f.bytes_data),
                                      std::move(f.bytes_offsets)},
                 &Free::bytes),
            shape);
        break;
      default:  // not an Example dtype: ExampleParser refuses such a spec
        break;
    }
    if (f.config.kind == records::FeatureConfig::Kind::kFixed || !batched) {
      return values;
    }
    const auto rows = static_cast<int64_t>(f.row_lengths.size());
    return Tensor::Ragged(
        std::move(values),
        Tensor::Adopt(keep(std::move(f.row_lengths), &Free::rows),
                      Shape{rows}));
  }

 private:
  // A buffer waiting for reuse, with the thread that last parsed into it.
  // A batch takes the newest one its own thread filled, else the newest:
  // that thread's cache may still hold its lines, where the newest
  // buffer's lines are in the cache of whichever thread filled it, and
  // writing them there costs a transfer a line.  (The MNIST fixture
  // shuffled at 2 threads on 2 vCPUs, 800 KiB batches: 2.72 against 2.62
  // M records/s, medians of 8 alternating rounds, when writing a line the
  // other vCPU wrote costs 1.5 ns; the same when it costs 0.6 ns;
  // docs/PERFORMANCE.md.)
  template <typename T>
  struct Kept {
    T buffer;
    uint32_t writer = 0;  // ThreadToken() of the thread that filled it
  };
  struct Free {
    std::vector<Kept<records::AlignedVector<float>>> floats;
    std::vector<Kept<records::AlignedVector<int64_t>>> ints;
    std::vector<Kept<records::AlignedVector<int64_t>>> rows;
    std::vector<Kept<Tensor::BytesBuffers>> bytes;
  };
  static uint32_t ThreadToken() {
    static std::atomic<uint32_t> next{1};
    thread_local const uint32_t token =
        next.fetch_add(1, std::memory_order_relaxed);
    return token;
  }
  // The index in `free` of the buffer to lend: the newest one this
  // thread filled, else the newest.
  template <typename T>
  static size_t Pick(const std::vector<Kept<T>>& free) {
    const uint32_t me = ThreadToken();
    for (size_t i = free.size(); i-- > 0;) {
      if (free[i].writer == me) return i;
    }
    return free.size() - 1;
  }
  template <typename T>
  static T TakeAt(std::vector<Kept<T>>* free, size_t i) {
    T b = std::move((*free)[i].buffer);
    free->erase(free->begin() + static_cast<std::ptrdiff_t>(i));
    return b;
  }

  size_t Limit() const { return std::max(kKeep, held_); }  // mu_ held

  template <typename T>
  static void MoveExcess(std::vector<T>* from, std::vector<T>* to,
                         size_t keep) {
    while (from->size() > keep) {
      to->push_back(std::move(from->back()));
      from->pop_back();
    }
  }

  template <typename T>
  static void Lend(std::vector<Kept<T>>* free, T* to) {
    if (to->capacity() > 0 || free->empty()) return;
    *to = TakeAt(free, Pick(*free));
  }

  // A buffer lent to a tensor, with where it goes back when the tensor's
  // last reference goes: one allocation for both (make_shared), freed by
  // the thread that drops the batch, often the consumer's; a buffer and a
  // separate shared count were two, each a free() there in an arena a
  // parse task allocates in.
  template <typename T>
  struct Lent {
    Lent(T&& b, std::shared_ptr<ParsedBuffers> h, std::vector<Kept<T>> Free::*l,
         size_t i)
        : buffer(std::move(b)),
          home(std::move(h)),
          list(l),
          d(i),
          writer(ThreadToken()) {}
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;
    ~Lent() { home->Put(list, d, &buffer, writer); }
    T buffer;
    std::shared_ptr<ParsedBuffers> home;
    std::vector<Kept<T>> Free::*list;
    size_t d;
    uint32_t writer;
  };

  // `buffer`, kept alive by the result; then back to list `list` of
  // feature `d`, or freed when that list is full.
  template <typename T>
  std::shared_ptr<const T> Recycling(T&& buffer,
                                     std::vector<Kept<T>> Free::*list,
                                     size_t d) {
    auto lent = std::make_shared<Lent<T>>(std::move(buffer), shared_from_this(),
                                          list, d);
    const T* held = &lent->buffer;
    return std::shared_ptr<const T>(std::move(lent), held);
  }
  template <typename T>
  void Put(std::vector<Kept<T>> Free::*list, size_t d, T* buffer,
           uint32_t writer) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (d >= free_.size()) return;
    std::vector<Kept<T>>& to = free_[d].*list;
    if (to.size() >= Limit()) {
      parsed_buffers_freed.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    try {
      to.push_back({std::move(*buffer), writer});
    } catch (...) {  // out of memory: the buffer is freed instead
      parsed_buffers_freed.fetch_add(1, std::memory_order_relaxed);
    }
  }

  const std::shared_ptr<const records::ExampleParser> parser_;
  std::mutex mu_;
  size_t held_ = 0;  // batches in flight, of every Hold
  std::vector<records::ParsedBatch> shells_;
  std::vector<Free> free_;  // by feature; its size is fixed
};

namespace {

records::ParseContext Context(const Element& e, int64_t i) {
  const std::optional<Origin> o = e.OriginOf(i);
  if (!o) return {};
  return {*o->file, o->record};
}

// The serialized records of `in`'s `key`: a bytes scalar (one record) or
// vector (a batch, *batched).  Throws Error naming `stage` and `what` the
// records hold.  A ragged vector is refused: its rows are not records.
std::vector<std::string_view> SerializedRecords(const Element& in,
                                                const std::string& key,
                                                std::string_view stage,
                                                std::string_view what,
                                                bool* batched) {
  const Tensor* t = in.Find(key);
  if (t == nullptr || t->dtype() != DType::kBytes || t->shape().rank() > 1 ||
      t->ragged()) {
    throw Error(
        fmt::format("{}: the element needs a bytes scalar or vector '{}' of "
                    "serialized {}; it has {}",
                    stage, key, what, in.DebugString()));
  }
  *batched = t->shape().rank() == 1;
  const int64_t n = *batched ? t->shape()[0] : 1;
  std::vector<std::string_view> serialized(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) serialized[i] = t->bytes(i);
  return serialized;
}

// parser.ParseBatch(serialized, out, ...) (an ExampleParser or a
// SequenceExampleParser), the records named by `origins`' origins.  A bad
// record of a batch is found by parsing the records one by one, so that
// the error names its own file and record.
template <typename Parser, typename Parsed>
void ParseNamingTheBadRecord(const Parser& parser,
                             std::span<const std::string_view> serialized,
                             bool batched, const Element& origins,
                             Parsed* out) {
  try {
    parser.ParseBatch(serialized, out,
                      batched ? records::ParseContext{} : Context(origins, 0));
  } catch (const records::ParseError&) {
    if (!batched) throw;
    Parsed one;
    for (size_t i = 0; i < serialized.size(); ++i) {
      parser.ParseBatch(serialized.subspan(i, 1), &one,
                        Context(origins, static_cast<int64_t>(i)));
    }
    throw;
  }
}

class ParseFn {
 public:
  explicit ParseFn(std::shared_ptr<const ParseInfo> info)
      : info_(std::move(info)) {}

  Element operator()(Element in) const {
    const std::string& key = info_->options.record_key;
    bool batched = false;
    const std::vector<std::string_view> serialized =
        SerializedRecords(in, key, "Parse", "tf.Examples", &batched);
    Element out;
    out.origin = std::move(in.origin);
    out.batch_origins = std::move(in.batch_origins);
    ParseRecords(*info_, serialized, batched, &out);
    if (info_->options.keep_record) out.components.push_back({key, in[key]});
    return out;
  }

 private:
  std::shared_ptr<const ParseInfo> info_;
};

}  // namespace

void ParseRecords(const ParseInfo& info,
                  std::span<const std::string_view> serialized, bool batched,
                  Element* out) {
  const records::ExampleParser& parser = *info.parser;
  ParsedBuffers* buffers = info.buffers.get();
  const auto n = static_cast<int64_t>(serialized.size());
  records::ParsedBatch parsed =
      batched ? buffers->Take() : records::ParsedBatch{};
  ParseNamingTheBadRecord(parser, serialized, batched, *out, &parsed);
  // One allocation for the components (and the records, if kept after).
  out->components.reserve(out->components.size() + parsed.features.size() +
                          (info.options.keep_record ? 1 : 0));
  for (size_t d = 0; d < parsed.features.size(); ++d) {
    records::ParsedFeature& f = parsed.features[d];
    out->components.push_back({f.name, buffers->TensorOf(d, f, batched, n)});
  }
  if (batched) buffers->Return(std::move(parsed));
}

std::shared_ptr<void> HoldParsedBuffers(const ParseInfo& info, size_t batches) {
  if (info.buffers == nullptr || batches == 0) return nullptr;
  info.buffers->Hold(batches);
  return std::shared_ptr<void>(
      info.buffers.get(),
      [buffers = info.buffers, batches](void*) { buffers->Release(batches); });
}

uint64_t ParsedBuffersFreed() {
  return parsed_buffers_freed.load(std::memory_order_relaxed);
}

namespace {

// The values of `f` as a tensor of `shape` (their buffers adopted).
Tensor ValuesOf(records::ParsedFeature& f, const Shape& shape) {
  switch (f.config.dtype) {
    case DType::kFloat32:
      return Tensor::Adopt(std::move(f.floats), shape);
    case DType::kInt64:
      return Tensor::Adopt(std::move(f.ints), shape);
    default:  // bytes: the only other dtype an Example holds
      return Tensor::AdoptBytes(std::move(f.bytes_data),
                                std::move(f.bytes_offsets), shape);
  }
}

Tensor Int64Vector(records::AlignedVector<int64_t>&& v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::Adopt(std::move(v), Shape{n});
}

// Per record, the sum of each run of `runs[i]` lengths of `lengths`: the
// values of each record's steps.
records::AlignedVector<int64_t> SumRuns(
    const records::AlignedVector<int64_t>& runs,
    const records::AlignedVector<int64_t>& lengths) {
  records::AlignedVector<int64_t> sums(runs.size());
  size_t at = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    int64_t sum = 0;
    for (int64_t k = 0; k < runs[i]; ++k) sum += lengths[at++];
    sums[i] = sum;
  }
  return sums;
}

constexpr std::string_view kStepLengths = "/step_lengths";

class ParseSequenceFn {
 public:
  ParseSequenceFn(std::shared_ptr<const records::SequenceExampleParser> parser,
                  ParseOptions options)
      : parser_(std::move(parser)), options_(std::move(options)) {}

  Element operator()(Element in) const {
    const std::string& key = options_.record_key;
    bool batched = false;
    const std::vector<std::string_view> serialized = SerializedRecords(
        in, key, "ParseSequence", "tf.SequenceExamples", &batched);
    const auto n = static_cast<int64_t>(serialized.size());
    Element out;
    out.origin = std::move(in.origin);
    out.batch_origins = std::move(in.batch_origins);
    records::ParsedSequenceBatch parsed;
    ParseNamingTheBadRecord(*parser_, serialized, batched, out, &parsed);
    // The context's tensors as Parse's, without ParsedBuffers' recycling:
    // SequenceExampleParser clears its outputs, so there is no batch shell
    // to lend buffers to.
    for (records::ParsedFeature& f : parsed.context.features) {
      const bool fixed = f.config.kind == records::FeatureConfig::Kind::kFixed;
      Tensor values = ValuesOf(f, FeatureShape(f, batched, n));
      out.components.push_back(
          {f.name,
           fixed || !batched
               ? std::move(values)
               : Tensor::Ragged(std::move(values),
                                Int64Vector(std::move(f.row_lengths)))});
    }
    for (records::ParsedFeature& f : parsed.sequence.features) {
      AddSequenceFeature(f, batched, &out);
    }
    if (options_.keep_record) out.components.push_back({key, in[key]});
    return out;
  }

 private:
  static void AddSequenceFeature(records::ParsedFeature& f, bool batched,
                                 Element* out) {
    int64_t steps = 0;
    for (int64_t s : f.row_lengths) steps += s;
    if (f.config.kind == records::FeatureConfig::Kind::kFixed) {
      // [steps, S...]: over a batch, ragged in the steps.
      Shape shape =
          Shape(std::span<const int64_t>(f.config.shape)).Prepend(steps);
      Tensor values = ValuesOf(f, shape);
      out->components.push_back(
          {f.name, batched
                       ? Tensor::Ragged(std::move(values),
                                        Int64Vector(std::move(f.row_lengths)))
                       : std::move(values)});
      return;
    }
    const auto total = static_cast<int64_t>(f.num_values());
    if (!batched) {  // [steps, (values)]
      out->components.push_back(
          {f.name, Tensor::Ragged(ValuesOf(f, Shape{total}),
                                  Int64Vector(std::move(f.step_lengths)))});
      return;
    }
    records::AlignedVector<int64_t> per_record =
        SumRuns(f.row_lengths, f.step_lengths);
    out->components.push_back(
        {f.name, Tensor::Ragged(ValuesOf(f, Shape{total}),
                                Int64Vector(std::move(per_record)))});
    out->components.push_back(
        {f.name + std::string(kStepLengths),
         Tensor::Ragged(Int64Vector(std::move(f.step_lengths)),
                        Int64Vector(std::move(f.row_lengths)))});
  }

  std::shared_ptr<const records::SequenceExampleParser> parser_;
  ParseOptions options_;
};

}  // namespace

DatasetPtr ParseSequence(DatasetPtr input, records::FeatureSpec context,
                         records::FeatureSpec sequence, ParseOptions options) {
  for (const auto& [name, c] : sequence.features) {
    if (context.Find(name) != nullptr) {
      throw Error(fmt::format(
          "ParseSequence: '{}' is in both the context and the sequence spec; "
          "an element has one component of a name",
          name));
    }
    if (name.ends_with(kStepLengths)) {
      throw Error(fmt::format(
          "ParseSequence: sequence feature '{}' ends in '{}', the suffix of "
          "a batch's step lengths",
          name, kStepLengths));
    }
  }
  MapOptions map;
  map.num_parallel_calls = options.num_parallel_calls;
  map.deterministic = options.deterministic;
  map.name =
      fmt::format("parse_sequence[{:016x}]",
                  Fingerprint(nlohmann::json{{"context", context.ToJson()},
                                             {"sequence", sequence.ToJson()}}
                                  .dump()));
  auto parser = std::make_shared<records::SequenceExampleParser>(
      std::move(context), std::move(sequence));
  return Map(std::move(input), ParseSequenceFn(std::move(parser), options),
             std::move(map));
}

std::shared_ptr<ParseInfo> MakeParseInfo(records::FeatureSpec spec,
                                         ParseOptions options) {
  auto info = std::make_shared<ParseInfo>();
  info->parser = std::make_shared<records::ExampleParser>(std::move(spec));
  info->options = std::move(options);
  info->buffers = std::make_shared<ParsedBuffers>(info->parser);
  return info;
}

DatasetPtr Parse(DatasetPtr input, records::FeatureSpec spec,
                 ParseOptions options) {
  MapOptions map;
  map.num_parallel_calls = options.num_parallel_calls;
  map.deterministic = options.deterministic;
  map.name = fmt::format("parse[{:016x}]", Fingerprint(spec.ToJson().dump()));
  std::shared_ptr<ParseInfo> info =
      MakeParseInfo(std::move(spec), std::move(options));
  return Map(std::move(input), ParseFn(info), std::move(map), info);
}

}  // namespace recflow::pipeline::stages
