#include "records/feature_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <vector>

#include "records/errors.h"
#include "records/json_excerpt.h"

namespace recflow::records {

int64_t FeatureConfig::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void CheckExampleDType(const std::string& name, DType dtype) {
  if (!IsExampleDType(dtype)) {
    throw Error(
        fmt::format("spec: feature '{}': dtype {} is not one an "
                    "Example holds (float32, int64 or bytes)",
                    name, DTypeName(dtype)));
  }
}

void FeatureSpec::Add(std::string name, FeatureConfig config) {
  CheckExampleDType(name, config.dtype);
  auto it = std::lower_bound(
      features.begin(), features.end(), name,
      [](const auto& entry, const std::string& n) { return entry.first < n; });
  if (it != features.end() && it->first == name) {
    it->second = std::move(config);
  } else {
    features.emplace(it, std::move(name), std::move(config));
  }
}

const FeatureConfig* FeatureSpec::Find(std::string_view name) const {
  auto it = std::lower_bound(
      features.begin(), features.end(), name,
      [](const auto& entry, std::string_view n) { return entry.first < n; });
  return it != features.end() && it->first == name ? &it->second : nullptr;
}

namespace {

DefaultValue ParseDefault(const std::string& name, const FeatureConfig& c,
                          const nlohmann::json& j) {
  // The values, viewed in place (a copy of a deeply nested one would
  // recurse as deep).
  const std::span<const nlohmann::json> values =
      j.is_array() ? std::span<const nlohmann::json>(
                         j.get_ref<const nlohmann::json::array_t&>())
                   : std::span<const nlohmann::json>(&j, 1);
  DefaultValue d;
  for (const auto& v : values) {
    switch (c.dtype) {
      case DType::kFloat32: {
        if (!v.is_number()) {
          throw Error(
              fmt::format("spec: feature '{}': default {} is not a "
                          "number",
                          name, JsonExcerpt(v)));
        }
        const double x = v.get<double>();
        if (std::abs(x) > std::numeric_limits<float>::max()) {
          throw Error(
              fmt::format("spec: feature '{}': default {} is beyond "
                          "float32's range",
                          name, JsonExcerpt(v)));
        }
        d.floats.push_back(static_cast<float>(x));
        break;
      }
      case DType::kInt64:
        if (!v.is_number_integer() ||
            (v.is_number_unsigned() &&
             v.get<uint64_t>() >
                 static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
          throw Error(
              fmt::format("spec: feature '{}': default {} is not an "
                          "int64",
                          name, JsonExcerpt(v)));
        }
        d.ints.push_back(v.get<int64_t>());
        break;
      case DType::kBytes:
        if (!v.is_string()) {
          throw Error(
              fmt::format("spec: feature '{}': default {} is not a "
                          "string",
                          name, JsonExcerpt(v)));
        }
        d.bytes.push_back(v.get<std::string>());
        break;
      default:  // not an Example dtype: FeatureSpec::Add refuses it
        break;
    }
  }
  const size_t n = values.size();
  if (n != 1 && static_cast<int64_t>(n) != c.num_elements()) {
    throw Error(
        fmt::format("spec: feature '{}': default has {} values; the "
                    "shape needs {} (or give one value)",
                    name, n, c.num_elements()));
  }
  return d;
}

}  // namespace

FeatureSpec FeatureSpec::FromJson(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("features") ||
      !json["features"].is_object()) {
    throw Error("spec: expected {\"features\": {\"NAME\": {...}, ...}}");
  }
  FeatureSpec spec;
  for (const auto& [name, j] : json["features"].items()) {
    if (!j.is_object()) {
      throw Error(fmt::format("spec: feature '{}': expected an object", name));
    }
    FeatureConfig c;
    // Viewed in place, not copied (as `values` in ParseDefault).
    const nlohmann::json fixed = "fixed";
    const auto given = j.find("kind");
    const nlohmann::json* kind = given != j.end() ? &*given : &fixed;
    if (*kind == "fixed") {
      c.kind = FeatureConfig::Kind::kFixed;
    } else if (*kind == "var") {
      c.kind = FeatureConfig::Kind::kVar;
    } else {
      throw Error(
          fmt::format("spec: feature '{}': kind {}: expected "
                      "\"fixed\" or \"var\"",
                      name, JsonExcerpt(*kind)));
    }
    if (!j.contains("dtype") || !j["dtype"].is_string()) {
      throw Error(
          fmt::format("spec: feature '{}': needs a dtype (float32, "
                      "int64 or bytes)",
                      name));
    }
    const auto dtype = ParseExampleDType(j["dtype"].get<std::string>());
    if (!dtype) {
      throw Error(
          fmt::format("spec: feature '{}': dtype '{}': expected "
                      "float32, int64 or bytes",
                      name, j["dtype"].get<std::string>()));
    }
    c.dtype = *dtype;
    if (j.contains("shape")) {
      if (c.kind == FeatureConfig::Kind::kVar) {
        throw Error(
            fmt::format("spec: feature '{}': a var feature has no "
                        "shape",
                        name));
      }
      const nlohmann::json& shape = j["shape"];
      // A serialized Example is under 2 GiB (protobuf's limit), so no
      // feature of one holds 2^31 values or more.
      constexpr uint64_t kMaxValues = uint64_t{1} << 31;
      uint64_t values = 1;
      const auto dim = [&](const nlohmann::json& d) {
        if (!d.is_number_integer()) return false;
        if (!d.is_number_unsigned() && d.get<int64_t>() < 0) return false;
        // Both factors at most 2^31: the product cannot overflow.
        values = std::min(values * std::min(d.get<uint64_t>(), kMaxValues),
                          kMaxValues);
        return true;
      };
      if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), dim)) {
        throw Error(
            fmt::format("spec: feature '{}': shape {}: expected a list of "
                        "non-negative integers",
                        name, JsonExcerpt(shape)));
      }
      if (values >= kMaxValues) {
        throw Error(
            fmt::format("spec: feature '{}': shape {} holds 2^31 values or "
                        "more, which no Example can (protobuf's 2 GiB)",
                        name, JsonExcerpt(shape)));
      }
      for (const auto& d : shape) c.shape.push_back(d.get<int64_t>());
    }
    if (j.contains("default")) {
      if (c.kind == FeatureConfig::Kind::kVar) {
        throw Error(
            fmt::format("spec: feature '{}': a var feature has no "
                        "default",
                        name));
      }
      c.default_value = ParseDefault(name, c, j["default"]);
    }
    spec.Add(name, std::move(c));
  }
  return spec;
}

FeatureSpec FeatureSpec::FromJsonText(std::string_view text) {
  nlohmann::json j;
  // The keys of each object open at the parse's point: a key given twice
  // (a feature, or a setting of one) would keep only its last value.
  std::vector<std::set<std::string>> open;
  std::optional<std::string> twice;
  const auto check = [&](int, nlohmann::json::parse_event_t event,
                         nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      open.emplace_back();
    } else if (event == Event::object_end) {
      open.pop_back();
    } else if (event == Event::key && !twice &&
               !open.back().insert(parsed.get<std::string>()).second) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  try {
    j = nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("spec: not valid JSON: {}", e.what()));
  }
  if (twice) {
    throw Error(fmt::format(
        "spec: key \"{}\" appears twice in one object; JSON keeps the last "
        "value, so the first would be ignored",
        *twice));
  }
  return FromJson(j);
}

FeatureSpec FeatureSpec::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(path, "cannot open the spec file");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return FromJsonText(ss.str());
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
}

nlohmann::json FeatureSpec::ToJson() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, c] : features) {
    nlohmann::json f = {
        {"kind", c.kind == FeatureConfig::Kind::kFixed ? "fixed" : "var"},
        {"dtype", DTypeName(c.dtype)}};
    if (c.kind == FeatureConfig::Kind::kFixed) f["shape"] = c.shape;
    if (c.default_value) {
      const DefaultValue& d = *c.default_value;
      nlohmann::json values = nlohmann::json::array();
      for (float v : d.floats) values.push_back(v);
      for (int64_t v : d.ints) values.push_back(v);
      for (const auto& v : d.bytes) values.push_back(v);
      f["default"] = values.size() == 1 ? values[0] : values;
    }
    out[name] = f;
  }
  return {{"features", out}};
}

}  // namespace recflow::records
