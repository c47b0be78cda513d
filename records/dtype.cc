#include "records/dtype.h"

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

}  // namespace recflow::records
