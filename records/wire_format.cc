#include "records/wire_format.h"

#include <cstring>

namespace recflow::records::wire {

bool SkipField(const char*& p, const char* end, uint32_t field,
               uint32_t wire_type, int depth) {
  switch (wire_type) {
    case kVarint: {
      uint64_t v;
      return ReadVarint(p, end, &v);
    }
    case kFixed64:
      if (end - p < 8) return false;
      p += 8;
      return true;
    case kLengthDelimited: {
      std::string_view s;
      return ReadLengthDelimited(p, end, &s);
    }
    case kFixed32:
      if (end - p < 4) return false;
      p += 4;
      return true;
    case kStartGroup: {
      if (depth >= kMaxDepth) return false;
      while (p < end) {
        uint32_t f, t;
        if (!ReadTag(p, end, &f, &t)) return false;
        if (t == kEndGroup) return f == field;
        if (!SkipField(p, end, f, t, depth + 1)) return false;
      }
      return false;  // no end tag
    }
    default:  // kEndGroup without a group, or wire types 6 and 7
      return false;
  }
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  // Feature names are ASCII: skip eight such bytes at a time.
  while (end - p >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    if (w & 0x8080808080808080ULL) break;
    p += 8;
  }
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    p += n + 1;
  }
  return true;
}

}  // namespace recflow::records::wire
