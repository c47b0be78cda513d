// recflow inspect: what the features of Example records look like, and a
// FeatureSpec inferred from them.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "records/example.pb.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"
#include "records/tfrecord_reader.h"
#include "tools/cli.h"
#include "tools/read_options.h"

namespace recflow::tools {
namespace {

struct InspectOptions {
  std::vector<std::string> inputs;
  bool json = false;
  bool spec = false;
  int64_t limit = -1;
  ReadFlags read;
};

constexpr size_t kSamples = 3;

struct FeatureStats {
  std::map<std::string, uint64_t> kinds;  // "float", "int64", "bytes"
  uint64_t present = 0;                   // with at least one value
  uint64_t empty = 0;                     // a list with no values
  uint64_t no_kind = 0;  // a Feature with none of the lists: missing
  uint64_t min_count = UINT64_MAX, max_count = 0, total_values = 0;
  std::vector<std::string> samples;
};

std::string Sample(const tensorflow::Feature& f) {
  switch (f.kind_case()) {
    case tensorflow::Feature::kFloatList:
      return fmt::format("{}", f.float_list().value(0));
    case tensorflow::Feature::kInt64List:
      return fmt::format("{}", f.int64_list().value(0));
    case tensorflow::Feature::kBytesList: {
      const std::string& s = f.bytes_list().value(0);
      const bool printable = std::all_of(
          s.begin(), s.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; });
      if (printable && s.size() <= 40) return nlohmann::json(s).dump();
      return fmt::format("<{} bytes>", s.size());
    }
    default:
      return "";
  }
}

int RunInspect(const InspectOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  std::map<std::string, FeatureStats> stats;
  uint64_t records = 0;
  tensorflow::Example ex;
  for (const std::string& path : files) {
    records::TFRecordReader reader(path, o.read.ToReaderOptions());
    std::string_view record;
    while ((o.limit < 0 || records < static_cast<uint64_t>(o.limit)) &&
           reader.ReadRecord(&record)) {
      if (!ex.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
        throw records::ParseError(fmt::format(
            "{}: record {} at byte offset {}: Can't parse serialized "
            "Example.",
            path, reader.last_index(), reader.last_offset()));
      }
      ++records;
      for (const auto& [name, f] : ex.features().feature()) {
        FeatureStats& s = stats[name];
        uint64_t n = 0;
        const char* kind = nullptr;
        switch (f.kind_case()) {
          case tensorflow::Feature::kFloatList:
            kind = "float";
            n = static_cast<uint64_t>(f.float_list().value_size());
            break;
          case tensorflow::Feature::kInt64List:
            kind = "int64";
            n = static_cast<uint64_t>(f.int64_list().value_size());
            break;
          case tensorflow::Feature::kBytesList:
            kind = "bytes";
            n = static_cast<uint64_t>(f.bytes_list().value_size());
            break;
          default:
            ++s.no_kind;
            continue;
        }
        ++s.kinds[kind];
        if (n == 0) {
          ++s.empty;
        } else {
          ++s.present;
          if (s.samples.size() < kSamples) s.samples.push_back(Sample(f));
        }
        s.min_count = std::min(s.min_count, n);
        s.max_count = std::max(s.max_count, n);
        s.total_values += n;
      }
    }
  }

  if (o.spec) {
    records::FeatureSpec spec;
    for (const auto& [name, s] : stats) {
      if (s.kinds.size() != 1) {
        fmt::print(stderr,
                   "recflow: feature '{}' holds {} kinds of list; left out "
                   "of the spec\n",
                   name, s.kinds.size());
        continue;
      }
      records::FeatureConfig c;
      c.dtype = *records::ParseExampleDType(s.kinds.begin()->first);
      const uint64_t with_list = s.present + s.empty;
      if (with_list == records && s.min_count == s.max_count) {
        c.kind = records::FeatureConfig::Kind::kFixed;
        if (s.min_count != 1) c.shape = {static_cast<int64_t>(s.min_count)};
      } else {
        c.kind = records::FeatureConfig::Kind::kVar;
      }
      spec.Add(name, c);
    }
    fmt::print("{}\n", spec.ToJson().dump(2));
    return kExitOk;
  }

  if (o.json) {
    nlohmann::json features = nlohmann::json::object();
    for (const auto& [name, s] : stats) {
      const uint64_t with_list = s.present + s.empty;
      features[name] = {
          {"kinds", s.kinds},
          {"present", s.present},
          {"empty", s.empty},
          {"absent", records - with_list},
          {"values_min", with_list ? s.min_count : 0},
          {"values_max", s.max_count},
          {"values_mean",
           with_list ? static_cast<double>(s.total_values) / with_list : 0.0},
          {"samples", s.samples}};
    }
    fmt::print(
        "{}\n",
        nlohmann::json{{"records", records}, {"features", features}}.dump());
    return kExitOk;
  }
  fmt::print("{} records, {} features\n", records, stats.size());
  fmt::print("{:<24} {:<12} {:>9} {:>9} {:>9} {:>21}  {}\n", "feature", "kind",
             "present", "empty", "absent", "values min/max/mean", "samples");
  for (const auto& [name, s] : stats) {
    std::string kinds;
    for (const auto& [k, n] : s.kinds) {
      kinds += (kinds.empty() ? "" : ",") + k;
    }
    const uint64_t with_list = s.present + s.empty;
    const std::string counts =
        with_list ? fmt::format("{}/{}/{:.1f}", s.min_count, s.max_count,
                                static_cast<double>(s.total_values) / with_list)
                  : "-";
    std::string samples;
    for (const auto& x : s.samples) samples += (samples.empty() ? "" : " ") + x;
    fmt::print("{:<24} {:<12} {:>9} {:>9} {:>9} {:>21}  {}\n", name, kinds,
               s.present, s.empty, records - with_list, counts, samples);
  }
  return kExitOk;
}

}  // namespace

Runner AddInspectCommand(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  app.add_option("FILE", o->inputs, "record files, or directories of them")
      ->required();
  app.add_flag("--json", o->json, "print one JSON object");
  app.add_flag("--spec", o->spec,
               "print a FeatureSpec inferred from the data: fixed where a "
               "feature is in every record with the same number of values "
               "(shape [] for one value), var otherwise");
  app.add_option("--limit,-n", o->limit, "look at the first N records only")
      ->check(NonNegative());
  o->read.Register(app);
  app.footer(
      "present: records where the feature has values; empty: a list with "
      "no values; absent: no such key, or a Feature with none of its three "
      "lists set (TensorFlow treats both as missing).");
  return [o] { return RunInspect(*o); };
}

}  // namespace recflow::tools
