#include "records/example_builder.h"

#include <cstring>

#include "records/wire_format.h"

namespace recflow::records {

using wire::kBytesList;
using wire::kFloatList;
using wire::kInt64List;
using wire::PutLengthDelimited;
using wire::PutTag;
using wire::PutVarint;
using wire::VarintSize;

void ExampleBuilder::AddEntry(std::string_view name, int kind,
                              std::string_view list) {
  // entry { key = 1; value = 2 { <kind> { list } } }
  const size_t feature_size = 1 + VarintSize(list.size()) + list.size();
  const size_t entry_size = 1 + VarintSize(name.size()) + name.size() + 1 +
                            VarintSize(feature_size) + feature_size;
  PutTag(features_, 1, wire::kLengthDelimited);
  PutVarint(features_, entry_size);
  PutLengthDelimited(features_, 1, name);
  PutTag(features_, 2, wire::kLengthDelimited);
  PutVarint(features_, feature_size);
  PutLengthDelimited(features_, static_cast<uint32_t>(kind), list);
}

ExampleBuilder& ExampleBuilder::AddInt64(std::string_view name, int64_t value) {
  return AddInt64List(name, std::span<const int64_t>(&value, 1));
}

ExampleBuilder& ExampleBuilder::AddInt64List(std::string_view name,
                                             std::span<const int64_t> values) {
  std::string packed;
  for (int64_t v : values) PutVarint(packed, static_cast<uint64_t>(v));
  scratch_.clear();
  if (!values.empty()) PutLengthDelimited(scratch_, 1, packed);
  AddEntry(name, kInt64List, scratch_);
  return *this;
}

ExampleBuilder& ExampleBuilder::AddFloat(std::string_view name, float value) {
  return AddFloatList(name, std::span<const float>(&value, 1));
}

ExampleBuilder& ExampleBuilder::AddFloatList(std::string_view name,
                                             std::span<const float> values) {
  scratch_.clear();
  if (!values.empty()) {
    PutTag(scratch_, 1, wire::kLengthDelimited);
    PutVarint(scratch_, values.size() * 4);
    const size_t at = scratch_.size();
    scratch_.resize(at + values.size() * 4);
    std::memcpy(scratch_.data() + at, values.data(), values.size() * 4);
  }
  AddEntry(name, kFloatList, scratch_);
  return *this;
}

ExampleBuilder& ExampleBuilder::AddBytes(std::string_view name,
                                         std::string_view value) {
  return AddBytesList(name, std::span<const std::string_view>(&value, 1));
}

ExampleBuilder& ExampleBuilder::AddBytesList(
    std::string_view name, std::span<const std::string> values) {
  scratch_.clear();
  for (const std::string& v : values) PutLengthDelimited(scratch_, 1, v);
  AddEntry(name, kBytesList, scratch_);
  return *this;
}

ExampleBuilder& ExampleBuilder::AddBytesList(
    std::string_view name, std::span<const std::string_view> values) {
  scratch_.clear();
  for (std::string_view v : values) PutLengthDelimited(scratch_, 1, v);
  AddEntry(name, kBytesList, scratch_);
  return *this;
}

std::string_view ExampleBuilder::Serialize() {
  example_.clear();
  PutLengthDelimited(example_, 1, features_);
  return example_;
}

}  // namespace recflow::records
