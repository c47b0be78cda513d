// Protocol buffer wire format, the subset tf.train.Example needs, decoded
// with the same acceptance rules as protobuf's own parser (so the fast
// parser rejects exactly what protobuf rejects).  Header-only, no state.
#ifndef RECFLOW_RECORDS_WIRE_FORMAT_H_
#define RECFLOW_RECORDS_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace recflow::records::wire {

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// protobuf's default recursion limit for nested messages and groups.
inline constexpr int kMaxDepth = 100;

// tf.train.Feature's oneof field numbers (feature.proto): the builder writes
// them and the parser uses them as the kind of a parsed feature.
inline constexpr int kBytesList = 1;
inline constexpr int kFloatList = 2;
inline constexpr int kInt64List = 3;

// Reads a varint of at most 10 bytes; false when truncated or longer.
inline bool ReadVarint(const char*& p, const char* end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p == end) return false;
    const uint8_t byte = static_cast<uint8_t>(*p++);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (byte < 0x80) {
      *out = v;
      return true;
    }
  }
  return false;
}

// A field tag: field number and wire type.  As protobuf reads tags: at most
// five bytes, bits past 32 dropped, field number 0 refused.
inline bool ReadTag(const char*& p, const char* end, uint32_t* field,
                    uint32_t* wire_type) {
  uint32_t tag = 0;
  for (int i = 0;; ++i) {
    if (i == 5 || p == end) return false;
    const uint8_t byte = static_cast<uint8_t>(*p++);
    tag |= static_cast<uint32_t>(byte & 0x7f) << (7 * i);
    if (byte < 0x80) break;
  }
  *field = tag >> 3;
  *wire_type = tag & 7;
  return *field != 0;
}

// The length of a length-delimited field, as protobuf reads it: at most
// five bytes and under 2 GiB (less protobuf's 16 bytes of slop).
inline bool ReadSize(const char*& p, const char* end, uint32_t* size) {
  uint32_t v = 0;
  for (int i = 0;; ++i) {
    if (i == 5 || p == end) return false;
    const uint8_t byte = static_cast<uint8_t>(*p++);
    if (i == 4 && byte >= 8) return false;
    v |= static_cast<uint32_t>(byte & 0x7f) << (7 * i);
    if (byte < 0x80) break;
  }
  if (v > 0x7fffffffu - 16) return false;
  *size = v;
  return true;
}

// A length-delimited payload; false when it runs past `end`.
inline bool ReadLengthDelimited(const char*& p, const char* end,
                                std::string_view* out) {
  uint32_t n;
  if (!ReadSize(p, end, &n) || n > static_cast<uint64_t>(end - p)) {
    return false;
  }
  *out = std::string_view(p, n);
  p += n;
  return true;
}

// Skips the value of a field whose tag was just read (unknown fields, and
// known field numbers with an unexpected wire type, which protobuf keeps
// as unknown).  Groups are skipped to their matching end tag.
bool SkipField(const char*& p, const char* end, uint32_t field,
               uint32_t wire_type, int depth);

// True when `s` is valid UTF-8, as proto3 requires of string fields.
bool IsValidUtf8(std::string_view s);
// Appends code point `cp` (below 0x110000) as UTF-8, in as few bytes as
// it takes; a surrogate is encoded as any other (not valid UTF-8).
void AppendUtf8(uint32_t cp, std::string* out);

// Encoding, for writers.
inline void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
inline void PutTag(std::string& out, uint32_t field, WireType type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | type);
}
inline void PutLengthDelimited(std::string& out, uint32_t field,
                               std::string_view bytes) {
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out.append(bytes);
}

}  // namespace recflow::records::wire

#endif  // RECFLOW_RECORDS_WIRE_FORMAT_H_
