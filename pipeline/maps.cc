#include "pipeline/maps.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "pipeline/state.h"

namespace recflow::pipeline::maps {
namespace {

// " (FILE: record N at offset O)" for an element read from a file.
std::string Where(const Element& e) {
  const std::optional<Origin> o = e.OriginOf(0);
  if (!o) return "";
  return fmt::format(" ({}{})", e.batch_origins ? "batch starting at " : "",
                     o->ToString());
}

const Tensor& Component(const Element& e, const std::string& key,
                        std::string_view map) {
  const Tensor* t = e.Find(key);
  if (t == nullptr) {
    std::string names;
    for (const auto& c : e.components) {
      names += (names.empty() ? "" : ", ") + c.name;
    }
    throw Error(
        fmt::format("{}: the element has no component '{}' (it has: "
                    "{}){}",
                    map, key, names, Where(e)));
  }
  t->CheckHost(map);
  return *t;
}

template <typename F>
decltype(auto) DispatchNumeric(DType d, F&& f) {
  switch (d) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat64:
      return f(double{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kUInt8:
      return f(uint8_t{});
    case DType::kBytes:
      break;
  }
  throw Error("bytes is not a numeric dtype");
}

// `values` (the flat values of `like`) as a tensor shaped as `like`,
// ragged when it is.
Tensor ShapedLike(const Tensor& like, Tensor values) {
  return like.ragged() ? Tensor::Ragged(std::move(values), like.row_lengths())
                       : values;
}

}  // namespace

MapFn DecodeRaw(std::string key, DType dtype, std::vector<int64_t> shape) {
  if (dtype == DType::kBytes) {
    throw Error("decode_raw: the output dtype must be numeric, not bytes");
  }
  int inferred = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw Error(fmt::format(
          "decode_raw('{}'): dimension {} of the shape is {}; only one "
          "dimension may be -1 (inferred)",
          key, i, shape[i]));
    }
  }
  return [key = std::move(key), dtype, shape = std::move(shape),
          inferred](Element e) {
    const Tensor& t = Component(e, key, "decode_raw");
    if (t.dtype() != DType::kBytes) {
      throw Error(
          fmt::format("decode_raw('{}'): the component is {}, not "
                      "bytes{}",
                      key, DTypeName(t.dtype()), Where(e)));
    }
    if (t.ragged()) {
      throw Error(
          fmt::format("decode_raw('{}'): the component is ragged (a "
                      "VarLen feature); decode_raw needs one bytes "
                      "value per record{}",
                      key, Where(e)));
    }
    Tensor u8;
    try {
      u8 = t.BytesAsUInt8();
    } catch (const Error& error) {
      throw Error(
          fmt::format("decode_raw('{}'): {}{}", key, error.what(), Where(e)));
    }
    const int64_t n = u8.shape()[u8.shape().rank() - 1];
    const size_t size = DTypeSize(dtype);
    if (n % static_cast<int64_t>(size) != 0) {
      throw Error(
          fmt::format("decode_raw('{}'): a value holds {} bytes, not "
                      "a multiple of {}'s {} bytes{}",
                      key, n, DTypeName(dtype), size, Where(e)));
    }
    const int64_t count = n / static_cast<int64_t>(size);
    std::vector<int64_t> each =
        shape.empty() ? std::vector<int64_t>{count} : shape;
    int64_t known = 1;
    for (size_t i = 0; i < each.size(); ++i) {
      if (static_cast<int>(i) != inferred) known *= each[i];
    }
    if (inferred >= 0 && !shape.empty()) {
      if (known == 0 || count % known != 0) {
        throw Error(fmt::format(
            "decode_raw('{}'): {} values of {} cannot "
            "take the shape {}{}",
            key, count, DTypeName(dtype), Shape(shape).ToString(), Where(e)));
      }
      each[inferred] = count / known;
    } else if (known != count) {
      throw Error(
          fmt::format("decode_raw('{}'): a value holds {} values of "
                      "{}, the shape {} needs {}{}",
                      key, count, DTypeName(dtype), Shape(each).ToString(),
                      known, Where(e)));
    }
    std::vector<int64_t> dims(t.shape().dims().begin(), t.shape().dims().end());
    dims.insert(dims.end(), each.begin(), each.end());
    const Shape out_shape(dims);
    Tensor out;
    if (dtype == DType::kUInt8) {
      out = u8.Reshape(out_shape);
    } else {
      out = Tensor::Allocate(dtype, out_shape);
      std::memcpy(const_cast<char*>(out.raw_data()), u8.raw_data(),
                  static_cast<size_t>(u8.num_elements()));
    }
    e.Set(key, std::move(out));
    return e;
  };
}

namespace {

// Whether `x` converts to `To` without leaving its range: static_cast of a
// float outside an integer type's range (or NaN) is undefined behaviour,
// and between integers it wraps.  Float to integer drops the fraction
// first, so uint8 takes (-1, 256).  To a float every value converts (past
// float32's range it is +-inf, as tf.cast makes it).
template <typename To, typename From>
bool CastFits(From x) {
  if constexpr (std::is_floating_point_v<To>) {
    return true;
  } else if constexpr (std::is_floating_point_v<From>) {
    // The fraction dropped, x must lie in (min - 1, max + 1).  max + 1 is
    // 2^digits, exact in a double; so is min - 1 = -2^digits - 1 while
    // digits < 53, and past that no double lies between it and min.
    constexpr int kDigits = std::numeric_limits<To>::digits;
    constexpr double kUpper = static_cast<double>(uint64_t{1} << kDigits);
    const double v = static_cast<double>(x);
    if (!(v < kUpper)) return false;  // NaN too
    if constexpr (!std::is_signed_v<To>) return v > -1.0;
    if constexpr (kDigits < 53) return v > -kUpper - 1.0;
    return v >= -kUpper;
  } else {
    return std::in_range<To>(x);
  }
}

}  // namespace

MapFn Cast(std::string key, DType dtype) {
  if (dtype == DType::kBytes) {
    throw Error("cast: the output dtype must be numeric, not bytes");
  }
  return [key = std::move(key), dtype](Element e) {
    const Tensor& t = Component(e, key, "cast");
    if (t.dtype() == DType::kBytes) {
      throw Error(
          fmt::format("cast('{}'): the component is bytes; cast "
                      "converts numbers (decode_raw reads bytes){}",
                      key, Where(e)));
    }
    if (t.dtype() == dtype) return e;
    Tensor out = Tensor::Allocate(dtype, t.shape());
    DispatchNumeric(t.dtype(), [&](auto from) {
      using From = decltype(from);
      const From* in = t.data<From>();
      DispatchNumeric(dtype, [&](auto to) {
        using To = decltype(to);
        To* o = out.mutable_data<To>();
        const int64_t n = t.num_elements();
        for (int64_t i = 0; i < n; ++i) {
          if (!CastFits<To>(in[i])) [[unlikely]] {
            throw Error(fmt::format(
                "cast('{}'): value {} (number {} of the component) is "
                "outside {}'s range{}",
                key, in[i], i, DTypeName(dtype), Where(e)));
          }
          o[i] = static_cast<To>(in[i]);
        }
      });
    });
    e.Set(key, ShapedLike(t, std::move(out)));
    return e;
  };
}

MapFn Scale(std::string key, double scale, double offset) {
  return [key = std::move(key), scale, offset](Element e) {
    const Tensor& t = Component(e, key, "scale");
    if (t.dtype() == DType::kBytes) {
      throw Error(
          fmt::format("scale('{}'): the component is bytes, not "
                      "numbers (decode_raw it first){}",
                      key, Where(e)));
    }
    Tensor out = Tensor::Allocate(DType::kFloat32, t.shape());
    float* o = out.mutable_data<float>();
    const auto s = static_cast<float>(scale);
    const auto b = static_cast<float>(offset);
    DispatchNumeric(t.dtype(), [&](auto from) {
      using From = decltype(from);
      const From* in = t.data<From>();
      const int64_t n = t.num_elements();
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(in[i]) * s + b;
    });
    e.Set(key, ShapedLike(t, std::move(out)));
    return e;
  };
}

MapFn Select(std::vector<std::string> keys) {
  return [keys = std::move(keys)](Element e) {
    std::vector<Element::Component> kept;
    kept.reserve(keys.size());
    for (const std::string& key : keys) {
      kept.push_back({key, Component(e, key, "select")});
    }
    e.components = std::move(kept);
    return e;
  };
}

MapFn Rename(std::string from, std::string to) {
  if (to.empty())
    throw Error(fmt::format("rename('{}'): the new name is empty", from));
  return [from = std::move(from), to = std::move(to)](Element e) {
    Component(e, from, "rename");
    if (from != to && e.Find(to) != nullptr) {
      throw Error(
          fmt::format("rename('{}' -> '{}'): the element already has "
                      "a component '{}'{}",
                      from, to, to, Where(e)));
    }
    for (auto& c : e.components) {
      if (c.name == from) c.name = to;
    }
    return e;
  };
}

MapFn DecodeElement(std::string key) {
  return [key = std::move(key)](Element e) {
    const Tensor& t = Component(e, key, "decode_element");
    if (t.dtype() != DType::kBytes || t.shape().rank() != 0 || t.ragged()) {
      throw Error(fmt::format(
          "decode_element('{}'): a {}{} component, not the bytes scalar of a "
          "record{}",
          key, DTypeName(t.dtype()), t.shape().ToString(), Where(e)));
    }
    Element out;
    try {
      out = DecodeElementRecord(t.bytes(0));
    } catch (const Error& err) {
      throw Error(
          fmt::format("decode_element('{}'): not an element record{}: {}", key,
                      Where(e), err.what()));
    }
    out.origin = e.origin;
    return out;
  };
}

}  // namespace recflow::pipeline::maps
