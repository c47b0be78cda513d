// The element types of recflow's values, one enum for every layer: the
// dtypes a FeatureSpec asks an Example for (float32, int64, bytes: the
// three lists a tf.train.Feature holds) and those a pipeline Tensor holds
// (those three and float64, int32, uint8, from NumPy arrays, decoded
// images and casts).  pipeline::DType is this type.
#ifndef RECFLOW_RECORDS_DTYPE_H_
#define RECFLOW_RECORDS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace recflow::records {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kInt32,
  kInt64,
  kUInt8,
  kBytes
};

// "float32", "float64", "int32", "int64", "uint8", "bytes".
std::string_view DTypeName(DType d);
// TensorFlow's names in its error messages: "float", "double", "int32",
// "int64", "uint8", "string".
std::string_view TensorFlowDTypeName(DType d);
// Bytes per element; 0 for kBytes.  Inline: tensors ask it per slice.
constexpr size_t DTypeSize(DType d) {
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
      break;
  }
  return 0;
}
// The dtype DTypeName gives `name`; nullopt for any other name.
std::optional<DType> ParseDType(std::string_view name);
// Whether a tf.train.Feature holds values of this type: float32 (its
// FloatList), int64 (Int64List) or bytes (BytesList).
bool IsExampleDType(DType d);
// A feature spec's dtype: "float32" or "float", "int64", "bytes" or
// "string" (TensorFlow's names are accepted too); nullopt otherwise.
std::optional<DType> ParseExampleDType(std::string_view name);

// IEEE 754 half-precision bits as a float: exact for every half
// (subnormals, infinities and NaN too).  For .npy float16 arrays and
// TensorBoard's DT_HALF tensors.
float HalfToFloat(uint16_t h);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_DTYPE_H_
