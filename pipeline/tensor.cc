#include "pipeline/tensor.h"

#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

namespace recflow::pipeline {

// --- Shape ---------------------------------------------------------------

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  if (dims.size() > kMaxRank) {
    throw Error(fmt::format("a tensor of rank {} exceeds the maximum rank {}",
                            dims.size(), kMaxRank));
  }
  rank_ = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), dims_.begin());
}

int64_t Shape::num_elements() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

Shape Shape::Prepend(int64_t d) const {
  if (rank_ == kMaxRank) {
    throw Error(fmt::format("cannot add a dimension to {}: maximum rank {}",
                            ToString(), kMaxRank));
  }
  Shape s;
  s.rank_ = rank_ + 1;
  s.dims_[0] = d;
  std::copy(dims_.begin(), dims_.begin() + rank_, s.dims_.begin() + 1);
  return s;
}

Shape Shape::DropFirst() const {
  Shape s;
  if (rank_ == 0) return s;
  s.rank_ = rank_ - 1;
  std::copy(dims_.begin() + 1, dims_.begin() + rank_, s.dims_.begin());
  return s;
}

bool Shape::operator==(const Shape& o) const {
  return rank_ == o.rank_ &&
         std::equal(dims_.begin(), dims_.begin() + rank_, o.dims_.begin());
}

std::string Shape::ToString() const {
  return fmt::format("[{}]", fmt::join(dims(), ", "));
}

std::string_view DeviceName(Device d) {
  return d == Device::kCuda ? "cuda" : "cpu";
}

// --- Tensor --------------------------------------------------------------

namespace {

// Bytes of storage a numeric tensor of `shape` needs.
size_t NumericBytes(DType dtype, const Shape& shape) {
  if (dtype == DType::kBytes) {
    throw Error(
        "Tensor::Allocate is for numeric dtypes; build bytes tensors "
        "with AdoptBytes or FromStrings");
  }
  return DTypeSize(dtype) * static_cast<size_t>(shape.num_elements());
}

}  // namespace

Tensor Tensor::Allocate(DType dtype, const Shape& shape) {
  const size_t bytes = NumericBytes(dtype, shape);
  auto storage = std::make_shared<records::AlignedVector<char>>(bytes);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.data_ = storage->data();
  t.storage_bytes_ = bytes;
  t.Own(std::move(storage));
  return t;
}

Tensor Tensor::Allocate(DType dtype, const Shape& shape,
                        const std::shared_ptr<Allocator>& allocator) {
  if (!allocator) return Allocate(dtype, shape);
  const size_t bytes = NumericBytes(dtype, shape);
  void* p = bytes == 0 ? nullptr : allocator->Allocate(bytes);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.device_ = allocator->device();
  t.data_ = static_cast<const char*>(p);
  t.storage_bytes_ = bytes;
  if (p != nullptr) {
    t.Own(std::shared_ptr<const void>(p, [allocator, bytes](const void* q) {
      allocator->Deallocate(const_cast<void*>(q), bytes);
    }));
  }
  return t;
}

double Tensor::NumberAt(int64_t k) const {
  CheckHost("NumberAt()");
  switch (dtype_) {
    case DType::kFloat32:
      return data<float>()[k];
    case DType::kFloat64:
      return data<double>()[k];
    case DType::kInt32:
      return data<int32_t>()[k];
    case DType::kInt64:
      return static_cast<double>(data<int64_t>()[k]);
    case DType::kUInt8:
      return data<uint8_t>()[k];
    case DType::kBytes:
      break;
  }
  throw Error("a bytes tensor holds no numbers");
}

Tensor Tensor::BytesAsUInt8() const {
  CheckType(DType::kBytes);
  CheckHost("BytesAsUInt8()");
  if (ragged()) {
    throw Error("a ragged bytes tensor has no fixed-length uint8 form");
  }
  const int64_t n = num_elements();
  // The values lie back to back (value k is [offsets_[k], offsets_[k +
  // 1]) of data_), so values of one length are a [shape..., each] view.
  // On a GPU the launching thread asks this of a batch's image column a
  // few times a step (0.8 us for 128 values through bytes(k) twice a
  // value before, on this project's VM).
  const size_t each = n == 0 ? 0 : bytes(0).size();
  if (const int64_t k = FirstBytesNotOfLength(each); k < n) {
    throw Error(fmt::format(
        "bytes value {} holds {} bytes where value 0 holds {}: the values "
        "are not of one length",
        k, bytes(k).size(), each));
  }
  std::vector<int64_t> dims(shape_.dims().begin(), shape_.dims().end());
  dims.push_back(static_cast<int64_t>(each));
  const Shape shape{std::span<const int64_t>(dims)};
  if (n == 0) return Allocate(DType::kUInt8, shape);
  return View(DType::kUInt8, shape, bytes(0).data(),
              std::make_shared<Tensor>(*this));
}

int64_t Tensor::FirstBytesNotOfLength(size_t each) const {
  CheckBytesOnHost("FirstBytesNotOfLength()");
  const int64_t n = num_elements();
  if (offsets_ == nullptr) return scalar_bytes_ == each ? n : 0;  // a scalar
  for (int64_t k = 0; k < n; ++k) {
    if (offsets_[k + 1] - offsets_[k] != each) return k;
  }
  return n;
}

Tensor Tensor::CopyInto(const std::shared_ptr<Allocator>& memory) const {
  CheckHost("CopyInto()");
  if (!memory || memory->kind() == MemoryKind::kDevice) {
    throw Error(
        fmt::format("Tensor::CopyInto: {} is not host memory",
                    memory ? memory->name() : std::string("a null allocator")));
  }
  const int64_t n = num_elements();
  if (ragged() || n == 0) return *this;
  if (dtype_ != DType::kBytes) {
    Tensor out = Allocate(dtype_, shape_, memory);
    if (out.data_ != nullptr) {
      std::memcpy(const_cast<char*>(out.data_), data_, byte_size());
    }
    return out;
  }
  // Value k ends where value k + 1 starts (offsets), so the values lie
  // back to back from the first.
  const std::string_view first = bytes(0);
  const size_t each = first.size();
  if (FirstBytesNotOfLength(each) < n || each == 0) return *this;
  // The values in one block of `memory`, the offsets beside them.
  struct Storage {
    std::shared_ptr<const void> block;
    records::AlignedVector<uint64_t> offsets;
  };
  const size_t total = each * static_cast<size_t>(n);
  auto storage = std::make_shared<Storage>();
  storage->offsets.resize(static_cast<size_t>(n) + 1);
  for (int64_t k = 0; k <= n; ++k) {
    storage->offsets[static_cast<size_t>(k)] = static_cast<uint64_t>(k) * each;
  }
  char* block = static_cast<char*>(memory->Allocate(total));
  storage->block =
      std::shared_ptr<const void>(block, [memory, total](const void* q) {
        memory->Deallocate(const_cast<void*>(q), total);
      });
  std::memcpy(block, first.data(), total);
  Tensor t;
  t.dtype_ = DType::kBytes;
  t.shape_ = shape_;
  t.data_ = block;
  // A scalar keeps the scalar form; more values index by offsets.
  if (offsets_ == nullptr) {
    t.scalar_bytes_ = each;
  } else {
    t.offsets_ = storage->offsets.data();
  }
  t.storage_bytes_ = total + storage->offsets.capacity() * 8;
  t.Own(std::move(storage));
  return t;
}

void Tensor::CheckHost(std::string_view what) const {
  if (device_ != Device::kCpu) {
    throw Error(fmt::format(
        "{}: this {}{} tensor is in {} memory; copy it to the host first "
        "(Backend::ToHost)",
        what, DTypeName(dtype_), shape_.ToString(), DeviceName(device_)));
  }
}

void Tensor::ThrowNoValue(std::string_view what) const {
  throw Error(fmt::format("{}: this {}{} tensor holds no value", what,
                          DTypeName(dtype_), shape_.ToString()));
}

template <typename T>
Tensor Tensor::Adopt(records::AlignedVector<T>&& values, const Shape& shape) {
  return Adopt(
      std::shared_ptr<const records::AlignedVector<T>>(
          std::make_shared<records::AlignedVector<T>>(std::move(values))),
      shape);
}

template <typename T>
Tensor Tensor::Adopt(std::shared_ptr<const records::AlignedVector<T>> storage,
                     const Shape& shape) {
  if (static_cast<int64_t>(storage->size()) != shape.num_elements()) {
    throw Error(fmt::format("{} values do not fill shape {}", storage->size(),
                            shape.ToString()));
  }
  Tensor t;
  t.dtype_ = DTypeOf<T>();
  t.shape_ = shape;
  t.data_ = reinterpret_cast<const char*>(storage->data());
  t.storage_bytes_ = storage->capacity() * sizeof(T);
  t.Own(std::move(storage));
  return t;
}

template <typename T>
Tensor Tensor::FromValues(std::span<const T> values, const Shape& shape) {
  if (static_cast<int64_t>(values.size()) != shape.num_elements()) {
    throw Error(fmt::format("{} values do not fill shape {}", values.size(),
                            shape.ToString()));
  }
  Tensor t = Allocate(DTypeOf<T>(), shape);
  if (!values.empty()) {
    std::memcpy(t.mutable_data<T>(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

#define RECFLOW_TENSOR_INSTANTIATE(T)                                          \
  template Tensor Tensor::Adopt<T>(records::AlignedVector<T>&&, const Shape&); \
  template Tensor Tensor::Adopt<T>(                                            \
      std::shared_ptr<const records::AlignedVector<T>>, const Shape&);         \
  template Tensor Tensor::FromValues<T>(std::span<const T>, const Shape&);
RECFLOW_TENSOR_INSTANTIATE(float)
RECFLOW_TENSOR_INSTANTIATE(double)
RECFLOW_TENSOR_INSTANTIATE(int32_t)
RECFLOW_TENSOR_INSTANTIATE(int64_t)
RECFLOW_TENSOR_INSTANTIATE(uint8_t)
#undef RECFLOW_TENSOR_INSTANTIATE

Tensor Tensor::View(DType dtype, const Shape& shape, const void* data,
                    std::shared_ptr<const void> owner, Device device) {
  if (dtype == DType::kBytes) {
    throw Error("Tensor::View is for numeric dtypes; use BytesView");
  }
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.data_ = static_cast<const char*>(data);
  t.owner_ = std::move(owner);
  t.device_ = device;
  return t;
}

Tensor Tensor::BytesView(const char* data, size_t n,
                         std::shared_ptr<const void> owner,
                         size_t storage_bytes) {
  Tensor t;
  t.storage_bytes_ = storage_bytes;
  t.dtype_ = DType::kBytes;
  t.data_ = data;
  t.scalar_bytes_ = n;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::BytesScalar(std::string_view value) {
  // One allocation for the bytes and the count (a shared std::string took
  // a second for any value past its 15 in-place bytes): a line, a CSV cell
  // or a fixed-length record is one of these per element.
  std::shared_ptr<char[]> storage =
      std::make_shared_for_overwrite<char[]>(std::max<size_t>(value.size(), 1));
  std::memcpy(storage.get(), value.data(), value.size());
  Tensor t;
  t.dtype_ = DType::kBytes;
  t.data_ = storage.get();
  t.scalar_bytes_ = value.size();
  t.storage_bytes_ = value.size();
  t.Own(std::move(storage));
  return t;
}

Tensor Tensor::AdoptBytes(std::string&& data,
                          records::AlignedVector<uint64_t>&& offsets,
                          const Shape& shape) {
  auto storage = std::make_shared<BytesBuffers>();
  storage->data = std::move(data);
  storage->offsets = std::move(offsets);
  return AdoptBytes(std::shared_ptr<const BytesBuffers>(std::move(storage)),
                    shape);
}

Tensor Tensor::AdoptBytes(std::shared_ptr<const BytesBuffers> storage,
                          const Shape& shape) {
  const int64_t n = shape.num_elements();
  const std::string& data = storage->data;
  const records::AlignedVector<uint64_t>& offsets = storage->offsets;
  if (static_cast<int64_t>(offsets.size()) != n + 1 ||
      offsets.back() > data.size()) {
    throw Error(
        fmt::format("{} offsets into {} bytes do not describe the {} "
                    "values of shape {}",
                    offsets.size(), data.size(), n, shape.ToString()));
  }
  Tensor t;
  t.dtype_ = DType::kBytes;
  t.shape_ = shape;
  // A non-null pointer even for empty data, so that valid() holds.
  t.data_ = data.data();
  t.offsets_ = offsets.data();
  t.storage_bytes_ = data.capacity() + offsets.capacity() * 8;
  t.Own(std::move(storage));
  return t;
}

namespace {

// `values` (strings or views) back to back, and their offsets.
template <typename S>
Tensor::BytesBuffers Stacked(std::span<const S> values) {
  Tensor::BytesBuffers out;
  out.offsets.reserve(values.size() + 1);
  size_t total = 0;
  for (const auto& v : values) total += v.size();
  out.data.reserve(total);
  out.offsets.push_back(0);
  for (const auto& v : values) {
    out.data.append(v);
    out.offsets.push_back(out.data.size());
  }
  return out;
}

}  // namespace

Tensor Tensor::FromStrings(std::span<const std::string> values,
                           const Shape& shape) {
  BytesBuffers b = Stacked(values);
  return AdoptBytes(std::move(b.data), std::move(b.offsets), shape);
}

Tensor Tensor::FromStrings(std::span<const std::string_view> values,
                           const Shape& shape) {
  BytesBuffers b = Stacked(values);
  return AdoptBytes(std::move(b.data), std::move(b.offsets), shape);
}

size_t Tensor::byte_size() const {
  if (dtype_ != DType::kBytes) {
    return DTypeSize(dtype_) * static_cast<size_t>(num_elements());
  }
  if (offsets_ == nullptr) return scalar_bytes_;
  return offsets_[num_elements()] - offsets_[0];
}

void Tensor::CheckBytesOnHost(std::string_view what) const {
  CheckType(DType::kBytes);
  CheckHost(what);
}

// The row lengths and their running sum, so that Slice(i) takes O(1), not
// O(i): a ragged dataset sliced row by row took quadratic time (80,000
// rows of FromTensorSlices: 0.93 s, 11.6 us a row).
struct Tensor::RaggedRows {
  Tensor lengths;
  records::AlignedVector<int64_t> starts;  // rows + 1
};

const Tensor& Tensor::row_lengths() const { return row_lengths_->lengths; }

Tensor Tensor::FlatValues() const {
  Tensor t = *this;
  t.row_lengths_.reset();
  return t;
}

int64_t Tensor::num_rows() const {
  if (ragged()) return row_lengths_->lengths.num_elements();
  return shape_.rank() == 0 ? 0 : shape_[0];
}

Tensor Tensor::Slice(int64_t i) const {
  if (ragged()) {
    const auto& starts = row_lengths_->starts;
    if (i < 0 || i + 1 >= static_cast<int64_t>(starts.size())) {
      throw Error(
          fmt::format("cannot take row {} of a ragged tensor of {} "
                      "rows",
                      i, starts.size() - 1));
    }
    const int64_t start = starts[i];
    Tensor t = *this;
    t.row_lengths_.reset();
    const Shape inner = shape_.DropFirst();
    const int64_t inner_n = inner.num_elements();
    t.shape_ = inner.Prepend(starts[i + 1] - start);
    if (dtype_ == DType::kBytes) {
      t.offsets_ = offsets_ + start * inner_n;
    } else {
      t.data_ = data_ + start * inner_n * DTypeSize(dtype_);
    }
    return t;
  }
  if (shape_.rank() == 0 || i < 0 || i >= shape_[0]) {
    throw Error(fmt::format("cannot take row {} of a tensor of shape {}", i,
                            shape_.ToString()));
  }
  Tensor t = *this;
  t.shape_ = shape_.DropFirst();
  const int64_t row = t.shape_.num_elements();
  if (dtype_ == DType::kBytes) {
    t.offsets_ = offsets_ + i * row;
  } else {
    t.data_ = data_ + i * row * static_cast<int64_t>(DTypeSize(dtype_));
  }
  return t;
}

Tensor Tensor::Reshape(const Shape& shape) const {
  if (ragged() || shape.num_elements() != num_elements()) {
    throw Error(fmt::format("cannot reshape {} into {}", shape_.ToString(),
                            shape.ToString()));
  }
  Tensor t = *this;
  t.shape_ = shape;
  if (dtype_ == DType::kBytes && offsets_ == nullptr && num_elements() != 1) {
    throw Error("cannot reshape a scalar bytes tensor into several values");
  }
  return t;
}

Tensor Tensor::Ragged(Tensor values, Tensor row_lengths) {
  if (row_lengths.dtype() != DType::kInt64 || row_lengths.shape().rank() != 1) {
    throw Error("row_lengths of a ragged tensor must be int64 of rank 1");
  }
  const auto lengths = row_lengths.values<int64_t>();
  auto rows = std::make_shared<RaggedRows>();
  rows->starts.resize(lengths.size() + 1);
  int64_t total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    if (lengths[r] < 0) {
      throw Error(fmt::format("row {} of a ragged tensor has length {}", r,
                              lengths[r]));
    }
    rows->starts[r] = total;
    // Saturating: lengths adding past int64 cannot match any values.
    total = lengths[r] > INT64_MAX - total ? INT64_MAX : total + lengths[r];
  }
  rows->starts[lengths.size()] = total;
  if (values.shape().rank() == 0 || values.shape()[0] != total) {
    throw Error(
        fmt::format("row lengths adding up to {} do not match values "
                    "of shape {}",
                    total, values.shape().ToString()));
  }
  rows->lengths = std::move(row_lengths);
  values.row_lengths_ = std::move(rows);
  return values;
}

bool Tensor::Exclusive() const {
  return own_storage_ && owner_ != nullptr && owner_.use_count() == 1;
}

bool Tensor::IsCompact() const {
  constexpr size_t kSmallStorage = 64 << 10;
  return storage_bytes_ <= kSmallStorage ||
         storage_bytes_ <= 2 * byte_size() + 64;
}

Tensor Tensor::Compact() const {
  if (IsCompact()) return *this;
  CheckHost("Compact()");
  const size_t size = byte_size();
  Tensor t;
  if (dtype_ == DType::kBytes) {
    if (offsets_ == nullptr) {
      t = BytesScalar(bytes(0));
      t.shape_ = shape_;
    } else {
      const int64_t n = num_elements();
      std::string data(data_ + offsets_[0], size);
      records::AlignedVector<uint64_t> offsets(n + 1);
      for (int64_t k = 0; k <= n; ++k) offsets[k] = offsets_[k] - offsets_[0];
      t = AdoptBytes(std::move(data), std::move(offsets), shape_);
    }
  } else {
    t = Allocate(dtype_, shape_);
    std::memcpy(const_cast<char*>(t.data_), data_, size);
  }
  t.row_lengths_ = row_lengths_;
  return t;
}

bool Tensor::operator==(const Tensor& o) const {
  if (dtype_ != o.dtype_ || !(shape_ == o.shape_) || ragged() != o.ragged()) {
    return false;
  }
  if (ragged() && !(row_lengths_->lengths == o.row_lengths_->lengths)) {
    return false;
  }
  CheckHost("operator==");
  o.CheckHost("operator==");
  const int64_t n = num_elements();
  if (dtype_ == DType::kBytes) {
    for (int64_t k = 0; k < n; ++k) {
      if (bytes(k) != o.bytes(k)) return false;
    }
    return true;
  }
  return n == 0 || std::memcmp(data_, o.data_, byte_size()) == 0;
}

std::string Tensor::DebugString(int max_values) const {
  std::string out = fmt::format("{}{}{} [", DTypeName(dtype_),
                                shape_.ToString(), ragged() ? " ragged" : "");
  if (device_ != Device::kCpu) {
    return out + fmt::format("in {} memory]", DeviceName(device_));
  }
  const int64_t n = std::min<int64_t>(num_elements(), max_values);
  for (int64_t k = 0; k < n; ++k) {
    if (k) out += ", ";
    switch (dtype_) {
      case DType::kFloat32:
        out += fmt::format("{}", data<float>()[k]);
        break;
      case DType::kFloat64:
        out += fmt::format("{}", data<double>()[k]);
        break;
      case DType::kInt32:
        out += fmt::format("{}", data<int32_t>()[k]);
        break;
      case DType::kInt64:
        out += fmt::format("{}", data<int64_t>()[k]);
        break;
      case DType::kUInt8:
        out += fmt::format("{}", data<uint8_t>()[k]);
        break;
      case DType::kBytes:
        out += fmt::format("{:?}", std::string(bytes(k).substr(0, 32)));
        break;
    }
  }
  if (num_elements() > n) out += ", ...";
  return out + "]";
}

void Tensor::CheckType(DType want) const {
  if (want != dtype_) {
    throw Error(fmt::format("tensor holds {}, not {}", DTypeName(dtype_),
                            DTypeName(want)));
  }
}

// --- Element ---------------------------------------------------------------

std::string Origin::ToString() const {
  if (!file) return "";
  return fmt::format("{}: record {} at offset {}", *file, record, offset);
}

BatchOrigins::BatchOrigins(std::shared_ptr<const Files> files,
                           std::vector<Row> rows)
    : files_(std::move(files)), rows_(std::move(rows)) {
  for (const Row& r : rows_) {
    if (r.file != kNoFile && r.file >= files_->size()) {
      throw Error(
          fmt::format("batch origins: file {} of {}", r.file, files_->size()));
    }
  }
}

std::shared_ptr<const BatchOrigins> BatchOrigins::Of(
    std::span<const Origin* const> origins) {
  auto files = std::make_shared<Files>();
  std::vector<Row> rows(origins.size());
  // Each distinct name once, numbered in order of first use; rows mostly
  // repeat the last row's file.
  std::unordered_map<const std::string*, uint32_t> index;
  const std::string* last = nullptr;
  uint32_t last_file = kNoFile;
  for (size_t i = 0; i < origins.size(); ++i) {
    const Origin& o = *origins[i];
    Row& r = rows[i];
    r.offset = o.offset;
    r.record = o.record;
    r.has_frame_crc = o.frame_crc.has_value();
    r.frame_crc = o.frame_crc.value_or(0);
    if (!o.file) continue;
    if (o.file.get() != last) {
      last = o.file.get();
      const auto [it, added] =
          index.try_emplace(last, static_cast<uint32_t>(files->size()));
      if (added) files->push_back(o.file);
      last_file = it->second;
    }
    r.file = last_file;
  }
  if (files->empty()) return nullptr;
  return std::make_shared<const BatchOrigins>(std::move(files),
                                              std::move(rows));
}

Origin BatchOrigins::operator[](size_t i) const {
  const Row& r = rows_[i];
  Origin o;
  if (r.file != kNoFile) o.file = (*files_)[r.file];
  o.offset = r.offset;
  o.record = r.record;
  if (r.has_frame_crc) o.frame_crc = r.frame_crc;
  return o;
}

const Tensor* Element::Find(std::string_view name) const {
  for (const auto& c : components) {
    if (c.name == name) return &c.tensor;
  }
  return nullptr;
}

const Tensor& Element::operator[](std::string_view name) const {
  if (const Tensor* t = Find(name)) return *t;
  std::vector<std::string_view> names;
  for (const auto& c : components) names.push_back(c.name);
  throw Error(fmt::format("the element has no component '{}'; it has: {}", name,
                          fmt::join(names, ", ")));
}

void Element::Set(std::string name, Tensor tensor) {
  for (auto& c : components) {
    if (c.name == name) {
      c.tensor = std::move(tensor);
      return;
    }
  }
  components.push_back({std::move(name), std::move(tensor)});
}

void Element::CopyInto(const std::shared_ptr<Allocator>& memory) {
  for (auto& c : components) c.tensor = c.tensor.CopyInto(memory);
}

size_t Element::byte_size() const {
  size_t n = 0;
  for (const auto& c : components) n += c.tensor.byte_size();
  return n;
}

std::optional<Origin> Element::OriginOf(int64_t i) const {
  if (batch_origins) {
    if (i >= 0 && static_cast<size_t>(i) < batch_origins->size()) {
      Origin o = (*batch_origins)[static_cast<size_t>(i)];
      if (o.file) return o;
    }
    return std::nullopt;
  }
  if (!origin.file) return std::nullopt;
  return origin;
}

bool Element::operator==(const Element& o) const {
  if (components.size() != o.components.size()) return false;
  for (size_t i = 0; i < components.size(); ++i) {
    if (components[i].name != o.components[i].name ||
        !(components[i].tensor == o.components[i].tensor)) {
      return false;
    }
  }
  return true;
}

std::string Element::DebugString() const {
  std::string out = "{";
  for (size_t i = 0; i < components.size(); ++i) {
    if (i) out += ", ";
    out += components[i].name + ": " + components[i].tensor.DebugString();
  }
  return out + "}";
}

}  // namespace recflow::pipeline
