// A downstream program using the installed recflow: writes records through
// gzip and reads them back, and parses a tf.Example.
#include <cstdio>
#include <string>
#include <vector>

#include "convert/convert.h"
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
  if (streamed != written.size()) return 1;

  // The convert layer: a CSV file into two shards.
  const std::string csv = std::string(argv[1]) + ".csv";
  std::FILE* f = std::fopen(csv.c_str(), "w");
  if (f == nullptr) return 1;
  std::fputs("id,name\n1,a\n2,b\n3,c\n", f);
  std::fclose(f);
  recflow::convert::ConvertJob job;
  job.format = "csv";
  job.inputs.files = {csv};
  job.output = std::string(argv[1]) + "-converted";
  job.shards = 2;
  const auto summary = recflow::convert::Convert(job);
  std::printf("downstream converted %llu rows\n",
              static_cast<unsigned long long>(summary.records));
  return summary.records == 3 && summary.shards.size() == 2 ? 0 : 1;
}
