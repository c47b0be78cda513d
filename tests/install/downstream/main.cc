// A downstream program using the installed recflow: writes records through
// gzip and reads them back, and parses a tf.Example.
#include <cstdio>
#include <string>
#include <vector>

#include "pipeline/dataset.h"
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
  ExampleParser(
      FeatureSpec::FromJsonText(
          R"({"features": {"label": {"dtype": "int64", "shape": []}}})"))
      .ParseBatch(batch, &parsed);
  if (parsed.feature("label").ints.at(0) != 7) return 1;

  // The pipeline layer: stream the file back, batched.
  auto it = recflow::pipeline::Dataset::FromTFRecords({argv[1]})
                .Batch(2)
                .MakeIterator();
  recflow::pipeline::Element e;
  size_t streamed = 0;
  while (it.Next(&e)) streamed += e["record"].num_elements();
  std::printf("downstream streamed %zu records\n", streamed);
  return streamed == written.size() ? 0 : 1;
}
