// Batch, PaddedBatch, RaggedBatch, BucketBySequenceLength, GroupByWindow,
// Window, Rebatch and Unbatch.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "pipeline/stages.h"

namespace recflow::pipeline::stages {
namespace {

// Throws unless element `i` has the components of `first`, in order, with
// the same dtypes, none ragged.
void CheckSameComponents(const Element& first, const Element& e, size_t i) {
  if (e.components.size() != first.components.size()) {
    throw Error(fmt::format(
        "Cannot batch elements with different components: the first element "
        "has {}, element {} has {}",
        first.components.size(), i, e.components.size()));
  }
  for (size_t c = 0; c < e.components.size(); ++c) {
    const auto& a = first.components[c];
    const auto& b = e.components[c];
    if (a.name != b.name) {
      throw Error(fmt::format(
          "Cannot batch elements with different components: component {} is "
          "'{}' in the first element and '{}' in element {}",
          c, a.name, b.name, i));
    }
    if (a.tensor.dtype() != b.tensor.dtype()) {
      throw Error(fmt::format(
          "Cannot batch tensors of different dtypes in component '{}'. First "
          "element had dtype {} and element {} had dtype {}.",
          a.name, DTypeName(a.tensor.dtype()), i, DTypeName(b.tensor.dtype())));
    }
    if (b.tensor.ragged()) {
      throw Error(fmt::format(
          "Cannot batch the ragged component '{}'; use PaddedBatch, or Parse "
          "after Batch",
          a.name));
    }
  }
}

std::shared_ptr<const BatchOrigins> Origins(
    const std::vector<Element>& elements) {
  std::vector<const Origin*> origins;
  origins.reserve(elements.size());
  for (const auto& e : elements) origins.push_back(&e.origin);
  return BatchOrigins::Of(origins);
}

// Rows [a, b) of tensor t (dense; rows of its shape without the first
// dimension, or of its whole shape, one row, for Concat).
struct RowRange {
  const Tensor* t;
  int64_t a, b;
};

// The rows `ranges` name, one after another, in one tensor of `dtype` and
// rows of shape `rest` (each range's tensor has them, checked by the
// caller): numbers copied, bytes values gathered.
Tensor ConcatRows(const std::vector<RowRange>& ranges, DType dtype,
                  const Shape& rest) {
  int64_t rows = 0;
  for (const auto& r : ranges) rows += r.b - r.a;
  const Shape shape = rest.Prepend(rows);
  const int64_t per_row = rest.num_elements();
  if (dtype == DType::kBytes) {
    std::vector<std::string_view> values;
    values.reserve(static_cast<size_t>(shape.num_elements()));
    for (const auto& r : ranges) {
      for (int64_t k = r.a * per_row; k < r.b * per_row; ++k) {
        values.push_back(r.t->bytes(k));
      }
    }
    return Tensor::FromStrings(values, shape);
  }
  Tensor out = Tensor::Allocate(dtype, shape);
  const size_t row_bytes = DTypeSize(dtype) * static_cast<size_t>(per_row);
  char* dst = const_cast<char*>(out.raw_data());
  for (const auto& r : ranges) {
    const size_t n = row_bytes * static_cast<size_t>(r.b - r.a);
    if (n == 0) continue;  // an empty range may have no storage
    std::memcpy(dst, r.t->raw_data() + row_bytes * static_cast<size_t>(r.a), n);
    dst += n;
  }
  return out;
}

// Component c of every element, one after another: each element's tensor
// one row of shape `rest` (whole: Batch), or its first dimension's rows of
// that shape (RaggedBatch's values).
Tensor Concat(const std::vector<Element>& elements, size_t c, const Shape& rest,
              bool whole) {
  std::vector<RowRange> ranges;
  ranges.reserve(elements.size());
  for (const auto& e : elements) {
    const Tensor& t = e.components[c].tensor;
    ranges.push_back({&t, 0, whole ? 1 : t.shape()[0]});
  }
  return ConcatRows(ranges, elements[0].components[c].tensor.dtype(), rest);
}

// Batch's (ragged: RaggedBatch's) stacking of a batch's elements.
Element Stack(std::vector<Element>& elements, bool ragged = false) {
  const Element& first = elements[0];
  // From 0: the first element's own components must not be ragged either.
  for (size_t i = 0; i < elements.size(); ++i) {
    CheckSameComponents(first, elements[i], i);
  }
  Element out;
  const auto n = static_cast<int64_t>(elements.size());
  for (size_t c = 0; c < first.components.size(); ++c) {
    const std::string& name = first.components[c].name;
    const Tensor& t0 = first.components[c].tensor;
    if (ragged && t0.shape().rank() > 0) {
      // [n, (rows), rest...]: the rest of each shape must agree.
      const Shape rest = t0.shape().DropFirst();
      auto lengths = Tensor::Allocate(DType::kInt64, Shape{n});
      int64_t* row = const_cast<int64_t*>(lengths.values<int64_t>().data());
      for (size_t i = 0; i < elements.size(); ++i) {
        const Shape& s = elements[i].components[c].tensor.shape();
        if (s.rank() == 0 || !(s.DropFirst() == rest)) {
          throw Error(fmt::format(
              "RaggedBatch: component '{}' has shape {} in element {}, {} in "
              "the first; only the first dimension may differ",
              name, s.ToString(), i, t0.shape().ToString()));
        }
        row[i] = s[0];
      }
      out.components.push_back(
          {name, Tensor::Ragged(Concat(elements, c, rest, /*whole=*/false),
                                lengths)});
      continue;
    }
    for (size_t i = 1; i < elements.size(); ++i) {
      const Tensor& t = elements[i].components[c].tensor;
      if (!(t.shape() == t0.shape())) {
        throw Error(fmt::format(
            "Cannot batch tensors with different shapes in component '{}'. "
            "First element had shape {} and element {} had shape {}.",
            name, t0.shape().ToString(), i, t.shape().ToString()));
      }
    }
    out.components.push_back(
        {name, Concat(elements, c, t0.shape(), /*whole=*/true)});
  }
  out.batch_origins = Origins(elements);
  return out;
}

// Copies `src` (shape s) into the corner of `dst` (shape p >= s, row-major),
// `size` bytes per value.
void CopyPadded(const char* src, const Shape& s, char* dst, const Shape& p,
                int dim, size_t size) {
  if (dim == s.rank()) {
    std::memcpy(dst, src, size);
    return;
  }
  int64_t src_stride = 1, dst_stride = 1;
  for (int d = dim + 1; d < s.rank(); ++d) {
    src_stride *= s[d];
    dst_stride *= p[d];
  }
  if (dim == s.rank() - 1) {
    std::memcpy(dst, src, static_cast<size_t>(s[dim]) * size);
    return;
  }
  for (int64_t i = 0; i < s[dim]; ++i) {
    CopyPadded(src + i * src_stride * static_cast<int64_t>(size), s,
               dst + i * dst_stride * static_cast<int64_t>(size), p, dim + 1,
               size);
  }
}

// Flat index in shape `p` of flat index `k` of shape `s` (row-major).
int64_t PaddedIndex(int64_t k, const Shape& s, const Shape& p) {
  int64_t out = 0, mul = 1;
  for (int d = s.rank() - 1; d >= 0; --d) {
    const int64_t i = k % s[d];
    k /= s[d];
    out += i * mul;
    mul *= p[d];
  }
  return out;
}

// Whether `v` is a value of `dtype` (an integer in range for the integer
// types, finite or not within float32's range): a padding value must be,
// as tf.data wants it a tensor of the component's dtype.
bool IsValueOf(DType dtype, double v) {
  const auto integer_in = [v](double lo, double hi) {
    return v == std::trunc(v) && v >= lo && v <= hi;
  };
  switch (dtype) {
    case DType::kFloat32:
      return !std::isfinite(v) ||
             std::abs(v) <= std::numeric_limits<float>::max();
    case DType::kFloat64:
      return true;
    case DType::kInt32:
      return integer_in(std::numeric_limits<int32_t>::min(),
                        std::numeric_limits<int32_t>::max());
    case DType::kInt64:  // 2^63 itself is a double, and not an int64
      return integer_in(-0x1p63, 0x1p63) && v != 0x1p63;
    case DType::kUInt8:
      return integer_in(0, 255);
    case DType::kBytes:
      return v == 0;
  }
  return false;
}

template <typename T>
void Fill(char* data, int64_t n, double v) {
  T* p = reinterpret_cast<T*>(data);
  std::fill(p, p + n, static_cast<T>(v));
}

// A name the elements lack is a typo that would otherwise pad that
// component to the longest, silently (tf.data refuses a padded_shapes
// structure that differs from the element's).
template <typename Value>
void CheckNamesExist(const Element& e,
                     const std::vector<std::pair<std::string, Value>>& options,
                     std::string_view option) {
  for (const auto& [key, unused] : options) {
    bool found = false;
    for (const auto& c : e.components) found = found || c.name == key;
    if (found) continue;
    std::vector<std::string_view> names;
    for (const auto& c : e.components) names.push_back(c.name);
    throw Error(fmt::format(
        "PaddedBatch: {} names '{}', which the elements lack (they have: "
        "{})",
        option, key, fmt::join(names, ", ")));
  }
}

Element PadBatch(std::vector<Element>& elements,
                 const PaddedBatchOptions& options) {
  const Element& first = elements[0];
  for (size_t i = 1; i < elements.size(); ++i) {
    if (elements[i].components.size() != first.components.size()) {
      CheckSameComponents(first, elements[i], i);
    }
    for (size_t c = 0; c < first.components.size(); ++c) {
      const auto& a = first.components[c];
      const auto& b = elements[i].components[c];
      if (a.name != b.name || a.tensor.dtype() != b.tensor.dtype() ||
          a.tensor.shape().rank() != b.tensor.shape().rank()) {
        throw Error(fmt::format(
            "PaddedBatch: component {} ('{}') of element {} differs from "
            "the first element's in name, dtype or rank",
            c, b.name, i));
      }
    }
  }
  CheckNamesExist(first, options.padded_shapes, "padded_shapes");
  CheckNamesExist(first, options.padding_values, "padding_values");
  Element out;
  const auto n = static_cast<int64_t>(elements.size());
  for (size_t c = 0; c < first.components.size(); ++c) {
    const std::string& name = first.components[c].name;
    const Tensor& t0 = first.components[c].tensor;
    Shape padded = t0.shape();
    for (const auto& e : elements) {
      const Tensor& t = e.components[c].tensor;
      if (t.ragged()) {
        throw Error(fmt::format("PaddedBatch: component '{}' is ragged", name));
      }
      for (int d = 0; d < t.shape().rank(); ++d) {
        padded.set_dim(d, std::max(padded[d], t.shape()[d]));
      }
    }
    for (const auto& [key, dims] : options.padded_shapes) {
      if (key != name) continue;
      if (static_cast<int>(dims.size()) != padded.rank()) {
        throw Error(fmt::format(
            "PaddedBatch: padded shape [{}] for '{}' has rank {}, the "
            "component has rank {}",
            fmt::join(dims, ", "), name, dims.size(), padded.rank()));
      }
      for (int d = 0; d < padded.rank(); ++d) {
        if (dims[d] < 0) continue;
        if (dims[d] < padded[d]) {
          throw Error(fmt::format(
              "PaddedBatch: component '{}' has size {} in dimension {}, "
              "more than its padded size {}",
              name, padded[d], d, dims[d]));
        }
        padded.set_dim(d, dims[d]);
      }
    }
    double pad_value = 0;
    for (const auto& [key, v] : options.padding_values) {
      if (key == name) pad_value = v;
    }
    if (!IsValueOf(t0.dtype(), pad_value)) {
      throw Error(fmt::format(
          "PaddedBatch: padding value {} for '{}' is not a value of its "
          "dtype {}{}",
          pad_value, name, DTypeName(t0.dtype()),
          t0.dtype() == DType::kBytes ? " (bytes pad with empty strings)"
                                      : ""));
    }
    const Shape shape = padded.Prepend(n);
    const int64_t per = padded.num_elements();
    Tensor result;
    if (t0.dtype() == DType::kBytes) {
      std::vector<std::string> values(static_cast<size_t>(n * per));
      for (int64_t i = 0; i < n; ++i) {
        const Tensor& t = elements[i].components[c].tensor;
        for (int64_t k = 0; k < t.num_elements(); ++k) {
          values[i * per + PaddedIndex(k, t.shape(), padded)] = t.bytes(k);
        }
      }
      result = Tensor::FromStrings(values, shape);
    } else {
      result = Tensor::Allocate(t0.dtype(), shape);
      char* data = const_cast<char*>(result.raw_data());
      const int64_t total = shape.num_elements();
      switch (t0.dtype()) {
        case DType::kFloat32:
          Fill<float>(data, total, pad_value);
          break;
        case DType::kFloat64:
          Fill<double>(data, total, pad_value);
          break;
        case DType::kInt32:
          Fill<int32_t>(data, total, pad_value);
          break;
        case DType::kInt64:
          Fill<int64_t>(data, total, pad_value);
          break;
        case DType::kUInt8:
          Fill<uint8_t>(data, total, pad_value);
          break;
        case DType::kBytes:
          break;
      }
      const size_t size = DTypeSize(t0.dtype());
      for (int64_t i = 0; i < n; ++i) {
        const Tensor& t = elements[i].components[c].tensor;
        if (t.num_elements() == 0) continue;
        CopyPadded(t.raw_data(), t.shape(),
                   data + i * per * static_cast<int64_t>(size), padded, 0,
                   size);
      }
    }
    out.components.push_back({name, std::move(result)});
  }
  out.batch_origins = Origins(elements);
  return out;
}

class BatchDataset final : public UnaryDataset {
 public:
  BatchDataset(DatasetPtr input, int64_t batch_size, bool drop_remainder,
               std::optional<PaddedBatchOptions> padded, bool ragged = false)
      : UnaryDataset(std::move(input)),
        batch_size_(batch_size),
        drop_remainder_(drop_remainder),
        padded_(std::move(padded)),
        ragged_(ragged) {}

  std::string Label() const override {
    if (!padded_) {
      return fmt::format("{}({}, drop_remainder={})",
                         ragged_ ? "RaggedBatch" : "Batch", batch_size_,
                         drop_remainder_);
    }
    std::vector<std::string> shapes;
    for (const auto& [name, dims] : padded_->padded_shapes) {
      shapes.push_back(fmt::format("{}:[{}]", name, fmt::join(dims, ",")));
    }
    return fmt::format("PaddedBatch({}, drop_remainder={}, shapes={{{}}})",
                       batch_size_, drop_remainder_, fmt::join(shapes, " "));
  }
  std::string StageName() const override {
    return padded_ ? "padded_batch" : ragged_ ? "ragged_batch" : "batch";
  }
  int64_t Cardinality() const override {
    const int64_t n = input_->Cardinality();
    if (n < 0) return n;
    return n / batch_size_ + (!drop_remainder_ && n % batch_size_ ? 1 : 0);
  }
  bool DescribeForFusion(FusableStage* out) const override {
    if (padded_ || ragged_) return false;
    out->kind = FusableStage::Kind::kBatch;
    out->input = input_;
    out->batch_size = batch_size_;
    out->drop_remainder = drop_remainder_;
    return true;
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const BatchDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      if (end_) return false;
      pending_.reserve(static_cast<size_t>(d_->batch_size_));
      while (static_cast<int64_t>(pending_.size()) < d_->batch_size_) {
        Element e;
        if (!in_->GetNext(&e)) {
          end_ = true;
          break;
        }
        pending_.push_back(std::move(e));
      }
      if (pending_.empty() ||
          (end_ && d_->drop_remainder_ &&
           static_cast<int64_t>(pending_.size()) < d_->batch_size_)) {
        pending_.clear();
        return false;
      }
      std::vector<Element> batch;
      batch.swap(pending_);
      *out = d_->padded_ ? PadBatch(batch, *d_->padded_)
                         : Stack(batch, d_->ragged_);
      return true;
    }
    // Elements collected for a batch that an error interrupted stay in
    // pending_ (and in the state), so the batch completes afterwards.
    void Save(StateWriter* w) override {
      w->BeginStage(d_->StageName());
      w->Bool(end_);
      w->U64(pending_.size());
      for (const auto& e : pending_) w->WriteElement(e);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage(d_->StageName());
      end_ = r->Bool();
      const uint64_t n = r->U64();
      if (n >= static_cast<uint64_t>(d_->batch_size_)) {
        r->Fail(fmt::format("{} pending elements for batches of {}", n,
                            d_->batch_size_));
      }
      pending_.clear();
      for (uint64_t i = 0; i < n; ++i) pending_.push_back(r->ReadElement());
      in_->Restore(r);
    }

   private:
    const BatchDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    std::vector<Element> pending_;
    bool end_ = false;
  };

  int64_t batch_size_;
  bool drop_remainder_;
  std::optional<PaddedBatchOptions> padded_;
  bool ragged_;
};

// Elements grouped by an int64 key: a group that reaches its window size is
// batched and delivered; when the input ends, the groups left are
// delivered part-full in key order (tf.data's group_by_window flushes its
// std::map's first group so), or dropped under drop_remainder.  Each group
// is in the iterator's state.  BucketBySequenceLength is one, keyed by
// bucket, as tf.data builds it on group_by_window.
class GroupDataset : public UnaryDataset {
 public:
  // fixed_keys > 0: the keys are 0 .. fixed_keys - 1 (buckets), and the
  // state lists every one's group; 0: any int64, the state lists the
  // groups begun.
  GroupDataset(DatasetPtr input, bool drop_remainder, size_t fixed_keys)
      : UnaryDataset(std::move(input)),
        drop_remainder_(drop_remainder),
        fixed_keys_(fixed_keys) {}
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 protected:
  // The key of element `at` of the input (an Error naming it if it has
  // none).
  virtual int64_t KeyOf(const Element& e, int64_t at) const = 0;
  // The batch size of group `key`, > 0 (else an Error naming the key).
  virtual int64_t WindowSizeOf(int64_t key) const = 0;
  // A group's elements as one batch.
  virtual Element BatchOf(int64_t key, std::vector<Element>& group) const = 0;

 private:
  struct Group {
    int64_t window_size = 0;
    std::vector<Element> elements;
  };

  class It final : public IteratorBase {
   public:
    It(const GroupDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      while (!end_) {
        Element e;
        if (!in_->GetNext(&e)) {
          end_ = true;
          break;
        }
        const int64_t key = d_->KeyOf(e, read_++);
        auto found = groups_.find(key);
        if (found == groups_.end()) {
          Group g;
          g.window_size = d_->WindowSizeOf(key);
          found = groups_.emplace(key, std::move(g)).first;
        }
        Group& g = found->second;
        g.elements.push_back(std::move(e));
        if (static_cast<int64_t>(g.elements.size()) == g.window_size) {
          return Deliver(found, out);
        }
      }
      // The input has ended: the groups left, in key order.
      while (!groups_.empty()) {
        if (d_->drop_remainder_) {
          groups_.clear();
          break;
        }
        return Deliver(groups_.begin(), out);
      }
      return false;
    }
    void Save(StateWriter* w) override {
      w->BeginStage(d_->StageName());
      w->Bool(end_);
      w->I64(read_);
      auto write = [w](const std::vector<Element>& elements) {
        w->U64(elements.size());
        for (const auto& e : elements) w->WriteElement(e);
      };
      if (d_->fixed_keys_ > 0) {
        for (size_t k = 0; k < d_->fixed_keys_; ++k) {
          auto found = groups_.find(static_cast<int64_t>(k));
          write(found == groups_.end() ? std::vector<Element>{}
                                       : found->second.elements);
        }
      } else {
        w->U64(groups_.size());
        for (const auto& [key, g] : groups_) {
          w->I64(key);
          write(g.elements);
        }
      }
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage(d_->StageName());
      end_ = r->Bool();
      read_ = r->I64();
      if (read_ < 0) r->Fail(fmt::format("{} elements read", read_));
      groups_.clear();
      auto read = [this, r](int64_t key) {
        const uint64_t n = r->U64();
        if (n == 0) return;
        Group g;
        g.window_size = d_->WindowSizeOf(key);
        if (n >= static_cast<uint64_t>(g.window_size)) {
          r->Fail(fmt::format("{} elements in {}, whose batches are {}", n,
                              d_->GroupName(key), g.window_size));
        }
        for (uint64_t i = 0; i < n; ++i) {
          g.elements.push_back(r->ReadElement());
        }
        groups_.emplace(key, std::move(g));
      };
      if (d_->fixed_keys_ > 0) {
        for (size_t k = 0; k < d_->fixed_keys_; ++k) {
          read(static_cast<int64_t>(k));
        }
      } else {
        const uint64_t n = r->U64();
        for (uint64_t i = 0; i < n; ++i) {
          const int64_t key = r->I64();
          if (!groups_.empty() && key <= groups_.rbegin()->first) {
            r->Fail(fmt::format("group keys out of order: {} after {}", key,
                                groups_.rbegin()->first));
          }
          read(key);
        }
      }
      in_->Restore(r);
    }

   private:
    bool Deliver(std::map<int64_t, Group>::iterator g, Element* out) {
      std::vector<Element> elements = std::move(g->second.elements);
      const int64_t key = g->first;
      groups_.erase(g);
      *out = d_->BatchOf(key, elements);
      return true;
    }

    const GroupDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    std::map<int64_t, Group> groups_;
    int64_t read_ = 0;  // elements read (for errors)
    bool end_ = false;
  };

  // "bucket 2", "the group of key 7": for errors.
  virtual std::string GroupName(int64_t key) const = 0;

  bool drop_remainder_;
  size_t fixed_keys_;
};

class BucketDataset final : public GroupDataset {
 public:
  BucketDataset(DatasetPtr input, Dataset::LengthFn length,
                BucketOptions options, std::string name)
      : GroupDataset(std::move(input), options.drop_remainder,
                     options.bucket_batch_sizes.size()),
        length_(std::move(length)),
        o_(std::move(options)),
        name_(std::move(name)) {
    // Each bucket's padding: pad_to_bucket_boundary turns the -1s of
    // padded_shapes into the bucket's boundary - 1 (the last bucket, which
    // has no boundary, is refused before it is batched).
    for (size_t b = 0; b < o_.bucket_batch_sizes.size(); ++b) {
      PaddedBatchOptions p;
      p.padded_shapes = o_.padded_shapes;
      p.padding_values = o_.padding_values;
      if (o_.pad_to_bucket_boundary && b < o_.bucket_boundaries.size()) {
        for (auto& [key, dims] : p.padded_shapes) {
          for (int64_t& d : dims) {
            if (d < 0) d = o_.bucket_boundaries[b] - 1;
          }
        }
      }
      padding_.push_back(std::move(p));
    }
  }
  std::string Label() const override {
    std::vector<std::string> shapes;
    for (const auto& [key, dims] : o_.padded_shapes) {
      shapes.push_back(fmt::format("{}:[{}]", key, fmt::join(dims, ",")));
    }
    std::vector<std::string> values;
    for (const auto& [key, v] : o_.padding_values) {
      values.push_back(fmt::format("{}:{}", key, v));
    }
    return fmt::format(
        "BucketBySequenceLength({}, boundaries=[{}], batch_sizes=[{}], "
        "shapes={{{}}}, values={{{}}}, pad_to_bucket_boundary={}, "
        "no_padding={}, drop_remainder={})",
        name_, fmt::join(o_.bucket_boundaries, ","),
        fmt::join(o_.bucket_batch_sizes, ","), fmt::join(shapes, " "),
        fmt::join(values, " "), o_.pad_to_bucket_boundary, o_.no_padding,
        o_.drop_remainder);
  }
  std::string StageName() const override { return "bucket_by_sequence_length"; }

 private:
  // The bucket of element `at` of the input.
  int64_t KeyOf(const Element& e, int64_t at) const override {
    const int64_t length = length_(e);
    if (length < 0) {
      throw Error(fmt::format(
          "BucketBySequenceLength: element {} has length {} ({}); lengths "
          "must be >= 0",
          at, length, name_));
    }
    const auto& bounds = o_.bucket_boundaries;
    const auto b =
        std::upper_bound(bounds.begin(), bounds.end(), length) - bounds.begin();
    if (o_.pad_to_bucket_boundary &&
        b == static_cast<ptrdiff_t>(bounds.size())) {
      throw Error(fmt::format(
          "BucketBySequenceLength: element {} has length {} ({}), not below "
          "the last boundary {}, which pad_to_bucket_boundary needs",
          at, length, name_, bounds.empty() ? 0 : bounds.back()));
    }
    return b;
  }
  int64_t WindowSizeOf(int64_t b) const override {
    return o_.bucket_batch_sizes[static_cast<size_t>(b)];
  }
  Element BatchOf(int64_t b, std::vector<Element>& elements) const override {
    try {
      return o_.no_padding
                 ? Stack(elements)
                 : PadBatch(elements, padding_[static_cast<size_t>(b)]);
    } catch (const Error& e) {
      throw Error(
          fmt::format("BucketBySequenceLength: bucket {}: {}", b, e.what()));
    }
  }
  std::string GroupName(int64_t b) const override {
    return fmt::format("bucket {}", b);
  }

  Dataset::LengthFn length_;
  BucketOptions o_;
  std::string name_;
  std::vector<PaddedBatchOptions> padding_;
};

// tf.data's group_by_window, each window batched (see
// Dataset::GroupByWindow).
class GroupByWindowDataset final : public GroupDataset {
 public:
  // window_size > 0: every group's; 0: window_size_func's for each key.
  GroupByWindowDataset(DatasetPtr input, Dataset::KeyFn key,
                       int64_t window_size,
                       Dataset::WindowSizeFn window_size_func, GroupOptions o)
      : GroupDataset(std::move(input), o.drop_remainder, 0),
        key_(std::move(key)),
        window_size_(window_size),
        window_size_func_(std::move(window_size_func)),
        o_(std::move(o)) {}
  std::string Label() const override {
    return fmt::format(
        "GroupByWindow({}, window_size={}, drop_remainder={})", o_.key_name,
        window_size_ > 0 ? std::to_string(window_size_) : o_.window_size_name,
        o_.drop_remainder);
  }
  std::string StageName() const override { return "group_by_window"; }

 private:
  int64_t KeyOf(const Element& e, int64_t) const override { return key_(e); }
  int64_t WindowSizeOf(int64_t key) const override {
    if (window_size_ > 0) return window_size_;
    const int64_t n = window_size_func_(key);
    if (n <= 0) {
      throw Error(fmt::format(
          "GroupByWindow: the window size of key {} ({}) is {}; it must be "
          "positive",
          key, o_.window_size_name, n));
    }
    return n;
  }
  Element BatchOf(int64_t key, std::vector<Element>& elements) const override {
    try {
      return Stack(elements);
    } catch (const Error& e) {
      throw Error(
          fmt::format("GroupByWindow: {}: {}", GroupName(key), e.what()));
    }
  }
  std::string GroupName(int64_t key) const override {
    return fmt::format("the group of key {}", key);
  }

  Dataset::KeyFn key_;
  int64_t window_size_;
  Dataset::WindowSizeFn window_size_func_;
  GroupOptions o_;
};

// tf.data's window (see Dataset::Window), each window stacked as Batch does.
class WindowDataset final : public UnaryDataset {
 public:
  WindowDataset(DatasetPtr input, int64_t size, WindowOptions o)
      : UnaryDataset(std::move(input)),
        size_(size),
        shift_(o.shift),
        stride_(o.stride),
        drop_remainder_(o.drop_remainder),
        reach_((size - 1) * o.stride + 1) {}
  std::string Label() const override {
    return fmt::format("Window({}, shift={}, stride={}, drop_remainder={})",
                       size_, shift_, stride_, drop_remainder_);
  }
  std::string StageName() const override { return "window"; }
  // tf.data's count: with drop_remainder, the shifts that leave a full
  // reach; without, one window per shift that starts inside the input.
  int64_t Cardinality() const override {
    const int64_t n = input_->Cardinality();
    if (n < 0) return n;
    if (drop_remainder_) return n < reach_ ? 0 : (n - reach_) / shift_ + 1;
    return n / shift_ + (n % shift_ ? 1 : 0);
  }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    It(const WindowDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      const auto reach = static_cast<size_t>(d_->reach_);
      // A shift past the buffer drops the input elements between windows;
      // each counts as dropped before it is read, so an error in one is
      // thrown once and the stream goes on after it.
      while (to_skip_ > 0 && !end_) {
        --to_skip_;
        Element e;
        if (!in_->GetNext(&e)) end_ = true;
      }
      while (!end_ && buffer_.size() < reach) {
        Element e;
        if (!in_->GetNext(&e)) {
          end_ = true;
          break;
        }
        buffer_.push_back(std::move(e));
      }
      if (buffer_.empty() || (d_->drop_remainder_ && buffer_.size() < reach)) {
        buffer_.clear();
        return false;
      }
      std::vector<Element> window;
      const auto stride = static_cast<size_t>(d_->stride_);
      for (size_t i = 0; i < buffer_.size(); i += stride) {
        window.push_back(buffer_[i]);
      }
      // Shifted before stacking: a window that cannot be stacked is an
      // Error, and the next one follows it.
      const auto shift = static_cast<size_t>(d_->shift_);
      if (shift >= buffer_.size()) {
        to_skip_ = static_cast<int64_t>(shift - buffer_.size());
        buffer_.clear();
      } else {
        buffer_.erase(buffer_.begin(),
                      buffer_.begin() + static_cast<ptrdiff_t>(shift));
      }
      *out = Stack(window);
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("window");
      w->Bool(end_);
      w->I64(to_skip_);
      w->U64(buffer_.size());
      for (const auto& e : buffer_) w->WriteElement(e);
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("window");
      end_ = r->Bool();
      to_skip_ = r->I64();
      if (to_skip_ < 0 || to_skip_ >= d_->shift_) {
        r->Fail(fmt::format("{} elements to skip between windows {} apart",
                            to_skip_, d_->shift_));
      }
      const uint64_t n = r->U64();
      if (n >= static_cast<uint64_t>(d_->reach_)) {
        r->Fail(fmt::format("{} elements kept for windows that reach {}", n,
                            d_->reach_));
      }
      buffer_.clear();
      for (uint64_t i = 0; i < n; ++i) buffer_.push_back(r->ReadElement());
      in_->Restore(r);
    }

   private:
    const WindowDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    std::deque<Element> buffer_;  // the next window's reach, read so far
    int64_t to_skip_ = 0;
    bool end_ = false;
  };

  int64_t size_, shift_, stride_;
  bool drop_remainder_;
  int64_t reach_;  // input elements one window spans
};

// tf.data's rebatch (see Dataset::Rebatch).
class RebatchDataset final : public UnaryDataset {
 public:
  RebatchDataset(DatasetPtr input, std::vector<int64_t> sizes,
                 bool drop_remainder)
      : UnaryDataset(std::move(input)),
        sizes_(std::move(sizes)),
        drop_remainder_(drop_remainder) {}
  std::string Label() const override {
    return fmt::format("Rebatch([{}], drop_remainder={})",
                       fmt::join(sizes_, ","), drop_remainder_);
  }
  std::string StageName() const override { return "rebatch"; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(this, input_->MakeIterator(ctx, salt));
  }

 private:
  // Rows of batch `b` of the input (`at`), which every component must
  // have.
  static int64_t RowsOf(const Element& b, int64_t at) {
    int64_t rows = -1;
    for (const auto& c : b.components) {
      if (c.tensor.shape().rank() == 0 && !c.tensor.ragged()) {
        throw Error(fmt::format(
            "Rebatch: component '{}' of input element {} is a scalar; "
            "Rebatch takes batches",
            c.name, at));
      }
      const int64_t n = c.tensor.num_rows();
      if (rows >= 0 && n != rows) {
        throw Error(fmt::format(
            "Rebatch: input element {} has {} rows in component '{}', {} in "
            "'{}'",
            at, n, c.name, rows, b.components[0].name));
      }
      rows = n;
    }
    return std::max<int64_t>(rows, 0);
  }

  // Rows [a, b) of an input batch.
  struct Piece {
    Element batch;
    int64_t a, b;
  };

  // The pieces as one batch: the input batch itself when one piece is all
  // of it.
  static Element Join(const std::vector<Piece>& pieces) {
    const Element& first = pieces[0].batch;
    if (pieces.size() == 1 && pieces[0].a == 0 &&
        pieces[0].b == RowsOf(first, 0)) {
      return first;
    }
    Element out;
    for (size_t c = 0; c < first.components.size(); ++c) {
      const auto& c0 = first.components[c];
      const Tensor& t0 = c0.tensor;
      // The ranges of the component's rows, or of a ragged one's row
      // lengths and values (kept alive in `values`).
      std::vector<RowRange> rows, lengths;
      std::vector<Tensor> values;
      values.reserve(pieces.size());
      for (const Piece& p : pieces) {
        const auto& pc = p.batch.components;
        const Tensor& t = pc.size() > c ? pc[c].tensor : t0;
        if (pc.size() != first.components.size() || pc[c].name != c0.name ||
            t.dtype() != t0.dtype() || t.ragged() != t0.ragged() ||
            !(t.shape().DropFirst() == t0.shape().DropFirst())) {
          throw Error(fmt::format(
              "Rebatch: the batches joined differ in component {} ('{}' {}{} "
              "in the first): their components must have one name, dtype "
              "and row shape",
              c, c0.name, DTypeName(t0.dtype()), t0.shape().ToString()));
        }
        if (!t.ragged()) {
          rows.push_back({&t, p.a, p.b});
          continue;
        }
        const auto len = t.row_lengths().values<int64_t>();
        int64_t start = 0, count = 0;
        for (int64_t i = 0; i < p.b; ++i) (i < p.a ? start : count) += len[i];
        values.push_back(t.FlatValues());
        rows.push_back({&values.back(), start, start + count});
        lengths.push_back({&t.row_lengths(), p.a, p.b});
      }
      const Shape rest =
          t0.ragged() ? values[0].shape().DropFirst() : t0.shape().DropFirst();
      Tensor joined = ConcatRows(rows, t0.dtype(), rest);
      if (t0.ragged()) {
        joined = Tensor::Ragged(std::move(joined),
                                ConcatRows(lengths, DType::kInt64, Shape{}));
      }
      out.components.push_back({c0.name, std::move(joined)});
    }
    // Each row's origin, where the batches know them.
    bool known = false;
    for (const Piece& p : pieces) known = known || p.batch.batch_origins;
    if (known) {
      std::vector<Origin> origins;
      for (const Piece& p : pieces) {
        for (int64_t i = p.a; i < p.b; ++i) {
          origins.push_back(p.batch.OriginOf(i).value_or(Origin{}));
        }
      }
      std::vector<const Origin*> ptrs;
      ptrs.reserve(origins.size());
      for (const auto& o : origins) ptrs.push_back(&o);
      out.batch_origins = BatchOrigins::Of(ptrs);
    }
    return out;
  }

  class It final : public IteratorBase {
   public:
    It(const RebatchDataset* d, std::unique_ptr<IteratorBase> in)
        : d_(d), in_(std::move(in)) {}
    // The rows gathered for a batch that an input error interrupted stay
    // in pieces_ (and in the state), so the batch completes afterwards.
    bool GetNext(Element* out) override {
      const int64_t want = d_->sizes_[next_size_];
      while (gathered_ < want) {
        if (offset_ == rows_) {
          if (end_) break;
          Element b;
          if (!in_->GetNext(&b)) {
            end_ = true;
            break;
          }
          const int64_t rows = RowsOf(b, read_++);
          cur_ = std::move(b);
          rows_ = rows;
          offset_ = 0;
          continue;
        }
        const int64_t take = std::min(want - gathered_, rows_ - offset_);
        pieces_.push_back({cur_, offset_, offset_ + take});
        offset_ += take;
        gathered_ += take;
      }
      if (gathered_ == 0 || (gathered_ < want && d_->drop_remainder_)) {
        pieces_.clear();
        gathered_ = 0;
        return false;
      }
      std::vector<Piece> pieces;
      pieces.swap(pieces_);
      gathered_ = 0;
      next_size_ = (next_size_ + 1) % d_->sizes_.size();
      if (offset_ == rows_) cur_ = Element{};  // let the batch go
      *out = Join(pieces);
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("rebatch");
      w->Bool(end_);
      w->U64(next_size_);
      w->I64(read_);
      w->U64(pieces_.size());
      for (const Piece& p : pieces_) {
        w->WriteElement(p.batch);
        w->I64(p.a);
        w->I64(p.b);
      }
      const bool rest = offset_ < rows_;
      w->Bool(rest);
      if (rest) {
        w->WriteElement(cur_);
        w->I64(offset_);
      }
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("rebatch");
      end_ = r->Bool();
      next_size_ = r->U64();
      if (next_size_ >= d_->sizes_.size()) {
        r->Fail(
            fmt::format("batch size {} of {}", next_size_, d_->sizes_.size()));
      }
      read_ = r->I64();
      if (read_ < 0) r->Fail(fmt::format("{} batches read", read_));
      const uint64_t n = r->U64();
      pieces_.clear();
      gathered_ = 0;
      for (uint64_t i = 0; i < n; ++i) {
        Piece p{r->ReadElement(), r->I64(), r->I64()};
        const int64_t rows = RowsOf(p.batch, read_);
        if (p.a < 0 || p.a >= p.b || p.b > rows) {
          r->Fail(
              fmt::format("rows [{}, {}) of a batch of {}", p.a, p.b, rows));
        }
        gathered_ += p.b - p.a;
        pieces_.push_back(std::move(p));
      }
      if (gathered_ >= d_->sizes_[next_size_]) {
        r->Fail(fmt::format("{} rows gathered for a batch of {}", gathered_,
                            d_->sizes_[next_size_]));
      }
      cur_ = Element{};
      offset_ = rows_ = 0;
      if (r->Bool()) {
        cur_ = r->ReadElement();
        rows_ = RowsOf(cur_, read_);
        offset_ = r->I64();
        if (offset_ < 0 || offset_ >= rows_) {
          r->Fail(fmt::format("row {} of a batch of {}", offset_, rows_));
        }
      }
      in_->Restore(r);
    }

   private:
    const RebatchDataset* d_;
    std::unique_ptr<IteratorBase> in_;
    std::vector<Piece> pieces_;  // rows gathered for the next batch
    int64_t gathered_ = 0;       // their count
    Element cur_;                // the input batch being split
    int64_t rows_ = 0, offset_ = 0;
    size_t next_size_ = 0;  // sizes_'s index of the next batch
    int64_t read_ = 0;      // input batches read (for errors)
    bool end_ = false;
  };

  std::vector<int64_t> sizes_;
  bool drop_remainder_;
};

class UnbatchDataset final : public UnaryDataset {
 public:
  explicit UnbatchDataset(DatasetPtr input) : UnaryDataset(std::move(input)) {}
  std::string Label() const override { return "Unbatch()"; }
  std::string StageName() const override { return "unbatch"; }
  std::unique_ptr<IteratorBase> MakeIteratorInternal(
      IteratorContext* ctx, uint64_t salt) const override {
    return std::make_unique<It>(input_->MakeIterator(ctx, salt));
  }

 private:
  class It final : public IteratorBase {
   public:
    explicit It(std::unique_ptr<IteratorBase> in) : in_(std::move(in)) {}
    bool GetNext(Element* out) override {
      while (next_row_ >= rows_) {
        if (!in_->GetNext(&batch_)) return false;
        next_row_ = 0;
        rows_ = -1;
        for (const auto& c : batch_.components) {
          const int64_t n = c.tensor.num_rows();
          if (c.tensor.shape().rank() == 0 && !c.tensor.ragged()) {
            throw Error(fmt::format(
                "Unbatch: component '{}' is a scalar; it has no rows", c.name));
          }
          if (rows_ >= 0 && n != rows_) {
            throw Error(
                fmt::format("Unbatch: component '{}' has {} rows, '{}' has {}",
                            c.name, n, batch_.components[0].name, rows_));
          }
          rows_ = n;
        }
        if (rows_ < 0) rows_ = 0;
      }
      out->components.clear();
      for (const auto& c : batch_.components) {
        out->components.push_back({c.name, c.tensor.Slice(next_row_)});
      }
      out->origin = batch_.OriginOf(next_row_).value_or(Origin{});
      out->batch_origins.reset();
      ++next_row_;
      return true;
    }
    void Save(StateWriter* w) override {
      w->BeginStage("unbatch");
      const bool has = next_row_ < rows_;
      w->Bool(has);
      if (has) {
        w->WriteElement(batch_);
        w->I64(next_row_);
      }
      in_->Save(w);
    }
    void Restore(StateReader* r) override {
      r->BeginStage("unbatch");
      if (r->Bool()) {
        batch_ = r->ReadElement();
        next_row_ = r->I64();
        rows_ = batch_.components.empty()
                    ? 0
                    : batch_.components[0].tensor.num_rows();
        if (next_row_ < 0 || next_row_ > rows_) {
          r->Fail(fmt::format("row {} of a batch of {}", next_row_, rows_));
        }
      } else {
        next_row_ = rows_ = 0;
      }
      in_->Restore(r);
    }

   private:
    std::unique_ptr<IteratorBase> in_;
    Element batch_;
    int64_t next_row_ = 0;
    int64_t rows_ = 0;
  };
};

}  // namespace

DatasetPtr Batch(DatasetPtr input, int64_t batch_size, bool drop_remainder) {
  return std::make_shared<BatchDataset>(std::move(input), batch_size,
                                        drop_remainder, std::nullopt);
}
DatasetPtr RaggedBatch(DatasetPtr input, int64_t batch_size,
                       bool drop_remainder) {
  return std::make_shared<BatchDataset>(std::move(input), batch_size,
                                        drop_remainder, std::nullopt,
                                        /*ragged=*/true);
}
DatasetPtr PaddedBatch(DatasetPtr input, int64_t batch_size,
                       PaddedBatchOptions options) {
  const bool drop = options.drop_remainder;
  return std::make_shared<BatchDataset>(std::move(input), batch_size, drop,
                                        std::move(options));
}
DatasetPtr BucketBySequenceLength(DatasetPtr input, Dataset::LengthFn length,
                                  BucketOptions options, std::string name) {
  return std::make_shared<BucketDataset>(std::move(input), std::move(length),
                                         std::move(options), std::move(name));
}
DatasetPtr Window(DatasetPtr input, int64_t size, WindowOptions options) {
  return std::make_shared<WindowDataset>(std::move(input), size, options);
}
DatasetPtr GroupByWindow(DatasetPtr input, Dataset::KeyFn key,
                         int64_t window_size,
                         Dataset::WindowSizeFn window_size_func,
                         GroupOptions options) {
  return std::make_shared<GroupByWindowDataset>(
      std::move(input), std::move(key), window_size,
      std::move(window_size_func), std::move(options));
}
DatasetPtr Rebatch(DatasetPtr input, std::vector<int64_t> batch_sizes,
                   bool drop_remainder) {
  return std::make_shared<RebatchDataset>(
      std::move(input), std::move(batch_sizes), drop_remainder);
}
DatasetPtr Unbatch(DatasetPtr input) {
  return std::make_shared<UnbatchDataset>(std::move(input));
}

}  // namespace recflow::pipeline::stages
