// recflow inspect: what the features of Example (or SequenceExample)
// records look like, and a FeatureSpec inferred from them.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

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
  bool sequence = false;
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

// A SequenceExample's feature_list: its steps per record, and the values of
// each step in `values` (present / empty there count steps).
struct ListStats {
  uint64_t present = 0;  // records with the list
  uint64_t min_steps = UINT64_MAX, max_steps = 0, total_steps = 0;
  FeatureStats values;
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

// Counts one Feature (of a record, or of a step of a feature_list).
void Count(const tensorflow::Feature& f, FeatureStats* s) {
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
      ++s->no_kind;
      return;
  }
  ++s->kinds[kind];
  if (n == 0) {
    ++s->empty;
  } else {
    ++s->present;
    if (s->samples.size() < kSamples) s->samples.push_back(Sample(f));
  }
  s->min_count = std::min(s->min_count, n);
  s->max_count = std::max(s->max_count, n);
  s->total_values += n;
}

// Whether an Example carried field 2, which Example lacks and a
// SequenceExample's feature_lists use: parsed as an Example, those lists
// would be left out of the summary without a word.
bool HasFeatureLists(const tensorflow::Example& ex) {
  const auto& unknown = ex.GetReflection()->GetUnknownFields(ex);
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (unknown.field(i).number() == 2) return true;
  }
  return false;
}

// The config of a feature of stats `s` over `count` records (or steps):
// fixed where every one has the same number of values, var otherwise;
// none, saying so, for a feature with two kinds of list.
std::optional<records::FeatureConfig> InferConfig(const std::string& name,
                                                  const FeatureStats& s,
                                                  uint64_t count,
                                                  std::string_view what) {
  if (s.kinds.size() != 1) {
    fmt::print(stderr,
               "recflow: {} '{}' holds {} kinds of list; left out "
               "of the spec\n",
               what, name, s.kinds.size());
    return std::nullopt;
  }
  records::FeatureConfig c;
  c.dtype = *records::ParseExampleDType(s.kinds.begin()->first);
  const uint64_t with_list = s.present + s.empty;
  if (with_list == count && s.min_count == s.max_count) {
    c.kind = records::FeatureConfig::Kind::kFixed;
    if (s.min_count != 1) c.shape = {static_cast<int64_t>(s.min_count)};
  } else {
    c.kind = records::FeatureConfig::Kind::kVar;
  }
  return c;
}

std::string Counts(uint64_t with, uint64_t min, uint64_t max, uint64_t total) {
  return with ? fmt::format("{}/{}/{:.1f}", min, max,
                            static_cast<double>(total) / with)
              : "-";
}

std::string Samples(const std::vector<std::string>& samples) {
  std::string out;
  for (const auto& x : samples) out += (out.empty() ? "" : " ") + x;
  return out;
}

std::string Kinds(const std::map<std::string, uint64_t>& kinds) {
  std::string out;
  for (const auto& [k, n] : kinds) out += (out.empty() ? "" : ",") + k;
  return out;
}

int RunInspect(const InspectOptions& o) {
  const std::vector<std::string> files = ExpandInputs(o.inputs);
  std::map<std::string, FeatureStats> stats;  // features, or the context
  std::map<std::string, ListStats> lists;     // --sequence
  uint64_t records = 0, with_feature_lists = 0;
  tensorflow::Example ex;
  tensorflow::SequenceExample seq;
  for (const std::string& path : files) {
    records::TFRecordReader reader(path, o.read.ToReaderOptions());
    std::string_view record;
    while ((o.limit < 0 || records < static_cast<uint64_t>(o.limit)) &&
           reader.ReadRecord(&record)) {
      google::protobuf::Message& message =
          o.sequence ? static_cast<google::protobuf::Message&>(seq) : ex;
      if (!message.ParseFromArray(record.data(),
                                  static_cast<int>(record.size()))) {
        throw records::ParseError(fmt::format(
            "{}: record {} at byte offset {}: Can't parse serialized {}.", path,
            reader.last_index(), reader.last_offset(),
            o.sequence ? "SequenceExample" : "Example"));
      }
      ++records;
      const tensorflow::Features& features =
          o.sequence ? seq.context() : ex.features();
      for (const auto& [name, f] : features.feature()) Count(f, &stats[name]);
      if (!o.sequence) {
        with_feature_lists += HasFeatureLists(ex);
        continue;
      }
      for (const auto& [name, list] : seq.feature_lists().feature_list()) {
        ListStats& l = lists[name];
        const auto steps = static_cast<uint64_t>(list.feature_size());
        ++l.present;
        l.min_steps = std::min(l.min_steps, steps);
        l.max_steps = std::max(l.max_steps, steps);
        l.total_steps += steps;
        for (const auto& f : list.feature()) Count(f, &l.values);
      }
    }
  }
  if (with_feature_lists > 0) {
    fmt::print(stderr,
               "recflow: {} of {} records also hold feature_lists, as a "
               "tf.train.SequenceExample does: read as Examples, only their "
               "context features are shown; give --sequence\n",
               with_feature_lists, records);
  }

  if (o.spec) {
    records::FeatureSpec spec;
    for (const auto& [name, s] : stats) {
      const auto c = InferConfig(name, s, records,
                                 o.sequence ? "context feature" : "feature");
      if (c) spec.Add(name, *c);
    }
    if (!o.sequence) {
      fmt::print("{}\n", spec.ToJson().dump(2));
      return kExitOk;
    }
    // Sequence features: fixed where every step has the same number of
    // values (records::SequenceExampleParser's FixedLen); a record without
    // the list has no steps of it, which either kind allows.
    records::FeatureSpec sequence;
    for (const auto& [name, l] : lists) {
      const auto c =
          InferConfig(name, l.values, l.total_steps, "sequence feature");
      if (c) sequence.Add(name, *c);
    }
    fmt::print("{}\n", nlohmann::json{{"context", spec.ToJson()},
                                      {"sequence", sequence.ToJson()}}
                           .dump(2));
    return kExitOk;
  }

  if (o.json) {
    auto feature_json = [](const FeatureStats& s, uint64_t count) {
      const uint64_t with_list = s.present + s.empty;
      return nlohmann::json{
          {"kinds", s.kinds},
          {"present", s.present},
          {"empty", s.empty},
          {"absent", count - with_list},
          {"values_min", with_list ? s.min_count : 0},
          {"values_max", s.max_count},
          {"values_mean", with_list ? static_cast<double>(s.total_values) /
                                          static_cast<double>(with_list)
                                    : 0.0},
          {"samples", s.samples}};
    };
    nlohmann::json features = nlohmann::json::object();
    for (const auto& [name, s] : stats) {
      features[name] = feature_json(s, records);
    }
    nlohmann::json out = {{"records", records}, {"features", features}};
    if (o.sequence) {
      // Per list: the records holding it and its steps; per step (under
      // "steps"), what "features" says per record.
      nlohmann::json feature_lists = nlohmann::json::object();
      for (const auto& [name, l] : lists) {
        feature_lists[name] = {
            {"present", l.present},
            {"absent", records - l.present},
            {"steps_min", l.present ? l.min_steps : 0},
            {"steps_max", l.max_steps},
            {"steps_mean", l.present ? static_cast<double>(l.total_steps) /
                                           static_cast<double>(l.present)
                                     : 0.0},
            {"steps", feature_json(l.values, l.total_steps)}};
      }
      out["feature_lists"] = feature_lists;
    }
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  fmt::print("{} records, {} {}features{}\n", records, stats.size(),
             o.sequence ? "context " : "",
             o.sequence ? fmt::format(", {} feature lists", lists.size()) : "");
  fmt::print("{:<24} {:<12} {:>9} {:>9} {:>9} {:>21}  {}\n", "feature", "kind",
             "present", "empty", "absent", "values min/max/mean", "samples");
  for (const auto& [name, s] : stats) {
    const uint64_t with_list = s.present + s.empty;
    fmt::print("{:<24} {:<12} {:>9} {:>9} {:>9} {:>21}  {}\n", name,
               Kinds(s.kinds), s.present, s.empty, records - with_list,
               Counts(with_list, s.min_count, s.max_count, s.total_values),
               Samples(s.samples));
  }
  if (o.sequence && !lists.empty()) {
    fmt::print("\n{:<24} {:<12} {:>9} {:>9} {:>21} {:>24}  {}\n",
               "feature list", "kind", "present", "absent",
               "steps min/max/mean", "values/step min/max/mean", "samples");
    for (const auto& [name, l] : lists) {
      const FeatureStats& v = l.values;
      const uint64_t with_list = v.present + v.empty;
      fmt::print("{:<24} {:<12} {:>9} {:>9} {:>21} {:>24}  {}\n", name,
                 Kinds(v.kinds), l.present, records - l.present,
                 Counts(l.present, l.min_steps, l.max_steps, l.total_steps),
                 Counts(with_list, v.min_count, v.max_count, v.total_values),
                 Samples(v.samples));
    }
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
  app.add_flag("--sequence", o->sequence,
               "the records are tf.train.SequenceExample: summarise the "
               "context features and the feature lists (steps per record, "
               "values per step); with --spec, {\"context\": SPEC, "
               "\"sequence\": SPEC}, a sequence feature fixed where every "
               "step has the same number of values");
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
