#include "records/example_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "records/wire_format.h"

namespace recflow::records {
namespace {

// Feature's oneof field numbers, used as the kind of a parsed feature.
constexpr int kMissing = 0;
constexpr int kBytesList = 1;
constexpr int kFloatList = 2;
constexpr int kInt64List = 3;

int KindOf(DType d) {
  switch (d) {
    case DType::kBytes:
      return kBytesList;
    case DType::kFloat32:
      return kFloatList;
    case DType::kInt64:
      return kInt64List;
  }
  return kMissing;
}

std::string_view KindName(int kind) {
  switch (kind) {
    case kBytesList:
      return "string";
    case kFloatList:
      return "float";
    case kInt64List:
      return "int64";
  }
  return "none";
}

// TensorFlow's words for a list's values in "Number of ... values".
std::string_view ValuesName(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float";
    case DType::kInt64:
      return "int64";
    case DType::kBytes:
      return "bytes";
  }
  return "?";
}

// Depths of the nested messages (for protobuf's recursion limit).
constexpr int kExampleDepth = 0;
constexpr int kListDepth = 4;

// Checks a BytesList / FloatList / Int64List message the way protobuf's
// parser would, and counts its values.
bool ValidateList(int kind, std::string_view list, size_t* count) {
  const char* p = list.data();
  const char* end = p + list.size();
  while (p < end) {
    uint32_t field = 0, type = 0;
    if (!wire::ReadTag(p, end, &field, &type)) return false;
    if (field == 1) {
      if (kind == kBytesList && type == wire::kLengthDelimited) {
        std::string_view v;
        if (!wire::ReadLengthDelimited(p, end, &v)) return false;
        ++*count;
        continue;
      }
      if (kind == kFloatList && type == wire::kLengthDelimited) {
        std::string_view v;
        if (!wire::ReadLengthDelimited(p, end, &v) || v.size() % 4 != 0) {
          return false;
        }
        *count += v.size() / 4;
        continue;
      }
      if (kind == kFloatList && type == wire::kFixed32) {
        if (end - p < 4) return false;
        p += 4;
        ++*count;
        continue;
      }
      if (kind == kInt64List && type == wire::kLengthDelimited) {
        std::string_view v;
        if (!wire::ReadLengthDelimited(p, end, &v)) return false;
        const char* q = v.data();
        const char* qend = q + v.size();
        while (q < qend) {
          uint64_t x = 0;
          if (!wire::ReadVarint(q, qend, &x)) return false;
          ++*count;
        }
        continue;
      }
      if (kind == kInt64List && type == wire::kVarint) {
        uint64_t x = 0;
        if (!wire::ReadVarint(p, end, &x)) return false;
        ++*count;
        continue;
      }
    }
    if (!wire::SkipField(p, end, field, type, kListDepth + 1)) return false;
  }
  return true;
}

// What one example holds for one spec feature: its kind, the list
// messages that make up its value (merged in order), and their value count.
struct Slot {
  int kind = kMissing;
  uint32_t first_list = 0;
  uint32_t num_lists = 0;
  size_t count = 0;
};

// Per-thread working memory, reused across examples.
struct Scratch {
  std::vector<Slot> slots;
  std::vector<std::string_view> lists;        // referenced by slots
  std::vector<std::string_view> entry_lists;  // the entry being parsed
  std::vector<std::string_view> entry_values;
};

class ExampleDecoder {
 public:
  ExampleDecoder(const FeatureSpec& spec) : spec_(spec) {}

  // Fills scratch->slots for one serialized Example; false if protobuf
  // would not parse it.
  bool Decode(std::string_view example, Scratch* s) const {
    s->slots.assign(spec_.features.size(), Slot{});
    s->lists.clear();
    const char* p = example.data();
    const char* end = p + example.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      if (!wire::ReadTag(p, end, &field, &type)) return false;
      if (field == 1 && type == wire::kLengthDelimited) {
        std::string_view features;
        if (!wire::ReadLengthDelimited(p, end, &features) ||
            !DecodeFeatures(features, s)) {
          return false;
        }
        continue;
      }
      if (!wire::SkipField(p, end, field, type, kExampleDepth + 1)) {
        return false;
      }
    }
    return true;
  }

 private:
  bool DecodeFeatures(std::string_view msg, Scratch* s) const {
    const char* p = msg.data();
    const char* end = p + msg.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      if (!wire::ReadTag(p, end, &field, &type)) return false;
      if (field == 1 && type == wire::kLengthDelimited) {
        std::string_view entry;
        if (!wire::ReadLengthDelimited(p, end, &entry) ||
            !DecodeEntry(entry, s)) {
          return false;
        }
        continue;
      }
      if (!wire::SkipField(p, end, field, type, 2)) return false;
    }
    return true;
  }

  // A map entry: key (field 1, last wins) and value (field 2, Feature
  // messages merged in order).  As protobuf, a map entry replaces any
  // earlier entry with the same key.
  bool DecodeEntry(std::string_view msg, Scratch* s) const {
    std::string_view key;
    s->entry_values.clear();
    const char* p = msg.data();
    const char* end = p + msg.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      if (!wire::ReadTag(p, end, &field, &type)) return false;
      if (type == wire::kLengthDelimited && (field == 1 || field == 2)) {
        std::string_view v;
        if (!wire::ReadLengthDelimited(p, end, &v)) return false;
        if (field == 1) {
          // protobuf checks every occurrence, not only the last.
          if (!wire::IsValidUtf8(v)) return false;
          key = v;
        } else {
          s->entry_values.push_back(v);
        }
        continue;
      }
      if (!wire::SkipField(p, end, field, type, 3)) return false;
    }
    int kind = kMissing;
    size_t count = 0;
    s->entry_lists.clear();
    for (std::string_view value : s->entry_values) {
      if (!MergeFeature(value, &kind, &count, s)) return false;
    }
    const int index = IndexOf(key);
    if (index < 0) return true;
    Slot& slot = s->slots[index];
    slot.kind = kind;
    slot.count = count;
    slot.first_list = static_cast<uint32_t>(s->lists.size());
    slot.num_lists = static_cast<uint32_t>(s->entry_lists.size());
    s->lists.insert(s->lists.end(), s->entry_lists.begin(),
                    s->entry_lists.end());
    return true;
  }

  // A Feature message merged into what the entry holds so far: the same
  // list kind again appends; another kind replaces (a oneof).
  bool MergeFeature(std::string_view msg, int* kind, size_t* count,
                    Scratch* s) const {
    const char* p = msg.data();
    const char* end = p + msg.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      if (!wire::ReadTag(p, end, &field, &type)) return false;
      if (field >= 1 && field <= 3 && type == wire::kLengthDelimited) {
        std::string_view list;
        if (!wire::ReadLengthDelimited(p, end, &list)) return false;
        const int k = static_cast<int>(field);
        if (k != *kind) {
          *kind = k;
          *count = 0;
          s->entry_lists.clear();
        }
        if (!ValidateList(k, list, count)) return false;
        s->entry_lists.push_back(list);
        continue;
      }
      if (!wire::SkipField(p, end, field, type, 4)) return false;
    }
    return true;
  }

  int IndexOf(std::string_view key) const {
    const auto& f = spec_.features;
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i].first.size() == key.size() && f[i].first == key) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  const FeatureSpec& spec_;
};

// Appends the values of a slot's lists (already validated) to `out`.
void AppendFloats(std::span<const std::string_view> lists, float* out) {
  for (std::string_view list : lists) {
    const char* p = list.data();
    const char* end = p + list.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      wire::ReadTag(p, end, &field, &type);
      if (field == 1 && type == wire::kLengthDelimited) {
        std::string_view v;
        wire::ReadLengthDelimited(p, end, &v);
        std::memcpy(out, v.data(), v.size());
        out += v.size() / 4;
      } else if (field == 1 && type == wire::kFixed32) {
        std::memcpy(out++, p, 4);
        p += 4;
      } else {
        wire::SkipField(p, end, field, type, kListDepth + 1);
      }
    }
  }
}

void AppendInts(std::span<const std::string_view> lists, int64_t* out) {
  for (std::string_view list : lists) {
    const char* p = list.data();
    const char* end = p + list.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      wire::ReadTag(p, end, &field, &type);
      uint64_t x = 0;
      if (field == 1 && type == wire::kLengthDelimited) {
        std::string_view v;
        wire::ReadLengthDelimited(p, end, &v);
        const char* q = v.data();
        const char* qend = q + v.size();
        while (q < qend) {
          wire::ReadVarint(q, qend, &x);
          *out++ = static_cast<int64_t>(x);
        }
      } else if (field == 1 && type == wire::kVarint) {
        wire::ReadVarint(p, end, &x);
        *out++ = static_cast<int64_t>(x);
      } else {
        wire::SkipField(p, end, field, type, kListDepth + 1);
      }
    }
  }
}

void AppendBytes(std::span<const std::string_view> lists, ParsedFeature* f) {
  for (std::string_view list : lists) {
    const char* p = list.data();
    const char* end = p + list.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      wire::ReadTag(p, end, &field, &type);
      if (field == 1 && type == wire::kLengthDelimited) {
        std::string_view v;
        wire::ReadLengthDelimited(p, end, &v);
        f->bytes_data.append(v);
        f->bytes_offsets.push_back(f->bytes_data.size());
      } else {
        wire::SkipField(p, end, field, type, kListDepth + 1);
      }
    }
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

// Parses examples [begin, end) of `serialized` into `out`, which has been
// reset for the range.  Returns the first error's message and its example
// index through `error` / `error_index`, or leaves them empty.
void ParseRange(const FeatureSpec& spec,
                std::span<const std::string_view> serialized, size_t begin,
                size_t end, ParsedBatch* out, std::string* error,
                size_t* error_index) {
  const ExampleDecoder decoder(spec);
  Scratch scratch;
  const size_t n = end - begin;
  out->batch_size = static_cast<int64_t>(n);
  for (size_t d = 0; d < spec.features.size(); ++d) {
    ParsedFeature& f = out->features[d];
    const FeatureConfig& c = f.config;
    f.floats.clear();
    f.ints.clear();
    f.bytes_data.clear();
    f.bytes_offsets.assign(1, 0);
    f.row_lengths.clear();
    if (c.kind == FeatureConfig::Kind::kFixed) {
      const size_t total = n * static_cast<size_t>(c.num_elements());
      if (c.dtype == DType::kFloat32) f.floats.resize(total);
      if (c.dtype == DType::kInt64) f.ints.resize(total);
    } else {
      f.row_lengths.reserve(n);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t index = begin + i;
    auto fail = [&](std::string message) {
      *error = std::move(message);
      *error_index = index;
    };
    if (!decoder.Decode(serialized[index], &scratch)) {
      return fail("Can't parse serialized Example.");
    }
    for (size_t d = 0; d < spec.features.size(); ++d) {
      ParsedFeature& f = out->features[d];
      const FeatureConfig& c = f.config;
      const Slot& slot = scratch.slots[d];
      const std::span<const std::string_view> lists(
          scratch.lists.data() + slot.first_list, slot.num_lists);
      const bool fixed = c.kind == FeatureConfig::Kind::kFixed;
      if (slot.kind == kMissing) {
        if (!fixed) {
          f.row_lengths.push_back(0);
          continue;
        }
        if (!c.default_value) {
          return fail(fmt::format(
              "Feature: {} (data type: {}) is required but could not be "
              "found.",
              f.name, TensorFlowDTypeName(c.dtype)));
        }
        const size_t k = static_cast<size_t>(c.num_elements());
        const DefaultValue& dv = *c.default_value;
        for (size_t j = 0; j < k; ++j) {
          switch (c.dtype) {
            case DType::kFloat32:
              f.floats[i * k + j] = dv.floats[dv.floats.size() == 1 ? 0 : j];
              break;
            case DType::kInt64:
              f.ints[i * k + j] = dv.ints[dv.ints.size() == 1 ? 0 : j];
              break;
            case DType::kBytes: {
              const std::string& b = dv.bytes[dv.bytes.size() == 1 ? 0 : j];
              f.bytes_data.append(b);
              f.bytes_offsets.push_back(f.bytes_data.size());
              break;
            }
          }
        }
        continue;
      }
      if (slot.kind != KindOf(c.dtype)) {
        return fail(fmt::format(
            "Key: {}, Index: {}.  Data types don't match. Data type: {} but "
            "expected type: {}",
            f.name, index, KindName(slot.kind), TensorFlowDTypeName(c.dtype)));
      }
      if (fixed && slot.count != static_cast<size_t>(c.num_elements())) {
        return fail(fmt::format(
            "Key: {}, Index: {}.  Number of {} values != expected.  Values "
            "size: {} but output shape: {}",
            f.name, index, ValuesName(c.dtype), slot.count,
            ShapeString(c.shape)));
      }
      switch (c.dtype) {
        case DType::kFloat32:
          if (fixed) {
            AppendFloats(lists, f.floats.data() + i * slot.count);
          } else {
            const size_t at = f.floats.size();
            f.floats.resize(at + slot.count);
            AppendFloats(lists, f.floats.data() + at);
          }
          break;
        case DType::kInt64:
          if (fixed) {
            AppendInts(lists, f.ints.data() + i * slot.count);
          } else {
            const size_t at = f.ints.size();
            f.ints.resize(at + slot.count);
            AppendInts(lists, f.ints.data() + at);
          }
          break;
        case DType::kBytes:
          AppendBytes(lists, &f);
          break;
      }
      if (!fixed) f.row_lengths.push_back(static_cast<int64_t>(slot.count));
    }
  }
}

// Appends `part` (a later range of the batch) to `out`.
void AppendBatch(const ParsedBatch& part, ParsedBatch* out) {
  out->batch_size += part.batch_size;
  for (size_t d = 0; d < out->features.size(); ++d) {
    ParsedFeature& f = out->features[d];
    const ParsedFeature& g = part.features[d];
    f.floats.insert(f.floats.end(), g.floats.begin(), g.floats.end());
    f.ints.insert(f.ints.end(), g.ints.begin(), g.ints.end());
    const uint64_t base = f.bytes_data.size();
    f.bytes_data.append(g.bytes_data);
    for (size_t k = 1; k < g.bytes_offsets.size(); ++k) {
      f.bytes_offsets.push_back(base + g.bytes_offsets[k]);
    }
    f.row_lengths.insert(f.row_lengths.end(), g.row_lengths.begin(),
                         g.row_lengths.end());
  }
}

void Shape(const FeatureSpec& spec, ParsedBatch* out) {
  if (out->features.size() == spec.features.size()) return;
  out->features.resize(spec.features.size());
  for (size_t d = 0; d < spec.features.size(); ++d) {
    out->features[d].name = spec.features[d].first;
    out->features[d].config = spec.features[d].second;
  }
}

}  // namespace

size_t ParsedFeature::num_values() const {
  switch (config.dtype) {
    case DType::kFloat32:
      return floats.size();
    case DType::kInt64:
      return ints.size();
    case DType::kBytes:
      return bytes_offsets.empty() ? 0 : bytes_offsets.size() - 1;
  }
  return 0;
}

const ParsedFeature& ParsedBatch::feature(std::string_view name) const {
  for (const auto& f : features) {
    if (f.name == name) return f;
  }
  throw std::out_of_range(fmt::format("no feature '{}' in the batch", name));
}

ExampleParser::ExampleParser(FeatureSpec spec) : spec_(std::move(spec)) {}

void ExampleParser::ParseBatch(std::span<const std::string_view> serialized,
                               ParsedBatch* out, const ParseContext& context,
                               int threads) const {
  // Outputs from an earlier spec are reshaped; the same spec's are reused.
  if (!out->features.empty() &&
      (out->features.size() != spec_.features.size() ||
       out->features[0].name != spec_.features[0].first)) {
    out->features.clear();
  }
  Shape(spec_, out);
  const size_t n = serialized.size();
  const size_t parts =
      std::clamp<size_t>(static_cast<size_t>(std::max(threads, 1)), 1,
                         std::max<size_t>(n / 64, 1));
  std::string error;
  size_t error_index = 0;
  if (parts == 1) {
    ParseRange(spec_, serialized, 0, n, out, &error, &error_index);
  } else {
    std::vector<ParsedBatch> results(parts);
    std::vector<std::string> errors(parts);
    std::vector<size_t> error_indexes(parts);
    std::vector<std::thread> workers;
    for (size_t t = 0; t < parts; ++t) {
      Shape(spec_, &results[t]);
      const size_t begin = n * t / parts, end = n * (t + 1) / parts;
      workers.emplace_back([&, t, begin, end] {
        ParseRange(spec_, serialized, begin, end, &results[t], &errors[t],
                   &error_indexes[t]);
      });
    }
    for (auto& w : workers) w.join();
    for (size_t t = 0; t < parts && error.empty(); ++t) {
      if (!errors[t].empty()) {
        error = errors[t];
        error_index = error_indexes[t];
      }
    }
    if (error.empty()) {
      *out = std::move(results[0]);
      for (size_t t = 1; t < parts; ++t) AppendBatch(results[t], out);
    }
  }
  if (!error.empty()) {
    if (context.file.empty()) throw ParseError(error);
    throw ParseError(fmt::format("{}: record {}: {}", context.file,
                                 context.first_record + error_index, error));
  }
}

}  // namespace recflow::records
