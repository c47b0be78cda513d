// A downstream program using the installed recflow: writes records through
// gzip and reads them back, and parses a tf.Example.
#include <cstdio>
#include <string>
#include <vector>

#include "records/example_builder.h"
#include "records/example_parser.h"
#include "records/tfrecord_reader.h"
#include "records/tfrecord_writer.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  using namespace recflow::records;
  const std::vector<std::string> written = {"one", "", "three"};
  TFRecordWriter writer(argv[1], {.compression = Compression::kGzip});
  for (const auto& r : written) writer.Write(r);
  writer.Close();
  TFRecordReader reader(argv[1]);
  std::vector<std::string> read;
  std::string_view r;
  while (reader.ReadRecord(&r)) read.emplace_back(r);
  std::printf("downstream read %zu records\n", read.size());
  if (read != written) return 1;

  // The Example layer: build one, parse it back with a spec.
  ExampleBuilder builder;
  builder.AddInt64("label", 7);
  const std::string example(builder.Serialize());
  const std::vector<std::string_view> batch = {example};
  ParsedBatch parsed;
  ExampleParser(FeatureSpec::FromJsonText(
                    R"({"features": {"label": {"dtype": "int64", "shape": []}}})"))
      .ParseBatch(batch, &parsed);
  return parsed.feature("label").ints.at(0) == 7 ? 0 : 1;
}
