#include "records/dtype.h"

namespace recflow::records {

std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
    case DType::kBytes:
      return "bytes";
  }
  return "?";
}

std::string_view TensorFlowDTypeName(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
    case DType::kBytes:
      return "string";
  }
  return "?";
}

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
    case DType::kBytes:
      return 0;
  }
  return 0;
}

std::optional<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt32,
                  DType::kInt64, DType::kUInt8, DType::kBytes}) {
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
