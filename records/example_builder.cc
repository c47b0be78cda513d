#include "records/example_builder.h"

#include <cstring>

#include "records/wire_format.h"

namespace recflow::records {

using wire::kBytesList;
using wire::kFloatList;
using wire::kInt64List;
using wire::kLengthDelimited;
using wire::VarintSize;

namespace {

// Raw writes into space already sized: the builder computes every length
// first, so that an entry is one resize and stores, not a push_back per
// byte (which cost most of a CSV row's build).
char* WriteVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}
// A length-delimited field's tag; fields here are all below 16 (one byte).
char* WriteTag(char* p, uint32_t field) {
  *p++ = static_cast<char>((field << 3) | kLengthDelimited);
  return p;
}
// Field `field` holding `bytes`.
char* WriteLengthDelimited(char* p, uint32_t field, std::string_view bytes) {
  p = WriteTag(p, field);
  p = WriteVarint(p, bytes.size());
  if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
  return p + bytes.size();
}
// The bytes of a length-delimited field holding `n` bytes.
size_t FieldSize(size_t n) { return 1 + VarintSize(n) + n; }

// The BytesList of `values`: each value as field 1.
template <typename Strings>
size_t BytesListSize(const Strings& values) {
  size_t n = 0;
  for (const auto& v : values) n += FieldSize(std::string_view(v).size());
  return n;
}
template <typename Strings>
char* WriteBytesList(char* p, const Strings& values) {
  for (const auto& v : values) p = WriteLengthDelimited(p, 1, v);
  return p;
}

}  // namespace

ExampleBuilder::ExampleBuilder() { Clear(); }

void ExampleBuilder::Clear() { buffer_.assign(kHead, '\0'); }

template <typename WriteList>
void ExampleBuilder::AddEntry(std::string_view name, int kind, size_t list_size,
                              WriteList write_list) {
  // Features.feature: entry { key = 1; value = 2 { <kind> { list } } }
  const size_t feature_size = FieldSize(list_size);
  const size_t entry_size = FieldSize(name.size()) + FieldSize(feature_size);
  const size_t at = buffer_.size();
  buffer_.resize(at + FieldSize(entry_size));
  char* p = buffer_.data() + at;
  p = WriteTag(p, 1);
  p = WriteVarint(p, entry_size);
  p = WriteLengthDelimited(p, 1, name);
  p = WriteTag(p, 2);
  p = WriteVarint(p, feature_size);
  p = WriteTag(p, static_cast<uint32_t>(kind));
  p = WriteVarint(p, list_size);
  write_list(p);
}

ExampleBuilder& ExampleBuilder::AddInt64(std::string_view name, int64_t value) {
  return AddInt64List(name, std::span<const int64_t>(&value, 1));
}

ExampleBuilder& ExampleBuilder::AddInt64List(std::string_view name,
                                             std::span<const int64_t> values) {
  // Packed, as field 1; nothing at all for no values (as protobuf).
  size_t packed = 0;
  for (int64_t v : values) packed += VarintSize(static_cast<uint64_t>(v));
  AddEntry(name, kInt64List, values.empty() ? 0 : FieldSize(packed),
           [&](char* p) {
             if (values.empty()) return;
             p = WriteTag(p, 1);
             p = WriteVarint(p, packed);
             for (int64_t v : values) {
               p = WriteVarint(p, static_cast<uint64_t>(v));
             }
           });
  return *this;
}

ExampleBuilder& ExampleBuilder::AddFloat(std::string_view name, float value) {
  return AddFloatList(name, std::span<const float>(&value, 1));
}

ExampleBuilder& ExampleBuilder::AddFloatList(std::string_view name,
                                             std::span<const float> values) {
  const size_t bytes = values.size() * sizeof(float);
  AddEntry(name, kFloatList, values.empty() ? 0 : FieldSize(bytes),
           [&](char* p) {
             if (values.empty()) return;
             p = WriteTag(p, 1);
             p = WriteVarint(p, bytes);
             std::memcpy(p, values.data(), bytes);
           });
  return *this;
}

ExampleBuilder& ExampleBuilder::AddBytes(std::string_view name,
                                         std::string_view value) {
  return AddBytesList(name, std::span<const std::string_view>(&value, 1));
}

ExampleBuilder& ExampleBuilder::AddBytesList(
    std::string_view name, std::span<const std::string> values) {
  AddEntry(name, kBytesList, BytesListSize(values),
           [&](char* p) { WriteBytesList(p, values); });
  return *this;
}

ExampleBuilder& ExampleBuilder::AddBytesList(
    std::string_view name, std::span<const std::string_view> values) {
  AddEntry(name, kBytesList, BytesListSize(values),
           [&](char* p) { WriteBytesList(p, values); });
  return *this;
}

std::string_view ExampleBuilder::Serialize() {
  // Example.features (field 1), its tag and length written right before
  // the Features' bytes, in the room kept for them: no copy.
  const size_t features = buffer_.size() - kHead;
  const size_t head = 1 + VarintSize(features);
  char* p = buffer_.data() + kHead - head;
  WriteVarint(WriteTag(p, 1), features);
  return std::string_view(p, head + features);
}

}  // namespace recflow::records
