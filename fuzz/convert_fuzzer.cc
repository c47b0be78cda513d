// The parsers of `recflow convert`'s inputs, one fuzz target per format
// (FUZZ_FORMAT: csv, jsonl, npy (and npz archives), idx): open the source
// on the input, read every row and build every Example.  ConvertError and
// records::Error are correct answers; a crash, a leak, an allocation far
// beyond the input, or another exception is a finding.
#include <cstdint>
#include <string>

#include "convert/convert.h"
#include "fuzz_util.h"
#include "records/errors.h"
#include "records/example_builder.h"
#include "records/feature_spec.h"

#ifndef FUZZ_FORMAT
#error "define FUZZ_FORMAT"
#endif

namespace {

using namespace recflow;

// Types for csv and jsonl columns, used when the mode byte asks.
const records::FeatureSpec& Spec() {
  static const records::FeatureSpec spec =
      records::FeatureSpec::FromJsonText(R"({"features": {
        "a": {"kind": "fixed", "dtype": "int64", "shape": []},
        "b": {"kind": "fixed", "dtype": "float32", "shape": [2]},
        "c": {"kind": "var", "dtype": "bytes"},
        "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  return spec;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  const std::string format = FUZZ_FORMAT;
  convert::ConvertInputs inputs;
  std::string source_format = format;
  if (format == "idx") {
    // Labels first (a length byte picks where they end), then images.
    const std::string_view labels = in.Take(in.Byte() * 2u);
    inputs.labels = fuzz::ScratchFile("labels-idx1-ubyte", labels);
    inputs.images = fuzz::ScratchFile("images-idx3-ubyte", in.Rest());
  } else if (format == "npy" && (mode & 1) != 0) {
    source_format = "npz";
    inputs.files.push_back(fuzz::ScratchFile("input.npz", in.Rest()));
  } else {
    inputs.files.push_back(fuzz::ScratchFile("input." + format, in.Rest()));
    if ((mode & 2) != 0) inputs.spec = &Spec();
  }
  try {
    auto source = convert::OpenSource(source_format, inputs);
    convert::Row row;
    records::ExampleBuilder builder;
    // At most 4096 rows per input: a header may legitimately describe
    // billions of empty rows (shape (10**12, 0)), which would only time out.
    for (int n = 0; n < 4096 && source->NextRow(&row); ++n) {
      if (!row.error.empty() || row.built) continue;
      try {
        source->Build(row, &builder);
      } catch (const convert::ConvertError& e) {
        if (!e.row_level()) throw;
      }
    }
  } catch (const convert::ConvertError&) {
  } catch (const records::Error&) {
  }
  return 0;
}
