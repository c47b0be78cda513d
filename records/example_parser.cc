#include "records/example_parser.h"

#include <fmt/format.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "records/tsan.h"
#include "records/wire_format.h"

namespace recflow::records {
namespace {

constexpr size_t kMinPartBytes = size_t{64} << 10;

// The kind of a parsed feature: its oneof field number, or none.
constexpr int kMissing = 0;
using wire::kBytesList;
using wire::kFloatList;
using wire::kInt64List;

int KindOf(DType d) {
  switch (d) {
    case DType::kBytes:
      return kBytesList;
    case DType::kFloat32:
      return kFloatList;
    case DType::kInt64:
      return kInt64List;
    default:  // not an Example dtype: ExampleParser refuses such a spec
      break;
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
    default:  // not an Example dtype: ExampleParser refuses such a spec
      break;
  }
  return DTypeName(d);
}

// Depths of the nested messages (for protobuf's recursion limit).
constexpr int kExampleDepth = 0;
constexpr int kFeatureDepth = 3;
constexpr int kListDepth = 4;

// Counts the varints of a packed run without decoding them: one ends at
// every byte below 0x80.  The run is valid when its last byte ends a varint
// and no varint is longer than ten bytes.  Eight bytes at a time, without a
// branch per varint (token ids of mixed lengths would mispredict each one).
bool CountPackedVarints(std::string_view run, size_t* count) {
  constexpr uint64_t kHighBits = 0x8080808080808080ULL;
  const char* q = run.data();
  const char* const end = q + run.size();
  size_t ends = 0;
  unsigned open = 0;  // continuation bytes since the last varint ended
  for (; end - q >= 8; q += 8) {
    uint64_t w;
    std::memcpy(&w, q, 8);
    const uint64_t stops = ~w & kHighBits;
    if (stops == 0) {
      open += 8;
    } else {
      if (open + static_cast<unsigned>(__builtin_ctzll(stops)) / 8 >= 10) {
        return false;
      }
      open = static_cast<unsigned>(__builtin_clzll(stops)) / 8;
      // One bit per byte: summing the bytes counts them (no popcnt needed).
      ends += ((stops >> 7) * 0x0101010101010101ULL) >> 56;
    }
    if (open >= 10) return false;
  }
  for (; q < end; ++q) {
    if (static_cast<uint8_t>(*q) & 0x80) {
      if (++open >= 10) return false;
    } else {
      open = 0;
      ++ends;
    }
  }
  if (open != 0) return false;
  *count = ends;
  return true;
}

// Gathers the 7-bit groups of a varint of at most eight bytes (its bytes
// in `b`, little-endian, nothing above them) into its value, without
// branches: pairs, then quads, then the two halves.
inline uint64_t CompactVarint(uint64_t b) {
  b &= 0x7f7f7f7f7f7f7f7fULL;
  b = (b & 0x007f007f007f007fULL) | ((b & 0x7f007f007f007f00ULL) >> 1);
  b = (b & 0x00003fff00003fffULL) | ((b & 0x3fff00003fff0000ULL) >> 2);
  return (b & 0x000000000fffffffULL) | ((b & 0x0fffffff00000000ULL) >> 4);
}

// Decodes a packed run of varints into `out` (room for run.size() values)
// and returns the end of what it wrote.  Sets *valid to false when the run
// is not valid (a varint over ten bytes, or one cut off by its end).
// Eight bytes at a time: the clear high bits mark where varints end, so the
// varints inside a word are found with bit operations instead of a branch
// per byte.
int64_t* DecodePackedVarints(std::string_view run, int64_t* out, bool* valid) {
  *valid = true;
  const char* q = run.data();
  const char* const end = q + run.size();
  while (end - q >= 8) {
    uint64_t w;
    std::memcpy(&w, q, 8);
    uint64_t ends = ~w & 0x8080808080808080ULL;
    if (ends == 0) {  // a varint of nine or ten bytes
      uint64_t x = 0;
      if (!wire::ReadVarint(q, end, &x)) {
        *valid = false;
        return out;
      }
      *out++ = static_cast<int64_t>(x);
      continue;
    }
    unsigned start = 0;
    do {
      // Bits [start, stop) hold the varint; stop is at most 64, and
      // (2 << (stop - 1)) - 1 masks below it without a branch.
      const unsigned stop = static_cast<unsigned>(__builtin_ctzll(ends)) + 1;
      const uint64_t b = (w & ((uint64_t{2} << (stop - 1)) - 1)) >> start;
      *out++ = static_cast<int64_t>(CompactVarint(b));
      start = stop;
      ends &= ends - 1;
    } while (ends != 0);
    q += start / 8;
  }
  while (q < end) {
    uint64_t x = 0;
    if (!wire::ReadVarint(q, end, &x)) {
      *valid = false;
      return out;
    }
    *out++ = static_cast<int64_t>(x);
  }
  return out;
}

// Checks a BytesList / FloatList / Int64List message the way protobuf's
// parser would, and counts its values.  Int64 values are also decoded into
// `ints` when it is given (the features the spec asks for), so that they
// are read once.
bool ValidateList(int kind, std::string_view list, size_t* count, int depth,
                  AlignedVector<int64_t>* ints) {
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
        if (ints == nullptr) {
          size_t varints;
          if (!CountPackedVarints(v, &varints)) return false;
          *count += varints;
          continue;
        }
        const size_t at = ints->size();
        ints->resize(at + v.size());  // at most one value per byte
        bool valid;
        const int64_t* last = DecodePackedVarints(v, ints->data() + at, &valid);
        if (!valid) return false;
        const size_t n = static_cast<size_t>(last - (ints->data() + at));
        ints->resize(at + n);
        *count += n;
        continue;
      }
      if (kind == kInt64List && type == wire::kVarint) {
        uint64_t x = 0;
        if (!wire::ReadVarint(p, end, &x)) return false;
        if (ints != nullptr) ints->push_back(static_cast<int64_t>(x));
        ++*count;
        continue;
      }
    }
    if (!wire::SkipField(p, end, field, type, depth + 1)) return false;
  }
  return true;
}

// Calls entry(bytes) for each entry of a map field (field 1 of Features and
// FeatureLists), skipping other fields as protobuf would; false when the
// message is malformed or `entry` returns false.
template <typename EntryFn>
bool ForEachMapEntry(std::string_view msg, EntryFn entry) {
  const char* p = msg.data();
  const char* end = p + msg.size();
  while (p < end) {
    uint32_t field = 0, type = 0;
    if (!wire::ReadTag(p, end, &field, &type)) return false;
    if (field == 1 && type == wire::kLengthDelimited) {
      std::string_view bytes;
      if (!wire::ReadLengthDelimited(p, end, &bytes) || !entry(bytes)) {
        return false;
      }
      continue;
    }
    if (!wire::SkipField(p, end, field, type, 2)) return false;
  }
  return true;
}

// A map entry as every serializer lays it out: the key (field 1, with a
// one-byte length), then one Feature (field 2) filling the entry, holding
// one list (field `kind`: kBytesList, kFloatList or kInt64List) filling
// the Feature.
struct UsualEntry {
  std::string_view key;
  int kind = 0;
  std::string_view list;
};

// Splits `msg` (a map entry's bytes) into *out; false when it is laid out
// otherwise or cut short (then the general path decides).
inline bool SplitUsualEntry(std::string_view msg, UsualEntry* out) {
  const char* p = msg.data();
  const char* const end = p + msg.size();
  // Field 1, length-delimited, with a one-byte length.
  if (end - p < 2 || p[0] != 0x0a || static_cast<uint8_t>(p[1]) >= 0x80) {
    return false;
  }
  const size_t key_size = static_cast<uint8_t>(p[1]);
  p += 2;
  // Then field 2, length-delimited, running to the entry's end.
  if (static_cast<size_t>(end - p) < key_size + 1 || p[key_size] != 0x12) {
    return false;
  }
  out->key = std::string_view(p, key_size);
  p += key_size + 1;
  std::string_view feature;
  if (!wire::ReadLengthDelimited(p, end, &feature) || p != end) return false;
  // The Feature: one of its three lists, running to its end.
  const char* q = feature.data();
  const char* const fend = q + feature.size();
  if (fend - q < 1) return false;
  out->kind = static_cast<uint8_t>(*q) >> 3;
  if ((*q & 7) != wire::kLengthDelimited || out->kind < kBytesList ||
      out->kind > kInt64List) {
    return false;
  }
  ++q;
  return wire::ReadLengthDelimited(q, fend, &out->list) && q == fend;
}

// The values of a list as serializers write it: one length-delimited
// field 1 (a value, or a packed run) filling the list.
inline bool UsualRun(std::string_view list, std::string_view* run) {
  const char* p = list.data();
  const char* const end = p + list.size();
  if (p == end || *p != 0x0a) return false;
  ++p;
  return wire::ReadLengthDelimited(p, end, run) && p == end;
}

// One varint filling `run`.
inline bool OneVarint(std::string_view run, uint64_t* v) {
  const char* q = run.data();
  const char* const end = q + run.size();
  return wire::ReadVarint(q, end, v) && q == end;
}

// A map entry's key (field 1; the last occurrence wins, and every one must
// be UTF-8, as protobuf checks each) and the occurrences of its value
// (field 2, to be merged in order by the caller).
bool SplitMapEntry(std::string_view msg, std::string_view* key,
                   std::vector<std::string_view>* values) {
  *key = {};
  values->clear();
  const char* p = msg.data();
  const char* end = p + msg.size();
  while (p < end) {
    uint32_t field = 0, type = 0;
    if (!wire::ReadTag(p, end, &field, &type)) return false;
    if (type == wire::kLengthDelimited && (field == 1 || field == 2)) {
      std::string_view v;
      if (!wire::ReadLengthDelimited(p, end, &v)) return false;
      if (field == 1) {
        if (!wire::IsValidUtf8(v)) return false;
        *key = v;
      } else {
        values->push_back(v);
      }
      continue;
    }
    if (!wire::SkipField(p, end, field, type, 3)) return false;
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
  // Int64 values already decoded into Scratch::ints (when decoded).
  bool decoded = false;
  size_t first_int = 0;
};
static_assert(std::is_trivially_copyable_v<Slot>);  // LayoutMemo copies them

// A sequence feature in one example: its steps in Scratch::steps.
struct SequenceSlot {
  bool present = false;
  uint32_t first_step = 0;
  uint32_t num_steps = 0;
};

// Per-thread working memory, reused across examples.
struct Scratch {
  std::vector<Slot> slots;
  AlignedVector<int64_t> ints;  // decoded int64 values, see Slot
  std::vector<SequenceSlot> sequence_slots;
  std::vector<Slot> steps;                    // referenced by sequence_slots
  std::vector<std::string_view> lists;        // referenced by slots
  std::vector<std::string_view> entry_lists;  // the entry being parsed
  std::vector<std::string_view> entry_values;
};

class ExampleDecoder {
  struct Entry;  // a slot of the name table, below

 public:
  // Builds an open-addressing table from names to spec indexes, four
  // slots per feature.
  explicit ExampleDecoder(const FeatureSpec& spec) : spec_(spec) {
    size_t size = 16;
    while (size < 4 * spec.features.size()) size *= 2;
    table_.assign(size, Entry{});
    shift_ = 64 - std::countr_zero(size);
    for (size_t i = 0; i < spec.features.size(); ++i) {
      const Words w = WordsOf(spec.features[i].first);
      size_t slot = Mix(w) >> shift_;
      while (table_[slot].index >= 0) slot = (slot + 1) & (size - 1);
      table_[slot] = {w, static_cast<int>(i),
                      spec.features[i].second.dtype == DType::kInt64,
                      wire::IsValidUtf8(spec.features[i].first)};
    }
  }

  const FeatureSpec& spec() const { return spec_; }

  // Whether the values of an int64 list under `key` are decoded into
  // Scratch::ints (the spec names the key, with dtype int64).
  bool DecodesInts(std::string_view key) const {
    const Entry* e = Find(key);
    return e != nullptr && e->int64;
  }

  // Fills scratch->slots for one serialized Example; false if protobuf
  // would not parse it.
  bool Decode(std::string_view example, Scratch* s) const {
    s->slots.assign(spec_.features.size(), Slot{});
    s->lists.clear();
    s->ints.clear();
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

  // A Features message (Example.features, SequenceExample.context) into
  // s->slots, which the caller has reset.
  bool DecodeFeatures(std::string_view msg, Scratch* s) const {
    return ForEachMapEntry(
        msg, [&](std::string_view entry) { return DecodeEntry(entry, s); });
  }

  // A FeatureLists message (SequenceExample.feature_lists) into
  // s->sequence_slots and s->steps, which the caller has reset.  This
  // decoder's spec is the sequence spec.
  bool DecodeFeatureLists(std::string_view msg, Scratch* s) const {
    return ForEachMapEntry(
        msg, [&](std::string_view entry) { return DecodeListEntry(entry, s); });
  }

 private:
  // A feature_list map entry: key, and FeatureList messages whose Feature
  // elements (one per step) concatenate.
  bool DecodeListEntry(std::string_view msg, Scratch* s) const {
    std::string_view key;
    if (!SplitMapEntry(msg, &key, &s->entry_values)) return false;
    const int index = IndexOf(key);
    const uint32_t first_step = static_cast<uint32_t>(s->steps.size());
    for (std::string_view list : s->entry_values) {
      const char* q = list.data();
      const char* qend = q + list.size();
      while (q < qend) {
        uint32_t field = 0, type = 0;
        if (!wire::ReadTag(q, qend, &field, &type)) return false;
        if (field == 1 && type == wire::kLengthDelimited) {
          std::string_view feature;
          if (!wire::ReadLengthDelimited(q, qend, &feature)) return false;
          int kind = kMissing;
          size_t count = 0;
          s->entry_lists.clear();
          if (!MergeFeature(feature, &kind, &count, s, kFeatureDepth + 1)) {
            return false;
          }
          if (index >= 0) {
            s->steps.push_back({kind, static_cast<uint32_t>(s->lists.size()),
                                static_cast<uint32_t>(s->entry_lists.size()),
                                count});
            s->lists.insert(s->lists.end(), s->entry_lists.begin(),
                            s->entry_lists.end());
          }
          continue;
        }
        if (!wire::SkipField(q, qend, field, type, 4)) return false;
      }
    }
    if (index >= 0) {
      s->sequence_slots[static_cast<size_t>(index)] = {
          true, first_step,
          static_cast<uint32_t>(s->steps.size()) - first_step};
    }
    return true;
  }

  // A map entry: key (field 1, last wins) and value (field 2, Feature
  // messages merged in order).  As protobuf, a map entry replaces any
  // earlier entry with the same key.
  bool DecodeEntry(std::string_view msg, Scratch* s) const {
    if (DecodeUsualEntry(msg, s)) return true;
    return DecodeAnyEntry(msg, s);
  }

  // The layout every serializer writes: one key, then one Feature holding
  // one list, nothing else; key, value and list lengths are read exactly
  // as below.  Decodes it as DecodeAnyEntry would, without gathering
  // values and lists (most of a small feature's cost), and returns true;
  // false when the entry is laid out otherwise or not valid, and then
  // nothing has been recorded (the general path decides).
  bool DecodeUsualEntry(std::string_view msg, Scratch* s) const {
    UsualEntry entry;
    if (!SplitUsualEntry(msg, &entry)) return false;
    const Entry* found = Find(entry.key);
    if (found == nullptr ? !wire::IsValidUtf8(entry.key)
                         : !found->name_is_utf8) {
      return false;
    }
    const bool decode =
        found != nullptr && found->int64 && entry.kind == kInt64List;
    const size_t first_int = s->ints.size();
    size_t count = 0;
    if (!UsualList(entry.kind, entry.list, &count,
                   decode ? &s->ints : nullptr) &&
        !ValidateList(entry.kind, entry.list, &count, kListDepth,
                      decode ? &s->ints : nullptr)) {
      s->ints.resize(first_int);
      return false;
    }
    if (found == nullptr) return true;
    Slot& slot = s->slots[static_cast<size_t>(found->index)];
    slot.kind = entry.kind;
    slot.count = count;
    slot.decoded = decode;
    slot.first_int = first_int;
    slot.first_list = static_cast<uint32_t>(s->lists.size());
    slot.num_lists = 1;
    s->lists.push_back(entry.list);
    return true;
  }

  // A list as serializers write it: one length-delimited field 1 (a value,
  // or a packed run) filling the list; for int64, a single varint.
  // Counts (and decodes into `ints`) its values as ValidateList would and
  // returns true; false when the list is laid out otherwise, having
  // changed nothing (ValidateList then decides).
  static bool UsualList(int kind, std::string_view list, size_t* count,
                        AlignedVector<int64_t>* ints) {
    std::string_view run;
    if (!UsualRun(list, &run)) return false;
    switch (kind) {
      case kBytesList:
        *count = 1;
        return true;
      case kFloatList:
        if (run.size() % 4 != 0) return false;
        *count = run.size() / 4;
        return true;
      case kInt64List: {  // one varint filling the run
        uint64_t v = 0;
        if (!OneVarint(run, &v)) return false;
        if (ints != nullptr) ints->push_back(static_cast<int64_t>(v));
        *count = 1;
        return true;
      }
    }
    return false;
  }

  // Any map entry, as protobuf merges its fields.
  bool DecodeAnyEntry(std::string_view msg, Scratch* s) const {
    std::string_view key;
    if (!SplitMapEntry(msg, &key, &s->entry_values)) return false;
    const int index = IndexOf(key);
    AlignedVector<int64_t>* ints =
        index >= 0 && spec_.features[static_cast<size_t>(index)].second.dtype ==
                          DType::kInt64
            ? &s->ints
            : nullptr;
    int kind = kMissing;
    size_t count = 0;
    s->entry_lists.clear();
    for (std::string_view value : s->entry_values) {
      if (!MergeFeature(value, &kind, &count, s, kFeatureDepth, ints)) {
        return false;
      }
    }
    if (index < 0) return true;
    Slot& slot = s->slots[index];
    slot.kind = kind;
    slot.count = count;
    slot.decoded = ints != nullptr && kind == kInt64List;
    slot.first_int = s->ints.size() - (slot.decoded ? count : 0);
    slot.first_list = static_cast<uint32_t>(s->lists.size());
    slot.num_lists = static_cast<uint32_t>(s->entry_lists.size());
    s->lists.insert(s->lists.end(), s->entry_lists.begin(),
                    s->entry_lists.end());
    return true;
  }

  // A Feature message merged into what the entry holds so far: the same
  // list kind again appends; another kind replaces (a oneof).
  bool MergeFeature(std::string_view msg, int* kind, size_t* count, Scratch* s,
                    int depth, AlignedVector<int64_t>* ints = nullptr) const {
    // Values decoded for this entry start here; a change of kind drops them.
    const size_t first_int =
        ints != nullptr ? ints->size() - (*kind == kInt64List ? *count : 0) : 0;
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
          if (ints != nullptr) ints->resize(first_int);
        }
        if (!ValidateList(k, list, count, depth + 1,
                          k == kInt64List ? ints : nullptr)) {
          return false;
        }
        s->entry_lists.push_back(list);
        continue;
      }
      if (!wire::SkipField(p, end, field, type, depth + 1)) return false;
    }
    return true;
  }

  int IndexOf(std::string_view key) const {
    const Entry* e = Find(key);
    return e == nullptr ? -1 : e->index;
  }

  // The table slot of `key`, or null when the spec does not name it.
  const Entry* Find(std::string_view key) const {
    const Words w = WordsOf(key);
    size_t slot = Mix(w) >> shift_;
    while (table_[slot].index >= 0) {
      const Entry& e = table_[slot];
      // Up to 16 bytes, the words are the whole key: no name is read.
      if (e.words.head == w.head && e.words.tail == w.tail &&
          e.words.size == w.size &&
          (w.size <= 16 ||
           std::memcmp(
               spec_.features[static_cast<size_t>(e.index)].first.data(),
               key.data(), w.size) == 0)) {
        return &e;
      }
      slot = (slot + 1) & (table_.size() - 1);
    }
    return nullptr;
  }

  // A feature name's length and up to its first and last eight bytes:
  // for names of up to 16 bytes, the name itself.
  // Fixed-size loads only: a memcpy of a variable length (up to 8 bytes)
  // became a library call whose byte stores the following 8-byte load
  // could not forward, 22% of a tabular pipeline's parse samples.
  struct Words {
    uint64_t head = 0, tail = 0;
    size_t size = 0;
  };
  static Words WordsOf(std::string_view k) {
    const char* p = k.data();
    Words w;
    const size_t n = w.size = k.size();
    if (n >= 8) {
      std::memcpy(&w.head, p, 8);
      if (n > 8) {
        std::memcpy(&w.tail, p + n - 8, 8);
        if (n < 16) w.tail >>= 8 * (16 - n);  // the bytes after the head
      }
    } else if (n >= 4) {
      uint32_t a, b;
      std::memcpy(&a, p, 4);
      std::memcpy(&b, p + n - 4, 4);
      w.head = a | (uint64_t{b} << 32);
    } else if (n > 0) {
      w.head = uint64_t{static_cast<uint8_t>(p[0])} |
               uint64_t{static_cast<uint8_t>(p[n / 2])} << 8 |
               uint64_t{static_cast<uint8_t>(p[n - 1])} << 16;
    }
    return w;
  }
  // A cheap hash of the words, multiplied so that every input bit reaches
  // the top bits, which index the table (Fibonacci hashing).
  static uint64_t Mix(const Words& w) {
    return (w.head ^ (w.tail * 0xc2b2ae3d27d4eb4fULL + w.size)) *
           0x9e3779b97f4a7c15ULL;
  }

  // A table slot: a spec feature's name (as words) and what decoding it
  // needs, so that a lookup reads no more than its slot.
  struct Entry {
    Words words;
    int index = -1;             // into spec_.features; -1: an empty slot
    bool int64 = false;         // the spec's dtype is int64
    bool name_is_utf8 = false;  // the name is valid UTF-8
  };

  const FeatureSpec& spec_;
  std::vector<Entry> table_;
  int shift_ = 0;  // 64 - log2(table size): the top bits of a hash
};

// Whether n bytes at a and at b are the same: fixed-size loads (a memcmp
// call per run of a few bytes would cost more than the compare).
inline bool SameBytes(const char* a, const char* b, size_t n) {
  if (n >= 8) {
    uint64_t x, y;
    for (size_t k = 0; k + 8 < n; k += 8) {
      std::memcpy(&x, a + k, 8);
      std::memcpy(&y, b + k, 8);
      if (x != y) return false;
    }
    std::memcpy(&x, a + n - 8, 8);  // the last eight, overlapping
    std::memcpy(&y, b + n - 8, 8);
    return x == y;
  }
  if (n >= 4) {
    uint32_t x0, y0, x1, y1;
    std::memcpy(&x0, a, 4);
    std::memcpy(&y0, b, 4);
    std::memcpy(&x1, a + n - 4, 4);
    std::memcpy(&y1, b + n - 4, 4);
    return x0 == y0 && x1 == y1;
  }
  for (size_t k = 0; k < n; ++k) {
    if (a[k] != b[k]) return false;
  }
  return true;
}

// The layout of an Example the decoder accepted, to decode the next ones
// laid out alike without walking them.  A dataset's Examples are most
// often laid out alike: the same features in the same order, each value
// the same size (images of one shape, labels of one varint length), only
// the values' bytes differing.  An Example of the same size whose bytes
// around the values (tags, lengths, keys) are the same, and whose int64
// runs hold valid varints of the same count, decodes to the same slots
// and lists, moved to its own bytes, with its own int64 values: Apply
// gives exactly that.  Bytes and float values are not looked at by the
// decoder either (their sizes are in the bytes compared).  Any other
// Example (another size, a byte around the values changed, an int64 run
// that is not what it was) is left to the decoder, which stays the only
// judge of what protobuf accepts.  Learn takes only the layout every
// serializer writes (SplitUsualEntry's, UsualRun's), nothing else in the
// Example.  Where every feature of the spec is in the Example learned, as
// the spec takes it, the memo also keeps where each value sits, and
// FillRow writes an accepted Example's row from there, as FillFeatures
// would from its slots (on Fashion-MNIST's Examples, 1.3x the parse's
// Examples/s on one thread; docs/PERFORMANCE.md).  Not thread-safe: one
// per thread, as Scratch.
class LayoutMemo {
 public:
  // Decodes `example` into s as ExampleDecoder::Decode would, when it is
  // laid out as the Example learned; false (s then holds nothing of
  // use) when it is not, or nothing was learned.
  // With `slots` false, only s->ints is written (FillRow's input).
  bool Apply(std::string_view example, Scratch* s, bool slots = true) const {
    if (size_ == 0 || example.size() != size_) return false;
    const char* const base = example.data();
    for (const Fixed& f : fixed_) {
      if (!SameBytes(base + f.at, fixed_bytes_.data() + f.from, f.size)) {
        return false;
      }
    }
    // Room for the runs' values as DecodePackedVarints writes them (up to
    // one per byte).  The slots (and FillRow) find the values by their
    // index; what lies past them is stale, and s->ints keeps its size from
    // one Example to the next (a resize call each, both ways, cost as much
    // as the int64 features' fill).
    if (s->ints.size() < ints_room_) s->ints.resize(ints_room_);
    int64_t* out = s->ints.data();
    for (const IntRun& r : int_runs_) {
      const std::string_view run(base + r.at, r.size);
      if (r.count == 1) {  // one varint filling the run, as UsualList reads
        uint64_t x = 0;
        if (!OneVarint(run, &x)) return false;
        if (r.decode) *out++ = static_cast<int64_t>(x);
        continue;
      }
      if (!r.decode) {
        size_t count = 0;
        if (!CountPackedVarints(run, &count) || count != r.count) return false;
        continue;
      }
      bool valid;
      int64_t* const last = DecodePackedVarints(run, out, &valid);
      if (!valid || static_cast<size_t>(last - out) != r.count) return false;
      out = last;
    }
    if (!slots) return true;
    s->slots.resize(slots_.size());
    std::memcpy(s->slots.data(), slots_.data(), slots_.size() * sizeof(Slot));
    s->lists.resize(lists_.size());
    for (size_t i = 0; i < lists_.size(); ++i) {
      s->lists[i] = std::string_view(base + lists_[i].first, lists_[i].second);
    }
    return true;
  }

  // Remembers the layout of `example`, which `decoder` has just decoded
  // into s; forgets the last one first.  Examples laid out otherwise than
  // the usual way leave nothing learned.
  void Learn(std::string_view example, const ExampleDecoder& decoder,
             const Scratch& s) {
    size_ = 0;
    fills_.clear();
    fixed_.clear();
    fixed_bytes_.clear();
    int_runs_.clear();
    ints_room_ = 0;
    if (example.empty() || example.size() > (size_t{1} << 31)) return;
    const char* const base = example.data();
    const char* const end = base + example.size();
    const char* p = base;
    std::string_view features;
    // One field 1 (the Features) filling the Example, of entries (field 1)
    // each laid out as SplitUsualEntry and UsualRun take them.
    if (*p++ != 0x0a || !wire::ReadLengthDelimited(p, end, &features) ||
        p != end) {
      return;
    }
    const char* fixed_from = base;
    for (p = features.data(); p < end;) {
      std::string_view bytes, run;
      UsualEntry entry;
      if (*p++ != 0x0a || !wire::ReadLengthDelimited(p, end, &bytes) ||
          !SplitUsualEntry(bytes, &entry) || !UsualRun(entry.list, &run)) {
        return;
      }
      // The run of values: not compared, but for int64 runs checked.
      AddFixed(base, fixed_from, run.data());
      fixed_from = p;
      if (entry.kind == kInt64List) {
        uint64_t x = 0;
        size_t count = 1;
        if (!OneVarint(run, &x) && !CountPackedVarints(run, &count)) return;
        const bool decode = decoder.DecodesInts(entry.key);
        int_runs_.push_back({static_cast<uint32_t>(run.data() - base),
                             static_cast<uint32_t>(run.size()),
                             static_cast<uint32_t>(count), decode});
        if (decode) ints_room_ += count == 1 ? 1 : run.size();
      }
    }
    AddFixed(base, fixed_from, end);
    slots_ = s.slots;
    lists_.clear();
    for (std::string_view list : s.lists) {
      lists_.push_back({static_cast<uint32_t>(list.data() - base),
                        static_cast<uint32_t>(list.size())});
    }
    size_ = example.size();
    LearnRow(example, decoder.spec(), s);
  }

  // Whether FillRow can write the rows of Examples Apply accepts: every
  // feature of the spec was in the Example learned, of its dtype's kind
  // and, FixedLen, of its shape's count (FillFeatures then succeeds for
  // every Example laid out alike, and writes what FillRow writes).
  bool Fills() const { return !fills_.empty(); }

  // Writes the row of `example` (which Apply, with s, accepted) as
  // FillFeatures would, straight from the values' places in the layout:
  // no slots or lists, no walk of a list's fields.  Float and int64
  // FixedLen values go to `fixed` at row i; the rest to `out`.
  void FillRow(std::string_view example, const Scratch& s, size_t i,
               ParsedBatch* out, ParsedBatch* fixed) const {
    const char* const base = example.data();
    for (const RowFill& r : fills_) {
      ParsedFeature& f = out->features[r.feature];
      switch (r.op) {
        case RowFill::kFixedFloats:
          std::memcpy(fixed->features[r.feature].floats.data() + i * r.count,
                      base + r.at, r.size);
          break;
        case RowFill::kFixedInts: {
          int64_t* dst = fixed->features[r.feature].ints.data() + i * r.count;
          if (r.count == 1) {
            *dst = s.ints[r.first_int];
          } else {
            std::memcpy(dst, s.ints.data() + r.first_int,
                        r.count * sizeof(int64_t));
          }
          break;
        }
        case RowFill::kVarFloats: {
          const size_t at = f.floats.size();
          f.floats.resize(at + r.count);
          if (r.size != 0)
            std::memcpy(f.floats.data() + at, base + r.at, r.size);
          f.row_lengths.push_back(r.count);
          break;
        }
        case RowFill::kVarInts: {
          const size_t at = f.ints.size();
          f.ints.resize(at + r.count);
          if (r.count != 0) {
            std::memcpy(f.ints.data() + at, s.ints.data() + r.first_int,
                        r.count * sizeof(int64_t));
          }
          f.row_lengths.push_back(r.count);
          break;
        }
        case RowFill::kBytes:
        case RowFill::kVarBytes:
          f.bytes_data.append(base + r.at, r.size);
          f.bytes_offsets.push_back(f.bytes_data.size());
          if (r.op == RowFill::kVarBytes) f.row_lengths.push_back(1);
          break;
      }
    }
  }

 private:
  void AddFixed(const char* base, const char* from, const char* to) {
    if (from == to) return;
    fixed_.push_back({static_cast<uint32_t>(from - base),
                      static_cast<uint32_t>(to - from),
                      static_cast<uint32_t>(fixed_bytes_.size())});
    fixed_bytes_.append(from, to);
  }

  // FillRow's plan, from the Example learned (decoded into s): one entry
  // per spec feature; none when any feature would not fill as FillRow
  // fills (missing, of another kind or count: the general path writes the
  // default or the error), or the spec has none.
  void LearnRow(std::string_view example, const FeatureSpec& spec,
                const Scratch& s) {
    std::vector<RowFill> fills;
    for (size_t d = 0; d < spec.features.size(); ++d) {
      const FeatureConfig& c = spec.features[d].second;
      const Slot& slot = s.slots[d];
      const bool is_fixed = c.kind == FeatureConfig::Kind::kFixed;
      // (An Example of another kind or count fails FillFeatures too, which
      // ends its range before any Example meets the plan; checked here
      // all the same, so that the plan's contract stands on its own.)
      if (slot.kind == kMissing || slot.kind != KindOf(c.dtype) ||
          slot.num_lists != 1 ||
          (is_fixed && slot.count != static_cast<size_t>(c.num_elements()))) {
        return;
      }
      // The list's one run of values (UsualRun's): packed floats, one
      // bytes value, or int64 varints (decoded into s.ints).
      std::string_view run;
      if (!UsualRun(s.lists[slot.first_list], &run)) return;
      RowFill r;
      r.feature = static_cast<uint32_t>(d);
      r.at = static_cast<uint32_t>(run.data() - example.data());
      r.size = static_cast<uint32_t>(run.size());
      r.count = static_cast<uint32_t>(slot.count);
      r.first_int = static_cast<uint32_t>(slot.first_int);
      switch (c.dtype) {
        case DType::kFloat32:
          if (run.size() != slot.count * 4) return;
          r.op = is_fixed ? RowFill::kFixedFloats : RowFill::kVarFloats;
          break;
        case DType::kInt64:
          if (!slot.decoded) return;
          r.op = is_fixed ? RowFill::kFixedInts : RowFill::kVarInts;
          break;
        case DType::kBytes:
          if (slot.count != 1) return;
          r.op = is_fixed ? RowFill::kBytes : RowFill::kVarBytes;
          break;
        default:
          return;
      }
      fills.push_back(r);
    }
    fills_ = std::move(fills);
  }

  // One feature of FillRow's plan.
  struct RowFill {
    enum Op : uint8_t {
      kFixedFloats,  // the run's bytes into the fixed batch's row
      kFixedInts,    // the decoded ints into the fixed batch's row
      kVarFloats,    // appended, and the row's length
      kVarInts,
      kBytes,     // the one value appended (FixedLen, one element)
      kVarBytes,  // and the row's length (1)
    };
    Op op = kFixedFloats;
    uint32_t feature = 0;    // index in the spec (and the batch)
    uint32_t at = 0;         // the run of values in the Example
    uint32_t size = 0;       // its bytes
    uint32_t count = 0;      // values
    uint32_t first_int = 0;  // int64: where in Scratch::ints
  };

  // Bytes [at, at + size) of the Example are fixed_bytes_[from, ...).
  struct Fixed {
    uint32_t at, size, from;
  };
  // An int64 list's run at [at, at + size): `count` varints, decoded into
  // Scratch::ints when `decode`.
  struct IntRun {
    uint32_t at, size, count;
    bool decode;
  };
  size_t size_ = 0;  // of the Example learned; 0: none
  std::string fixed_bytes_;
  std::vector<Fixed> fixed_;
  std::vector<IntRun> int_runs_;
  size_t ints_room_ = 0;  // the decoded runs' sizes (1 for one varint)
  std::vector<Slot> slots_;
  std::vector<std::pair<uint32_t, uint32_t>> lists_;  // offset, size
  std::vector<RowFill> fills_;  // FillRow's plan; empty: none
};

// Calls value(field_type, p, end) for each field 1 (the values) of the
// list messages `lists`, which ValidateList has accepted; value reads the
// field's value and advances p.  Other fields are skipped.
template <typename ValueFn>
void ForEachValueField(std::span<const std::string_view> lists, ValueFn value) {
  for (std::string_view list : lists) {
    const char* p = list.data();
    const char* end = p + list.size();
    while (p < end) {
      uint32_t field = 0, type = 0;
      wire::ReadTag(p, end, &field, &type);
      if (field != 1 || !value(type, p, end)) {
        wire::SkipField(p, end, field, type, kListDepth + 1);
      }
    }
  }
}

// Append the values of a slot's lists (already validated) to `out`.
void AppendFloats(std::span<const std::string_view> lists, float* out) {
  ForEachValueField(lists, [&](uint32_t type, const char*& p, const char* end) {
    if (type == wire::kLengthDelimited) {  // packed
      std::string_view v;
      wire::ReadLengthDelimited(p, end, &v);
      if (!v.empty()) std::memcpy(out, v.data(), v.size());
      out += v.size() / 4;
      return true;
    }
    if (type == wire::kFixed32) {
      std::memcpy(out++, p, 4);
      p += 4;
      return true;
    }
    return false;
  });
}

void AppendInts(std::span<const std::string_view> lists, int64_t* out) {
  ForEachValueField(lists, [&](uint32_t type, const char*& p, const char* end) {
    if (type == wire::kLengthDelimited) {  // packed
      std::string_view v;
      wire::ReadLengthDelimited(p, end, &v);
      bool valid;  // validated before: always true
      out = DecodePackedVarints(v, out, &valid);
      return true;
    }
    if (type == wire::kVarint) {
      uint64_t x = 0;
      wire::ReadVarint(p, end, &x);
      *out++ = static_cast<int64_t>(x);
      return true;
    }
    return false;
  });
}

void AppendBytes(std::span<const std::string_view> lists, ParsedFeature* f) {
  ForEachValueField(lists, [&](uint32_t type, const char*& p, const char* end) {
    if (type != wire::kLengthDelimited) return false;
    std::string_view v;
    wire::ReadLengthDelimited(p, end, &v);
    f->bytes_data.append(v);
    f->bytes_offsets.push_back(f->bytes_data.size());
    return true;
  });
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

// Clears `out`'s features for a batch of `n` examples; FixedLen numeric
// outputs are sized (every example's values are then written in place).
void ResetOutputs(size_t n, ParsedBatch* out, bool sized = true) {
  out->batch_size = static_cast<int64_t>(n);
  for (ParsedFeature& f : out->features) {
    const FeatureConfig& c = f.config;
    f.floats.clear();
    f.ints.clear();
    f.bytes_data.clear();
    f.bytes_offsets.assign(1, 0);
    f.row_lengths.clear();
    f.step_lengths.clear();
    if (sized && c.kind == FeatureConfig::Kind::kFixed) {
      const size_t total = n * static_cast<size_t>(c.num_elements());
      if (c.dtype == DType::kFloat32) f.floats.resize(total);
      if (c.dtype == DType::kInt64) f.ints.resize(total);
      // A fresh batch (the pipeline hands each one downstream) would
      // otherwise grow its offsets by doubling.
      if (c.dtype == DType::kBytes) f.bytes_offsets.reserve(total + 1);
    }
    if (c.kind == FeatureConfig::Kind::kVar) f.row_lengths.reserve(n);
  }
}

// Appends the values of `lists` (`count` of them) to `f` at the end.
void AppendValues(std::span<const std::string_view> lists, size_t count,
                  ParsedFeature* f) {
  switch (f->config.dtype) {
    case DType::kFloat32: {
      const size_t at = f->floats.size();
      f->floats.resize(at + count);
      AppendFloats(lists, f->floats.data() + at);
      break;
    }
    case DType::kInt64: {
      const size_t at = f->ints.size();
      f->ints.resize(at + count);
      AppendInts(lists, f->ints.data() + at);
      break;
    }
    case DType::kBytes:
      AppendBytes(lists, f);
      break;
    default:  // not an Example dtype: ExampleParser refuses such a spec
      break;
  }
}

std::string DataTypeError(const std::string& key, size_t index, int kind,
                          DType want) {
  return fmt::format(
      "Key: {}, Index: {}.  Data types don't match. Data type: {} but "
      "expected type: {}",
      key, index, KindName(kind), TensorFlowDTypeName(want));
}

std::string CountError(const std::string& key, size_t index,
                       const FeatureConfig& c, size_t count) {
  return fmt::format(
      "Key: {}, Index: {}.  Number of {} values != expected.  Values size: "
      "{} but output shape: {}",
      key, index, ValuesName(c.dtype), count, ShapeString(c.shape));
}

// Writes example i's features (decoded into s.slots) into `out`; `index`
// is its index in the whole batch.  Float and int64 FixedLen values go to
// `fixed` (sized for the whole batch) at example `index - fixed_base`, so
// that parts of a batch parsed in parallel write them in place.  False,
// with the message, on the first feature that does not fit the spec.
bool FillFeatures(const Scratch& s, size_t index, ParsedBatch* out,
                  ParsedBatch* fixed, size_t fixed_base, std::string* error) {
  const size_t i = index - fixed_base;
  for (size_t d = 0; d < out->features.size(); ++d) {
    ParsedFeature& f = out->features[d];
    ParsedFeature& dense = fixed->features[d];
    const FeatureConfig& c = f.config;
    const Slot& slot = s.slots[d];
    const std::span<const std::string_view> lists(
        s.lists.data() + slot.first_list, slot.num_lists);
    const bool fixed = c.kind == FeatureConfig::Kind::kFixed;
    if (slot.kind == kMissing) {
      if (!fixed) {
        f.row_lengths.push_back(0);
        continue;
      }
      if (!c.default_value) {
        *error = fmt::format(
            "Feature: {} (data type: {}) is required but could not be "
            "found.",
            f.name, TensorFlowDTypeName(c.dtype));
        return false;
      }
      const size_t k = static_cast<size_t>(c.num_elements());
      const DefaultValue& dv = *c.default_value;
      for (size_t j = 0; j < k; ++j) {
        switch (c.dtype) {
          case DType::kFloat32:
            dense.floats[i * k + j] = dv.floats[dv.floats.size() == 1 ? 0 : j];
            break;
          case DType::kInt64:
            dense.ints[i * k + j] = dv.ints[dv.ints.size() == 1 ? 0 : j];
            break;
          case DType::kBytes: {
            const std::string& b = dv.bytes[dv.bytes.size() == 1 ? 0 : j];
            f.bytes_data.append(b);
            f.bytes_offsets.push_back(f.bytes_data.size());
            break;
          }
          default:  // not an Example dtype: ExampleParser refuses such a spec
            break;
        }
      }
      continue;
    }
    if (slot.kind != KindOf(c.dtype)) {
      *error = DataTypeError(f.name, index, slot.kind, c.dtype);
      return false;
    }
    if (fixed && slot.count != static_cast<size_t>(c.num_elements())) {
      *error = CountError(f.name, index, c, slot.count);
      return false;
    }
    if (fixed && c.dtype == DType::kFloat32) {
      AppendFloats(lists, dense.floats.data() + i * slot.count);
    } else if (slot.decoded) {
      int64_t* dst;
      if (fixed) {
        dst = dense.ints.data() + i * slot.count;
      } else {
        // (dense.ints is empty, maybe null, for VarLen features.)
        const size_t at = f.ints.size();
        f.ints.resize(at + slot.count);
        dst = f.ints.data() + at;
      }
      if (slot.count == 1) {  // scalars: a store, not a library call
        *dst = s.ints[slot.first_int];
      } else if (slot.count != 0) {  // memcpy may not be given null pointers
        std::memcpy(dst, s.ints.data() + slot.first_int,
                    slot.count * sizeof(int64_t));
      }
    } else if (fixed && c.dtype == DType::kInt64) {
      AppendInts(lists, dense.ints.data() + i * slot.count);
    } else {
      AppendValues(lists, slot.count, &f);
    }
    if (!fixed) f.row_lengths.push_back(static_cast<int64_t>(slot.count));
  }
  return true;
}

// After the first example of [begin, end): room for every example's bytes
// values, if each is the size of the first's (images of one size are), and
// never more than the examples hold.  Parsed batches are fresh (the
// pipeline hands each one on), and growing a batch's bytes by doubling
// copied them about twice over.
void ReserveBytes(std::span<const std::string_view> serialized, size_t begin,
                  size_t end, ParsedBatch* out) {
  size_t input = 0;
  for (size_t i = begin; i < end; ++i) input += serialized[i].size();
  for (ParsedFeature& f : out->features) {
    if (f.config.dtype != DType::kBytes) continue;
    f.bytes_data.reserve(std::min(f.bytes_data.size() * (end - begin), input));
  }
}

// Examples are often scattered in memory (a shuffle's records come from
// anywhere in the megabytes of blocks it holds): read one after another,
// each would stall on its first lines, one miss at a time.  So the batch
// parsers ask for the lines of the example kPrefetchAhead ahead while
// they decode this one, and the misses of several examples overlap.
// Measured on Fashion-MNIST shuffled (10,000): 1.3-1.5x the records/s of
// the fused pipeline on one thread, against asking for a whole batch's
// lines before parsing it (docs/PERFORMANCE.md); in-cache examples pay a
// few instructions a line.  The first kPrefetchLimit bytes are asked for:
// the hardware's own prefetcher follows a longer example once it is read.
constexpr size_t kPrefetchAhead = 4;
constexpr size_t kPrefetchLimit = 4096;

void PrefetchExample(std::string_view example) {
  const size_t n = std::min(example.size(), kPrefetchLimit);
  for (size_t k = 0; k < n; k += 64) {
    __builtin_prefetch(example.data() + k, 0, 3);
  }
}

// Parses examples [begin, end) of `serialized` into `out`, and their
// float and int64 FixedLen values into `fixed`, sized for the batch (see
// FillFeatures).  Returns the first error's message and its example index
// through `error` / `error_index`, or leaves them empty.
void ParseRange(const FeatureSpec& spec,
                std::span<const std::string_view> serialized, size_t begin,
                size_t end, ParsedBatch* out, ParsedBatch* fixed,
                std::string* error, size_t* error_index) {
  const ExampleDecoder decoder(spec);
  Scratch scratch;
  LayoutMemo memo;
  // A learning pass costs about a decode, and a hit saves most of one.
  // The memo learns from an Example it did not decode while it has
  // learned at most 2 + hits / 8 times, so that Examples laid out each
  // their own way (images of many sizes; keys in a random order, as
  // protobuf's C++ maps serialize them) cost a few passes per range, and
  // the memo of Examples laid out alike pays for itself.
  size_t hits = 0, learned = 0;
  ResetOutputs(end - begin, out, /*sized=*/out == fixed);
  for (size_t index = begin; index < end; ++index) {
    if (index + kPrefetchAhead < end) {
      PrefetchExample(serialized[index + kPrefetchAhead]);
    }
    const std::string_view example = serialized[index];
    const bool fills = memo.Fills();
    bool decoded = memo.Apply(example, &scratch, /*slots=*/!fills);
    if (decoded) {
      ++hits;
      if (fills) {  // (never the range's first: the memo learns in it)
        memo.FillRow(example, scratch, out == fixed ? index - begin : index,
                     out, fixed);
        continue;
      }
    } else if ((decoded = decoder.Decode(example, &scratch)) &&
               learned <= 2 + hits / 8) {
      memo.Learn(example, decoder, scratch);
      ++learned;
    }
    if (!decoded) {
      *error = "Can't parse serialized Example.";
    } else if (FillFeatures(scratch, index, out, fixed,
                            out == fixed ? begin : 0, error)) {
      if (index == begin) ReserveBytes(serialized, begin, end, out);
      continue;
    }
    *error_index = index;
    return;
  }
}

// A serialized SequenceExample into s: context into s->slots, feature
// lists into s->sequence_slots.
bool DecodeSequenceExample(std::string_view msg, const ExampleDecoder& context,
                           const ExampleDecoder& sequence, Scratch* s) {
  s->slots.assign(context.spec().features.size(), Slot{});
  s->sequence_slots.assign(sequence.spec().features.size(), SequenceSlot{});
  s->lists.clear();
  s->ints.clear();
  s->steps.clear();
  const char* p = msg.data();
  const char* end = p + msg.size();
  while (p < end) {
    uint32_t field = 0, type = 0;
    if (!wire::ReadTag(p, end, &field, &type)) return false;
    if ((field == 1 || field == 2) && type == wire::kLengthDelimited) {
      std::string_view v;
      if (!wire::ReadLengthDelimited(p, end, &v)) return false;
      if (!(field == 1 ? context.DecodeFeatures(v, s)
                       : sequence.DecodeFeatureLists(v, s))) {
        return false;
      }
      continue;
    }
    if (!wire::SkipField(p, end, field, type, 1)) return false;
  }
  return true;
}

// Writes example i's feature lists into `out` (see ParsedSequenceBatch).
bool FillSequence(const Scratch& s, size_t index, ParsedBatch* out,
                  std::string* error) {
  for (size_t d = 0; d < out->features.size(); ++d) {
    ParsedFeature& f = out->features[d];
    const FeatureConfig& c = f.config;
    const SequenceSlot& seq = s.sequence_slots[d];
    const bool fixed = c.kind == FeatureConfig::Kind::kFixed;
    for (uint32_t j = 0; j < seq.num_steps; ++j) {
      const Slot& step = s.steps[seq.first_step + j];
      const std::span<const std::string_view> lists(
          s.lists.data() + step.first_list, step.num_lists);
      if (step.kind != kMissing && step.kind != KindOf(c.dtype)) {
        *error = fmt::format(
            "Key: {}, Index: {}, Step: {}.  Data types don't match. Data "
            "type: {} but expected type: {}",
            f.name, index, j, KindName(step.kind),
            TensorFlowDTypeName(c.dtype));
        return false;
      }
      if (fixed && step.count != static_cast<size_t>(c.num_elements())) {
        *error = fmt::format(
            "Key: {}, Index: {}, Step: {}.  Number of {} values != "
            "expected.  Values size: {} but output shape: {}",
            f.name, index, j, ValuesName(c.dtype), step.count,
            ShapeString(c.shape));
        return false;
      }
      AppendValues(lists, step.count, &f);
      if (!fixed) f.step_lengths.push_back(static_cast<int64_t>(step.count));
    }
    f.row_lengths.push_back(seq.present ? seq.num_steps : 0);
  }
  return true;
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
    default:  // not an Example dtype: ExampleParser refuses such a spec
      break;
  }
  return 0;
}

const ParsedFeature& ParsedBatch::feature(std::string_view name) const {
  for (const auto& f : features) {
    if (f.name == name) return f;
  }
  throw std::out_of_range(fmt::format("no feature '{}' in the batch", name));
}

ExampleParser::ExampleParser(FeatureSpec spec) : spec_(std::move(spec)) {
  for (const auto& [name, config] : spec_.features) {
    CheckExampleDType(name, config.dtype);
  }
}

void ExampleParser::ShapeOutput(ParsedBatch* out) const {
  // Outputs from an earlier spec are reshaped; the same spec's are reused.
  bool same = out->features.size() == spec_.features.size();
  for (size_t d = 0; same && d < spec_.features.size(); ++d) {
    same = out->features[d].name == spec_.features[d].first &&
           out->features[d].config.kind == spec_.features[d].second.kind &&
           out->features[d].config.dtype == spec_.features[d].second.dtype &&
           out->features[d].config.shape == spec_.features[d].second.shape;
  }
  if (!same) out->features.clear();
  Shape(spec_, out);
  // Defaults are read from the output's config: keep them the spec's.
  for (size_t d = 0; d < spec_.features.size(); ++d) {
    out->features[d].config.default_value =
        spec_.features[d].second.default_value;
  }
}

void ExampleParser::ParseBatch(std::span<const std::string_view> serialized,
                               ParsedBatch* out, const ParseContext& context,
                               int threads) const {
  ShapeOutput(out);
  const size_t n = serialized.size();
  // A part must be worth a task: at least 64 KiB of input.
  size_t bytes = 0;
  for (std::string_view s : serialized) bytes += s.size();
  const size_t parts =
      std::clamp<size_t>(static_cast<size_t>(std::max(threads, 1)), 1,
                         std::max<size_t>(bytes / kMinPartBytes, 1));
  std::string error;
  size_t error_index = 0;
  if (parts == 1) {
    ParseRange(spec_, serialized, 0, n, out, out, &error, &error_index);
  } else {
    // Float and int64 FixedLen values go straight into `out`; the rest is
    // parsed per part and appended in order.
    ResetOutputs(n, out);
    std::vector<ParsedBatch> results(parts);
    std::vector<std::string> errors(parts);
    std::vector<size_t> error_indexes(parts);
    for (size_t t = 0; t < parts; ++t) Shape(spec_, &results[t]);
    tbb::task_arena arena(
        std::min(static_cast<int>(parts), tbb::info::default_concurrency()));
    // The fork and the join, for ThreadSanitizer (records/tsan.h): static,
    // since a part may read its captures only once it is after the fork
    // (calls at once share them, which may order one call's fork after
    // another's, never two parts of one call).  The parts write disjoint
    // rows and may overlap.  The body is made before the fork: parallel_for
    // runs it by reference, its captures read where they were written.
    static char parts_start, parts_end;
    const auto parse_part = [&](size_t t) {
      HappensAfter(&parts_start);
      ParseRange(spec_, serialized, n * t / parts, n * (t + 1) / parts,
                 &results[t], out, &errors[t], &error_indexes[t]);
      HappensBefore(&parts_end);
    };
    HappensBefore(&parts_start);
    arena.execute([&] { tbb::parallel_for(size_t{0}, parts, parse_part); });
    HappensAfter(&parts_end);
    for (size_t t = 0; t < parts && error.empty(); ++t) {
      if (!errors[t].empty()) {
        error = errors[t];
        error_index = error_indexes[t];
      }
    }
    if (error.empty()) {
      out->batch_size = 0;
      for (size_t t = 0; t < parts; ++t) AppendBatch(results[t], out);
    }
  }
  if (!error.empty()) {
    if (context.file.empty()) throw ParseError(error);
    throw ParseError(fmt::format("{}: record {}: {}", context.file,
                                 context.first_record + error_index, error));
  }
}

SequenceExampleParser::SequenceExampleParser(FeatureSpec context_spec,
                                             FeatureSpec sequence_spec)
    : context_spec_(std::move(context_spec)),
      sequence_spec_(std::move(sequence_spec)) {}

void SequenceExampleParser::ParseBatch(
    std::span<const std::string_view> serialized, ParsedSequenceBatch* out,
    const ParseContext& context) const {
  out->context.features.clear();
  out->sequence.features.clear();
  Shape(context_spec_, &out->context);
  Shape(sequence_spec_, &out->sequence);
  const size_t n = serialized.size();
  ResetOutputs(n, &out->context);
  ResetOutputs(n, &out->sequence, /*sized=*/false);
  out->sequence.batch_size = static_cast<int64_t>(n);
  const ExampleDecoder context_decoder(context_spec_);
  const ExampleDecoder sequence_decoder(sequence_spec_);
  Scratch scratch;
  std::string error;
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) PrefetchExample(serialized[i + kPrefetchAhead]);
    if (!DecodeSequenceExample(serialized[i], context_decoder, sequence_decoder,
                               &scratch)) {
      error = "Can't parse serialized SequenceExample.";
    } else if (FillFeatures(scratch, i, &out->context, &out->context, 0,
                            &error) &&
               FillSequence(scratch, i, &out->sequence, &error)) {
      continue;
    }
    if (context.file.empty()) throw ParseError(error);
    throw ParseError(fmt::format("{}: record {}: {}", context.file,
                                 context.first_record + i, error));
  }
}

}  // namespace recflow::records
