// FeatureSpec: which features of a tf.train.Example to parse, and into
// what.  The analogue of the dict of tf.io.FixedLenFeature /
// tf.io.VarLenFeature given to tf.io.parse_example.
//
// JSON form (every command that takes --spec):
//   {"features": {"NAME": {"kind": "fixed" | "var",
//                          "dtype": "float32" | "int64" | "bytes",
//                          "shape": [..],        (fixed; [] for a scalar)
//                          "default": ..}}}      (fixed; optional)
#ifndef RECFLOW_RECORDS_FEATURE_SPEC_H_
#define RECFLOW_RECORDS_FEATURE_SPEC_H_

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "records/dtype.h"

namespace recflow::records {

// A default for a FixedLen feature: one value (broadcast to the shape) or
// exactly as many values as the shape has elements, of the feature's dtype.
struct DefaultValue {
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> bytes;
};

struct FeatureConfig {
  enum class Kind { kFixed, kVar };
  Kind kind = Kind::kFixed;
  DType dtype = DType::kFloat32;
  // FixedLen: the shape of one example's value ([] for a scalar).
  std::vector<int64_t> shape;
  // FixedLen: used when the feature is missing; without it the feature is
  // required.
  std::optional<DefaultValue> default_value;

  // Number of values one example holds (FixedLen): the shape's product.
  int64_t num_elements() const;
};

struct FeatureSpec {
  // Sorted by name; names are unique.
  std::vector<std::pair<std::string, FeatureConfig>> features;

  // Adds or replaces a feature (keeps the order sorted).  Throws Error for
  // a dtype an Example cannot hold (IsExampleDType).
  void Add(std::string name, FeatureConfig config);
  const FeatureConfig* Find(std::string_view name) const;

  // Throws Error naming the feature and what is wrong (unknown kind or
  // dtype, negative dimension, a default of the wrong size or type).
  static FeatureSpec FromJson(const nlohmann::json& json);
  static FeatureSpec FromJsonText(std::string_view text);
  static FeatureSpec FromFile(const std::string& path);
  nlohmann::json ToJson() const;
};

// Throws Error naming feature `name` unless IsExampleDType(dtype).
void CheckExampleDType(const std::string& name, DType dtype);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_FEATURE_SPEC_H_
