// The zero-copy Example parser against a spec with every kind of feature
// (FixedLen scalars and vectors with and without defaults, VarLen of each
// dtype), over a batch of one to four serialized Examples cut from the
// input (or one of them twice and then with a byte changed), on one thread
// and on two.  ParseError is a correct answer; a crash, an out-of-bounds
// read or any other exception is a finding.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "records/errors.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"

namespace {

using namespace recflow::records;

const ExampleParser& Parser() {
  static const ExampleParser parser(FeatureSpec::FromJsonText(R"({
    "features": {
      "image_class": {"kind": "fixed", "dtype": "int64", "shape": []},
      "image_floats": {"kind": "fixed", "dtype": "float32", "shape": [784],
                       "default": 0},
      "label": {"kind": "fixed", "dtype": "int64", "shape": [], "default": -1},
      "pair": {"kind": "fixed", "dtype": "float32", "shape": [2, 1],
               "default": [1.5, 2.5]},
      "name": {"kind": "fixed", "dtype": "bytes", "shape": [],
               "default": "none"},
      "species": {"kind": "var", "dtype": "int64"},
      "body_mass_g": {"kind": "var", "dtype": "float32"},
      "tags": {"kind": "var", "dtype": "bytes"}
    }})"));
  return parser;
}

// The input cut into `n` parts at offsets the first bytes choose.
std::vector<std::string_view> Split(recflow::fuzz::Input& in, int n) {
  std::vector<size_t> cuts;
  for (int i = 1; i < n; ++i) cuts.push_back(in.Byte() * 4u);
  const std::string_view rest = in.Rest();
  std::vector<std::string_view> parts;
  size_t at = 0;
  for (size_t cut : cuts) {
    const size_t end = std::min(rest.size(), at + cut);
    parts.push_back(rest.substr(at, end - at));
    at = end;
  }
  parts.push_back(rest.substr(at));
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recflow::fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  std::vector<std::string_view> batch = Split(in, 1 + mode % 4);
  // Mode 0x20: the first part, then itself with one byte changed (where
  // the first byte of the last part says): Examples laid out alike, which
  // the parser decodes after the first from the layout it remembers.
  std::string edited;
  if ((mode & 0x20) != 0 && !batch.front().empty()) {
    edited = batch.front();
    const uint8_t at = batch.back().empty() ? 0 : batch.back().front();
    edited[at % edited.size()] ^= static_cast<char>(mode | 1);
    batch = {batch.front(), batch.front(), edited};
  }
  ParsedBatch out;
  try {
    Parser().ParseBatch(batch, &out, {.file = "fuzz", .first_record = 0},
                        (mode & 0x10) != 0 ? 2 : 1);
    // What was parsed must be consistent with the batch.
    if (out.batch_size != static_cast<int64_t>(batch.size())) __builtin_trap();
  } catch (const ParseError&) {
  }
  return 0;
}
