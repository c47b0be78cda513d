// The SequenceExample parser (context and feature lists, FixedLen and
// VarLen, every dtype) over one or two serialized SequenceExamples.
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "records/errors.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"

namespace {

using namespace recflow::records;

const SequenceExampleParser& Parser() {
  static const SequenceExampleParser parser(
      FeatureSpec::FromJsonText(R"({"features": {
        "length": {"kind": "fixed", "dtype": "int64", "shape": []},
        "title": {"kind": "fixed", "dtype": "bytes", "shape": [],
                  "default": ""},
        "scores": {"kind": "var", "dtype": "float32"}}})"),
      FeatureSpec::FromJsonText(R"({"features": {
        "tokens": {"kind": "var", "dtype": "bytes"},
        "frame": {"kind": "fixed", "dtype": "float32", "shape": [3]},
        "ids": {"kind": "var", "dtype": "int64"}}})"));
  return parser;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recflow::fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  std::vector<std::string_view> batch;
  if ((mode & 1) != 0) batch.push_back(in.Take(in.Byte() * 4u));
  batch.push_back(in.Rest());
  ParsedSequenceBatch out;
  try {
    Parser().ParseBatch(batch, &out, {.file = "fuzz", .first_record = 0});
  } catch (const ParseError&) {
  }
  return 0;
}
