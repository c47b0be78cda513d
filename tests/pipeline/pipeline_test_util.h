// Helpers shared by the pipeline tests.
#ifndef RECFLOW_TESTS_PIPELINE_PIPELINE_TEST_UTIL_H_
#define RECFLOW_TESTS_PIPELINE_PIPELINE_TEST_UTIL_H_

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "pipeline/dataset.h"

namespace recflow::testing {

// Every element of `ds` (at most `limit`).
inline std::vector<pipeline::Element> Collect(const pipeline::Dataset& ds,
                                              pipeline::IteratorOptions o = {},
                                              size_t limit = SIZE_MAX) {
  pipeline::Iterator it = ds.MakeIterator(o);
  std::vector<pipeline::Element> out;
  pipeline::Element e;
  while (out.size() < limit && it.Next(&e)) out.push_back(std::move(e));
  return out;
}

// [a, b) as int64s.
inline std::vector<int64_t> Iota(int64_t a, int64_t b) {
  std::vector<int64_t> v(static_cast<size_t>(b - a));
  std::iota(v.begin(), v.end(), a);
  return v;
}

// The int64 scalar `name` of each element.
inline std::vector<int64_t> Ints(const std::vector<pipeline::Element>& v,
                                 const std::string& name = "value") {
  std::vector<int64_t> out;
  for (const auto& e : v) {
    const auto& t = e[name];
    for (int64_t x : t.values<int64_t>()) out.push_back(x);
  }
  return out;
}

// The "record" bytes of each element.
inline std::vector<std::string> Records(
    const std::vector<pipeline::Element>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.emplace_back(e["record"].bytes(0));
  return out;
}

inline pipeline::Element Int(int64_t v) {
  pipeline::Element e;
  e.Set("value", pipeline::Tensor::Scalar<int64_t>(v));
  return e;
}

// {"value": v * v} for the int64 scalar "value" of `e`.
inline pipeline::Element Square(pipeline::Element e) {
  const int64_t v = e["value"].scalar<int64_t>();
  return Int(v * v);
}

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_PIPELINE_PIPELINE_TEST_UTIL_H_
