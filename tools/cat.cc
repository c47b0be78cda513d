// recflow cat: prints records as tf.train.Example (or SequenceExample), in
// protobuf's text format or, with --json, one canonical-JSON object per
// line (the mapping of Python's json_format.MessageToJson).
#include <fmt/format.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <memory>
#include <span>

#include "pipeline/data_source.h"
#include "records/errors.h"
#include "records/example.pb.h"
#include "records/example_parser.h"
#include "records/tfrecord_reader.h"
#include "tools/cli.h"
#include "tools/read_options.h"

namespace recflow::tools {
namespace {

// protobuf's canonical JSON of `message`, whose map fields protobuf
// prints in its hash map's order, which changes from run to run: here
// their entries come in key order (bytewise, as the text format sorts
// them), so the same records print the same lines every time.  Each entry
// is printed by protobuf itself (a map of that one entry), so escaping and
// numbers stay exactly protobuf's.
template <typename MapMessage, typename Value>
std::string SortedMapJson(
    const google::protobuf::Map<std::string, Value>& map,
    google::protobuf::Map<std::string, Value>* (MapMessage::*mutable_map)(),
    std::string_view field,
    const google::protobuf::util::JsonPrintOptions& options) {
  if (map.empty()) return "{}";
  std::vector<const std::string*> keys;
  keys.reserve(map.size());
  for (const auto& [key, value] : map) keys.push_back(&key);
  std::sort(keys.begin(), keys.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  const std::string open = fmt::format("{{\"{}\":{{", field);
  std::string out = open;
  std::string one_json;
  for (size_t k = 0; k < keys.size(); ++k) {
    MapMessage one;
    (*(one.*mutable_map)())[*keys[k]] = map.at(*keys[k]);
    one_json.clear();
    const auto status =
        google::protobuf::util::MessageToJsonString(one, &one_json, options);
    if (!status.ok()) throw records::Error(status.ToString());
    // {"feature":{"KEY":{...}}} -> "KEY":{...}
    if (k > 0) out.push_back(',');
    out.append(one_json, open.size(), one_json.size() - open.size() - 2);
  }
  out += "}}";
  return out;
}

std::string ExampleJson(const tensorflow::Example& e,
                        const google::protobuf::util::JsonPrintOptions& o) {
  if (!e.has_features()) return "{}";
  return "{\"features\":" +
         SortedMapJson(e.features().feature(),
                       &tensorflow::Features::mutable_feature, "feature", o) +
         "}";
}

std::string SequenceExampleJson(
    const tensorflow::SequenceExample& e,
    const google::protobuf::util::JsonPrintOptions& o) {
  std::string out = "{";
  if (e.has_context()) {
    out += "\"context\":" +
           SortedMapJson(e.context().feature(),
                         &tensorflow::Features::mutable_feature, "feature", o);
  }
  if (e.has_feature_lists()) {
    if (e.has_context()) out.push_back(',');
    out += "\"featureLists\":" +
           SortedMapJson(e.feature_lists().feature_list(),
                         &tensorflow::FeatureLists::mutable_feature_list,
                         "featureList", o);
  }
  return out + "}";
}

struct CatOptions {
  std::vector<std::string> inputs;
  bool json = false;
  bool sequence = false;
  int64_t limit = -1;
  std::string records;  // --records: "N", "A-B", comma-separated
  ReadFlags read;
};

// --records: record numbers (from 0, across the files in order) as "N" and
// inclusive ranges "A-B", separated by commas: the ranges [A, B], in that
// order, checked before any file is read.
std::vector<std::pair<uint64_t, uint64_t>> RecordRanges(
    const std::string& list) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  auto number = [&](std::string_view text, std::string_view item) {
    uint64_t v = 0;
    const auto [end, ec] =
        std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
      throw UsageError(fmt::format(
          "--records: '{}' is not a record number or range A-B", item));
    }
    return v;
  };
  std::string_view rest = list;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      const uint64_t i = number(item, item);
      out.emplace_back(i, i);
    } else {
      const uint64_t a = number(item.substr(0, dash), item);
      const uint64_t b = number(item.substr(dash + 1), item);
      if (b < a) {
        throw UsageError(
            fmt::format("--records: the range '{}' runs backwards", item));
      }
      out.emplace_back(a, b);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

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
  auto print = [&](const std::string& path, uint64_t index, uint64_t offset,
                   std::string_view record) {
    if (!message.ParseFromArray(record.data(),
                                static_cast<int>(record.size()))) {
      throw records::ParseError(fmt::format(
          "{}: record {} at byte offset {}: Can't parse serialized {}.", path,
          index, offset, o.sequence ? "SequenceExample" : "Example"));
    }
    out.clear();
    if (o.json) {
      try {
        out = o.sequence ? SequenceExampleJson(sequence, json_options)
                         : ExampleJson(example, json_options);
      } catch (const records::Error& e) {
        throw records::Error(
            fmt::format("{}: record {}: {}", path, index, e.what()));
      }
      out.push_back('\n');
    } else {
      google::protobuf::TextFormat::PrintToString(message, &out);
      out.insert(0, fmt::format("# {} record {}\n", path, index));
    }
    // A full disk or closed reader stops the copy at once (not after
    // reading every file for nothing).
    if (fwrite(out.data(), 1, out.size(), stdout) != out.size()) {
      throw records::IoError("standard output", "cannot write", errno);
    }
    ++printed;
  };
  if (!o.records.empty()) {
    // Random access through the files' indexes (built in memory where a
    // file has none): only the records asked for are read.
    const auto ranges = RecordRanges(o.records);
    const pipeline::TFRecordDataSource source(files);
    for (const auto& [a, b] : ranges) {
      if (b >= source.size()) {
        throw UsageError(fmt::format(
            "--records: record {} is past the end: the files hold {} records "
            "(numbered from 0)",
            b, source.size()));
      }
    }
    // Read 256 at a time (neighbours share a read), printed in order; a
    // damaged record stops the output where it is, after the records
    // before it (its chunk is then read again one record at a time).
    std::vector<uint64_t> chunk;
    auto flush = [&] {
      pipeline::Element e;
      try {
        e = source.Get(chunk, true);
      } catch (const records::RecordError&) {
        for (const uint64_t i : chunk) {
          e = source.Get(std::span<const uint64_t>(&i, 1), false);
          print(*e.origin.file, e.origin.record, e.origin.offset,
                e["record"].bytes(0));
        }
        chunk.clear();
        return;
      }
      for (size_t k = 0; k < chunk.size(); ++k) {
        const pipeline::Origin at = *e.OriginOf(static_cast<int64_t>(k));
        print(*at.file, at.record, at.offset,
              e["record"].bytes(static_cast<int64_t>(k)));
      }
      chunk.clear();
    };
    const uint64_t limit =
        o.limit >= 0 ? static_cast<uint64_t>(o.limit) : UINT64_MAX;
    uint64_t taken = 0;
    for (const auto& [a, b] : ranges) {
      for (uint64_t i = a; i <= b && taken < limit; ++i, ++taken) {
        chunk.push_back(i);
        if (chunk.size() == 256) flush();
      }
    }
    if (!chunk.empty()) flush();
    return kExitOk;
  }
  for (const std::string& path : files) {
    records::TFRecordReader reader(path, o.read.ToReaderOptions());
    std::string_view record;
    while ((o.limit < 0 || printed < o.limit) && reader.ReadRecord(&record)) {
      print(path, reader.last_index(), reader.last_offset(), record);
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
               "(camelCase list names, int64 as strings, bytes as base64; "
               "floats as C++ protobuf prints them, at times with more "
               "digits of the same float32), features in key order");
  app.add_flag("--sequence", o->sequence,
               "the records are tf.train.SequenceExample");
  app.add_option("--limit,-n", o->limit, "print at most N records")
      ->check(NonNegative());
  app.add_option(
      "--records", o->records,
      "print only these records, read through the files' indexes (FILE.idx, "
      "or one built in memory): numbers from 0 across the files in order, "
      "N or A-B (inclusive), comma-separated, e.g. 0,17,100-109; "
      "uncompressed and ZSTD files");
  o->read.Register(app);
  return [o] { return RunCat(*o); };
}

}  // namespace recflow::tools
