// Tensors and elements: what a pipeline delivers.
//
// A Tensor is an immutable n-dimensional array of one dtype whose storage is
// shared and reference-counted: copying a Tensor copies a pointer, slicing
// a row is a view, and a record read from a file is a view into the read
// block it arrived in.  Storage the pipeline allocates is 64-byte aligned.
// A Tensor may also view memory it does not own (Tensor::View), which is how
// in-memory arrays enter a pipeline without being copied.
//
// Bytes tensors hold their values in one buffer with offsets (value k is
// data[offsets[k], offsets[k+1])), like the parser's output.  A ragged
// tensor (a VarLen feature parsed over a batch) is a flat values tensor plus
// row_lengths: row i holds row_lengths[i] of the values, in order.
//
// A tensor's storage may be a GPU's memory (device() == Device::kCuda, made
// by Allocate with a device Allocator, see allocator.h).  data<T>() then is
// a device pointer, for kernels and copies; every operation that reads
// values on the host (values, scalar, bytes, ==, DebugString, Compact)
// throws an Error naming the device instead of touching it.  Copies
// between host and device are explicit (train::Backend::ToHost/ToDevice),
// never hidden in an accessor.
//
// Thread safety: Tensors are immutable once built and may be shared between
// threads; mutable_data() is only for the builder of a fresh tensor.
#ifndef RECFLOW_PIPELINE_TENSOR_H_
#define RECFLOW_PIPELINE_TENSOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/allocator.h"
#include "pipeline/error.h"
#include "records/aligned_buffer.h"
#include "records/dtype.h"

namespace recflow::pipeline {

// One dtype enum for every layer (records/dtype.h).
using records::DType;
using records::DTypeName;
using records::DTypeSize;

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kUInt8;
}

// A shape of up to kMaxRank dimensions, held inline (no allocation).
class Shape {
 public:
  static constexpr int kMaxRank = 8;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t num_elements() const;
  std::span<const int64_t> dims() const {
    return {dims_.data(), size_t(rank_)};
  }
  // The shape with `d` prepended / the first dimension removed.
  Shape Prepend(int64_t d) const;
  Shape DropFirst() const;
  void set_dim(int i, int64_t d) { dims_[i] = d; }
  bool operator==(const Shape& o) const;
  std::string ToString() const;  // "[256, 784]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

class Tensor {
 public:
  Tensor() = default;  // an empty float32 scalar-less tensor (!valid())

  // Fresh, 64-byte aligned, uninitialised storage for a numeric tensor.
  static Tensor Allocate(DType dtype, const Shape& shape);
  // The same from `allocator` (host, pinned host or device memory); the
  // tensor keeps the allocator alive.  Null: as above.
  static Tensor Allocate(DType dtype, const Shape& shape,
                         const std::shared_ptr<Allocator>& allocator);
  // Adopts a parser buffer without copying.
  template <typename T>
  static Tensor Adopt(records::AlignedVector<T>&& values, const Shape& shape);
  // Adopts values that `storage` keeps alive, without copying; its deleter
  // may recycle the buffer once no tensor uses it (pipeline/parse.cc).
  // storage_bytes() counts the buffer's capacity.
  template <typename T>
  static Tensor Adopt(std::shared_ptr<const records::AlignedVector<T>> storage,
                      const Shape& shape);
  // Copies `values`.
  template <typename T>
  static Tensor FromValues(std::span<const T> values, const Shape& shape);
  template <typename T>
  static Tensor Scalar(T value) {
    return FromValues<T>(std::span<const T>(&value, 1), Shape{});
  }
  // Views memory owned elsewhere; `owner` (may be null when the caller
  // guarantees the memory outlives every Tensor made from it) is kept alive
  // as long as the view or any slice of it.
  static Tensor View(DType dtype, const Shape& shape, const void* data,
                     std::shared_ptr<const void> owner,
                     Device device = Device::kCpu);

  // Bytes tensors.  A scalar viewing `n` bytes at `data`, kept alive by
  // `owner`, which holds `storage_bytes` (for Compact(); 0: unknown).
  static Tensor BytesView(const char* data, size_t n,
                          std::shared_ptr<const void> owner,
                          size_t storage_bytes = 0);
  // Copies `value`.
  static Tensor BytesScalar(std::string_view value);
  // Adopts a value buffer and num_elements + 1 offsets into it.
  static Tensor AdoptBytes(std::string&& data,
                           records::AlignedVector<uint64_t>&& offsets,
                           const Shape& shape);
  // A bytes tensor's buffers: the values back to back, and offsets.
  struct BytesBuffers {
    std::string data;
    records::AlignedVector<uint64_t> offsets;
  };
  // The same from buffers that `storage` keeps alive (as Adopt above).
  static Tensor AdoptBytes(std::shared_ptr<const BytesBuffers> storage,
                           const Shape& shape);
  // Copies `values` back to back into one buffer (as Batch stacks bytes).
  static Tensor FromStrings(std::span<const std::string> values,
                            const Shape& shape);
  static Tensor FromStrings(std::span<const std::string_view> values,
                            const Shape& shape);

  bool valid() const { return data_ != nullptr || num_elements() == 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool on_host() const { return device_ == Device::kCpu; }
  // Throws an Error saying that `what` needs host memory when this tensor
  // is on a GPU.
  void CheckHost(std::string_view what) const;
  const Shape& shape() const { return shape_; }
  int64_t num_elements() const { return shape_.num_elements(); }
  // Bytes of values (for bytes tensors: the values' total length).
  size_t byte_size() const;

  template <typename T>
  const T* data() const {
    CheckType(DTypeOf<T>());
    return reinterpret_cast<const T*>(data_);
  }
  template <typename T>
  T* mutable_data() {
    CheckType(DTypeOf<T>());
    return const_cast<T*>(reinterpret_cast<const T*>(data_));
  }
  const char* raw_data() const { return data_; }
  // Host tensors only (throw for a device tensor).
  template <typename T>
  std::span<const T> values() const {
    CheckHost("values()");
    return {data<T>(), static_cast<size_t>(num_elements())};
  }
  // The first value (a scalar's only one); an Error when there is none
  // (a shape with a 0 in it).
  template <typename T>
  T scalar() const {
    CheckHost("scalar()");
    const T* values = data<T>();
    if (shape_.num_elements() == 0) ThrowNoValue("scalar()");
    return values[0];
  }
  // Value k of a bytes tensor (flat index).  Inline: callers loop over a
  // batch's values (BytesAsUInt8, decode_raw's check) on the thread that
  // launches a GPU step.
  std::string_view bytes(int64_t k) const {
    if (dtype_ != DType::kBytes || device_ != Device::kCpu) [[unlikely]] {
      CheckBytesOnHost("bytes()");
    }
    if (offsets_ == nullptr) return {data_, scalar_bytes_};
    return {data_ + offsets_[k], offsets_[k + 1] - offsets_[k]};
  }
  // The index of the first value of a host bytes tensor that does not
  // hold `each` bytes, or num_elements() when every value does: one pass
  // over the offsets (BytesAsUInt8, CopyInto and decode_raw ask it of a
  // batch's column).
  int64_t FirstBytesNotOfLength(size_t each) const;
  // Value k (flat index) of a numeric host tensor, as a double.
  double NumberAt(int64_t k) const;
  // A host bytes tensor whose values all hold n bytes as uint8
  // [shape..., n] (tf.io.decode_raw's input): a view when the values lie
  // back to back in one buffer (the parser's and Batch's output), else a
  // packed copy.  Throws Error naming a value of another length, or for a
  // ragged tensor.
  Tensor BytesAsUInt8() const;

  // Row `i` of the first dimension, as a view sharing this storage.  For a
  // ragged tensor: the values of row i, a dense [row_length] tensor.
  Tensor Slice(int64_t i) const;
  // A tensor with the same values and another shape of as many elements.
  Tensor Reshape(const Shape& shape) const;

  // Ragged tensors.
  bool ragged() const { return row_lengths_ != nullptr; }
  int64_t num_rows() const;  // ragged: rows; else the first dimension
  const Tensor& row_lengths() const;
  // A ragged tensor's values as a dense tensor (its first dimension the
  // sum of the row lengths), sharing this storage; *this when not ragged.
  Tensor FlatValues() const;
  // Row lengths must be int64 [rows], non-negative and adding up to the
  // values' first dimension; throws Error otherwise.
  static Tensor Ragged(Tensor values, Tensor row_lengths);

  // A copy in fresh storage sized to the values, so that holding it does
  // not keep a larger buffer (a read block) alive.  Returns *this when the
  // storage is already its own (IsCompact()).
  Tensor Compact() const;
  // Whether Compact() would return this tensor as it is: its storage is
  // small or not much larger than its values.
  bool IsCompact() const;
  // Whether writing into this tensor's memory could change nothing but
  // this tensor: its storage was made for it by recflow (Allocate, Adopt,
  // FromValues, Compact, the bytes factories; not a View of memory owned
  // elsewhere, such as a caller's array), and no other tensor or holder
  // (a cache, a batch it was sliced from) shares that storage now.  Copies
  // of a tensor share it.  A snapshot, but one that no other thread can
  // make stale: none holds what a tensor holds alone.  Python's DLPack
  // export copies a tensor that is not exclusive (python/arrays.cc).
  bool Exclusive() const;
  // Bytes of storage kept alive by this tensor, when known (0 otherwise).
  size_t storage_bytes() const { return storage_bytes_; }

  // A copy of this host tensor in storage from `memory`, host or pinned
  // host memory (a GPU copies from pinned memory without staging it
  // first): numeric tensors, and bytes tensors whose values all have one
  // length, their values back to back in one block of `memory` (so that
  // BytesAsUInt8() of the copy views that block) and their offsets on the
  // heap.  Ragged tensors, bytes values of mixed lengths and tensors of no
  // bytes are returned as they are.  Throws Error for a device tensor or
  // device memory, and what memory->Allocate throws.
  Tensor CopyInto(const std::shared_ptr<Allocator>& memory) const;

  // Exact equality of dtype, shape, raggedness and values.
  bool operator==(const Tensor& o) const;
  std::string DebugString(int max_values = 8) const;

 private:
  void CheckType(DType want) const;
  [[noreturn]] void ThrowNoValue(std::string_view what) const;
  // CheckType(kBytes), then CheckHost(what).
  void CheckBytesOnHost(std::string_view what) const;
  // Keeps `storage`, made for this tensor (Exclusive()).
  void Own(std::shared_ptr<const void> storage) {
    owner_ = std::move(storage);
    own_storage_ = true;
  }

  DType dtype_ = DType::kFloat32;
  Device device_ = Device::kCpu;
  Shape shape_;
  const char* data_ = nullptr;
  // Bytes tensors: num_elements + 1 offsets relative to data_, or null for
  // a scalar whose one value is [data_, data_ + scalar_bytes_).
  const uint64_t* offsets_ = nullptr;
  uint64_t scalar_bytes_ = 0;
  size_t storage_bytes_ = 0;
  std::shared_ptr<const void> owner_;
  // owner_ is storage made for this tensor (and its copies) by Own(), not
  // memory owned elsewhere that a View points into (Exclusive()).
  bool own_storage_ = false;
  // Ragged tensors: the row lengths, and where each row starts (tensor.cc).
  struct RaggedRows;
  std::shared_ptr<const RaggedRows> row_lengths_;
};

// An element: named tensors in a fixed order, as tf.data's dict elements.
// `origin` says where a single record came from (file, offset, record
// index) for error messages; a batch keeps its records' origins.
struct Origin {
  std::shared_ptr<const std::string> file;
  uint64_t offset = 0;
  uint64_t record = 0;
  // The CRC-32C stored in the record's frame when it was read from an
  // uncompressed file, where the frame starts at `offset`: a shuffle buffer
  // saves the record by reference while its bytes still have that CRC.
  std::optional<uint32_t> frame_crc;
  std::string ToString() const;  // "FILE: record N at offset O"
};

// The origins of a batch's rows, compactly: each file name once (shared,
// often the source's whole file list) and per row the file's number there,
// the offset, the record index and the frame CRC.  A batch builds it once
// and never changes it; it may then be read from any thread.  A row costs
// no reference count (an Origin's file name does), which matters at
// millions of records a second.
class BatchOrigins {
 public:
  using Files = std::vector<std::shared_ptr<const std::string>>;
  static constexpr uint32_t kNoFile = UINT32_MAX;
  struct Row {
    uint64_t offset = 0;
    uint64_t record = 0;
    uint32_t file = kNoFile;  // an index in files(), or kNoFile: unknown
    bool has_frame_crc = false;
    uint32_t frame_crc = 0;
  };

  // `rows` name files by their index in `*files` (not null).
  BatchOrigins(std::shared_ptr<const Files> files, std::vector<Row> rows);
  // The origins of `origins` (each file name kept once); null when no
  // origin has a file.
  static std::shared_ptr<const BatchOrigins> Of(
      std::span<const Origin* const> origins);

  size_t size() const { return rows_.size(); }
  const Row& row(size_t i) const { return rows_[i]; }
  const Files& files() const { return *files_; }
  // Row `i` as an Origin (with no file when the row has none).
  Origin operator[](size_t i) const;

 private:
  std::shared_ptr<const Files> files_;
  std::vector<Row> rows_;
};

struct Element {
  struct Component {
    std::string name;
    Tensor tensor;
  };
  std::vector<Component> components;
  Origin origin;
  std::shared_ptr<const BatchOrigins> batch_origins;

  // The tensor called `name`; throws Error listing the names there are.
  const Tensor& operator[](std::string_view name) const;
  const Tensor* Find(std::string_view name) const;
  // Adds `name` or replaces the tensor of that name.
  void Set(std::string name, Tensor tensor);
  // Replaces each tensor by its Tensor::CopyInto(memory).
  void CopyInto(const std::shared_ptr<Allocator>& memory);
  size_t byte_size() const;
  // The origin of row `i` of a batch, or `origin` for a single element;
  // none when it is not known.  Its file name stays valid while the
  // element's origins do.
  std::optional<Origin> OriginOf(int64_t i) const;
  bool operator==(const Element& o) const;  // names and tensors
  std::string DebugString() const;
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_TENSOR_H_
