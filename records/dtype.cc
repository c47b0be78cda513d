#include "records/dtype.h"

#include <bit>
#include <iterator>

namespace recflow::records {
namespace {

struct DTypeInfo {
  std::string_view name;             // ours, as in specs and messages
  std::string_view tensorflow_name;  // TensorFlow's, in its messages
};

// Indexed by DType.
constexpr DTypeInfo kInfo[] = {
    {"float32", "float"}, {"float64", "double"}, {"int32", "int32"},
    {"int64", "int64"},   {"uint8", "uint8"},    {"bytes", "string"},
};
constexpr DType kAll[] = {DType::kFloat32, DType::kFloat64, DType::kInt32,
                          DType::kInt64,   DType::kUInt8,   DType::kBytes};
static_assert(std::size(kInfo) == std::size(kAll));

const DTypeInfo* Info(DType d) {
  const auto i = static_cast<size_t>(d);
  return i < std::size(kInfo) ? &kInfo[i] : nullptr;
}

}  // namespace

std::string_view DTypeName(DType d) {
  const DTypeInfo* info = Info(d);
  return info ? info->name : "?";
}

std::string_view TensorFlowDTypeName(DType d) {
  const DTypeInfo* info = Info(d);
  return info ? info->tensorflow_name : "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (DType d : kAll) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

bool IsExampleDType(DType d) {
  return d == DType::kFloat32 || d == DType::kInt64 || d == DType::kBytes;
}

std::optional<DType> ParseExampleDType(std::string_view name) {
  if (name == "float32" || name == "float") return DType::kFloat32;
  if (name == "int64") return DType::kInt64;
  if (name == "bytes" || name == "string") return DType::kBytes;
  return std::nullopt;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400) == 0);
    bits = sign | (uint32_t(112 - e) << 23) | ((mantissa & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace recflow::records
