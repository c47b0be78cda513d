// recflow cat: prints records as tf.train.Example (or SequenceExample), in
// protobuf's text format or, with --json, one canonical-JSON object per
// line (the mapping of Python's json_format.MessageToJson).
#include <fmt/format.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <cerrno>
#include <memory>

#include "records/errors.h"
#include "records/example.pb.h"
#include "records/example_parser.h"
#include "records/tfrecord_reader.h"
#include "tools/cli.h"
#include "tools/read_options.h"

namespace recflow::tools {
namespace {

struct CatOptions {
  std::vector<std::string> inputs;
  bool json = false;
  bool sequence = false;
  int64_t limit = -1;
  ReadFlags read;
};

int RunCat(const CatOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  tensorflow::Example example;
  tensorflow::SequenceExample sequence;
  google::protobuf::Message& message =
      o.sequence ? static_cast<google::protobuf::Message&>(sequence)
                 : static_cast<google::protobuf::Message&>(example);
  google::protobuf::util::JsonPrintOptions json_options;
  json_options.add_whitespace = false;
  std::string out;
  int64_t printed = 0;
  for (const std::string& path : files) {
    records::TFRecordReader reader(path, o.read.ToReaderOptions());
    std::string_view record;
    while ((o.limit < 0 || printed < o.limit) && reader.ReadRecord(&record)) {
      if (!message.ParseFromArray(record.data(),
                                  static_cast<int>(record.size()))) {
        throw records::ParseError(fmt::format(
            "{}: record {} at byte offset {}: Can't parse serialized {}.", path,
            reader.last_index(), reader.last_offset(),
            o.sequence ? "SequenceExample" : "Example"));
      }
      out.clear();
      if (o.json) {
        const auto status = google::protobuf::util::MessageToJsonString(
            message, &out, json_options);
        if (!status.ok()) {
          throw records::Error(fmt::format("{}: record {}: {}", path,
                                           reader.last_index(),
                                           status.ToString()));
        }
        out.push_back('\n');
      } else {
        google::protobuf::TextFormat::PrintToString(message, &out);
        out.insert(0,
                   fmt::format("# {} record {}\n", path, reader.last_index()));
      }
      // A full disk or closed reader stops the copy at once (not after
      // reading every file for nothing).
      if (fwrite(out.data(), 1, out.size(), stdout) != out.size()) {
        throw records::IoError("standard output", "cannot write", errno);
      }
      ++printed;
    }
  }
  return kExitOk;
}

}  // namespace

Runner AddCatCommand(CLI::App& app) {
  auto o = std::make_shared<CatOptions>();
  app.add_option("FILE", o->inputs, "record files, or directories of them")
      ->required();
  app.add_flag("--json", o->json,
               "one JSON object per record and line: protobuf's canonical "
               "JSON mapping, as Python's json_format.MessageToJson gives it "
               "(camelCase list names, int64 as strings, bytes as base64)");
  app.add_flag("--sequence", o->sequence,
               "the records are tf.train.SequenceExample");
  app.add_option("--limit,-n", o->limit, "print at most N records")
      ->check(NonNegative());
  o->read.Register(app);
  return [o] { return RunCat(*o); };
}

}  // namespace recflow::tools
