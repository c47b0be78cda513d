// Helpers of the convert/ tests: a source's rows as tf.Examples, and the
// Examples of written shards.
#ifndef RECFLOW_TESTS_CONVERT_CONVERT_TEST_UTIL_H_
#define RECFLOW_TESTS_CONVERT_CONVERT_TEST_UTIL_H_

#include <string>
#include <vector>

#include "convert/convert.h"
#include "records/example.pb.h"
#include "test_util.h"

namespace recflow::testing {

// Every row of `format` over `inputs`, built and parsed as the job does
// (rows built while reading, or by Build).  A row's error is thrown as a
// ConvertError of the row level.
inline std::vector<tensorflow::Example> SourceExamples(
    const std::string& format, const convert::ConvertInputs& inputs) {
  auto source = convert::OpenSource(format, inputs);
  std::vector<tensorflow::Example> out;
  convert::Row row;
  records::ExampleBuilder builder;
  while (source->NextRow(&row)) {
    if (!row.error.empty()) throw convert::ConvertError(row.error, true);
    if (!row.built) {
      builder.Clear();
      source->Build(row, &builder);
      row.example.assign(builder.Serialize());
    }
    out.emplace_back().ParseFromString(row.example);
  }
  return out;
}

// The Examples of the shards a job wrote, shard by shard.
inline std::vector<tensorflow::Example> ShardExamples(
    const convert::ConvertSummary& s) {
  std::vector<tensorflow::Example> out;
  for (const auto& shard : s.shards) {
    for (const auto& r : ReadRecords(shard.path)) {
      out.emplace_back().ParseFromString(r);
    }
  }
  return out;
}

inline const tensorflow::Feature* Get(const tensorflow::Example& ex,
                                      const std::string& key) {
  const auto& m = ex.features().feature();
  auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

// The ConvertError message of `fn`, or "" when it does not throw one.
template <typename Fn>
std::string ConvertErrorOf(Fn fn) {
  try {
    fn();
  } catch (const convert::ConvertError& e) {
    return e.what();
  }
  return "";
}

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_CONVERT_CONVERT_TEST_UTIL_H_
