// A pipeline::Dataset as a conversion's input (ConvertDataset): each
// element one record, an Example, the bytes of one of its components, or
// the element itself (an element record).
#include "pipeline/dataset.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "convert/sources.h"
#include "pipeline/maps.h"
#include "pipeline/state.h"
#include "records/csv_reader.h"
#include "records/file.h"

namespace recflow::convert {
namespace {

class DatasetSource final : public ExampleSource {
 public:
  DatasetSource(const pipeline::Dataset& dataset, DatasetRecords options)
      : it_(dataset.MakeIterator({.threads = options.threads})),
        o_(std::move(options)) {}

  // Encodes on the reading thread, where the element is (a Row carries
  // its encoding, not the element, to the job's workers; the pipeline's
  // own stages run on its threads).  A pipeline error (a damaged file)
  // ends the job; a value an Example cannot hold is a row-level error,
  // which skip_bad may skip.
  bool NextRow(Row* row) override {
    pipeline::Element e;
    if (!it_.Next(&e)) return false;
    row->line = next_++;
    row->built = true;
    try {
      if (o_.element_records) {
        for (const auto& c : e.components) {
          RequireHost(c.name, c.tensor, row->line);
        }
        e.origin = {};
        e.batch_origins.reset();
        row->example.assign(pipeline::EncodeElementRecord(e));
      } else if (o_.record_key.empty()) {
        builder_.Clear();
        for (const auto& c : e.components) Add(c.name, c.tensor, row->line);
        row->example.assign(builder_.Serialize());
      } else {
        row->example.assign(Record(e, row->line));
      }
      if (row->example.size() > max_record_bytes()) {
        RecordTooLong(row->example.size(), max_record_bytes(),
                      fmt::format("element {}", row->line));
      }
    } catch (const ConvertError& err) {
      if (!err.row_level()) throw;
      row->error = err.what();
    }
    return true;
  }
  uint64_t bytes_read() const override { return 0; }
  uint64_t total_bytes() const override { return 0; }

 private:
  // A row-level error for a component whose values are not in host
  // memory, where an encoder cannot read them.
  static void RequireHost(const std::string& name,
                          const pipeline::Tensor& tensor, uint64_t element) {
    if (!tensor.on_host()) {
      RowError(fmt::format("element {}: component '{}' is not in host memory",
                           element, name));
    }
  }

  void Add(const std::string& name, const pipeline::Tensor& tensor,
           uint64_t element) {
    RequireHost(name, tensor, element);
    // A ragged component's values, one after another.
    const pipeline::Tensor t = tensor.FlatValues();
    using pipeline::DType;
    switch (t.dtype()) {
      case DType::kFloat32:
        builder_.AddFloatList(name, t.values<float>());
        return;
      case DType::kFloat64: {
        floats_.clear();
        for (double d : t.values<double>()) {
          // A float_list holds float32: a float64 past its range would be
          // inf, silently.
          if (!records::FitsFloat32(d)) {
            RowError(fmt::format(
                "element {}: component '{}': float64 value {} is outside "
                "float32's range, which a float_list holds",
                element, name, d));
          }
          floats_.push_back(static_cast<float>(d));
        }
        builder_.AddFloatList(name, floats_);
        return;
      }
      case DType::kInt64:
        builder_.AddInt64List(name, t.values<int64_t>());
        return;
      case DType::kInt32:
        ints_.assign(t.values<int32_t>().begin(), t.values<int32_t>().end());
        builder_.AddInt64List(name, ints_);
        return;
      case DType::kUInt8:
        ints_.assign(t.values<uint8_t>().begin(), t.values<uint8_t>().end());
        builder_.AddInt64List(name, ints_);
        return;
      case DType::kBytes:
        bytes_.clear();
        for (int64_t k = 0; k < t.num_elements(); ++k) {
          bytes_.push_back(t.bytes(k));
        }
        builder_.AddBytesList(name, bytes_);
        return;
    }
  }

  std::string_view Record(const pipeline::Element& e, uint64_t element) {
    const pipeline::Tensor* t = e.Find(o_.record_key);
    if (t == nullptr || t->dtype() != pipeline::DType::kBytes ||
        t->shape().rank() != 0 || t->ragged() || !t->on_host()) {
      RowError(fmt::format(
          "element {}: record_key '{}' names {}; the record must be a bytes "
          "scalar in host memory",
          element, o_.record_key,
          t == nullptr
              ? std::string("no component")
              : fmt::format("a {}{} component", pipeline::DTypeName(t->dtype()),
                            t->shape().ToString())));
    }
    return t->bytes(0);
  }

  pipeline::Iterator it_;
  DatasetRecords o_;
  uint64_t next_ = 0;
  records::ExampleBuilder builder_;
  std::vector<float> floats_;
  std::vector<int64_t> ints_;
  std::vector<std::string_view> bytes_;
};

}  // namespace

ConvertSummary ConvertDataset(const pipeline::Dataset& dataset,
                              const DatasetRecords& records,
                              const ConvertJob& job) {
  if (records.element_records && !records.record_key.empty()) {
    InputError(
        "ConvertDataset: element_records writes whole elements; record_key "
        "names one component to write instead: give one of them");
  }
  ConvertJob own = job;
  own.format = "dataset";  // no labels file
  return ConvertSource(own, std::make_unique<DatasetSource>(dataset, records));
}

namespace {

constexpr std::string_view kSavedFormat = "recflow-saved-dataset";
constexpr int kSavedVersion = 1;

std::string ManifestPath(const std::string& directory) {
  return directory + "/dataset.json";
}

}  // namespace

ConvertSummary SaveDataset(const pipeline::Dataset& dataset,
                           const std::string& directory,
                           const SaveOptions& options) {
  const std::string manifest = ManifestPath(directory);
  if (std::filesystem::exists(manifest)) {
    InputError(fmt::format(
        "{}: already holds a saved dataset ({}); remove it or save elsewhere",
        directory, manifest));
  }
  ConvertJob job;
  job.output = directory + "/elements";
  job.shards = options.shards;
  job.writer.compression = options.compression;
  job.writer.level = options.level;
  job.writer.build_index = true;
  job.progress = options.progress;
  DatasetRecords records;
  records.element_records = true;
  records.threads = options.threads;
  ConvertSummary summary = ConvertDataset(dataset, records, job);
  nlohmann::json m;
  m["format"] = kSavedFormat;
  m["version"] = kSavedVersion;
  m["elements"] = summary.records;
  m["compression"] = records::CompressionName(options.compression);
  m["shards"] = nlohmann::json::array();
  for (const ShardResult& r : summary.shards) {
    m["shards"].push_back(
        {{"file", std::filesystem::path(r.path).filename().string()},
         {"elements", r.records}});
  }
  m["pipeline"] = dataset.Describe();
  records::WritableFile out(manifest, /*atomic=*/true);
  out.Append(m.dump(2) + "\n");
  out.Close();
  return summary;
}

pipeline::Dataset LoadDataset(const std::string& directory,
                              const LoadOptions& options) {
  const std::string manifest = ManifestPath(directory);
  std::ifstream in(manifest);
  if (!in) {
    InputError(fmt::format("{}: no saved dataset here ({} cannot be read: {})",
                           directory, manifest, std::strerror(errno)));
  }
  nlohmann::json m;
  uint64_t elements = 0, counted = 0;
  std::vector<std::string> files;
  try {
    m = nlohmann::json::parse(in);
    if (m.at("format") != std::string(kSavedFormat) ||
        m.at("version") != kSavedVersion) {
      InputError(fmt::format("{}: not a {} of version {}", manifest,
                             kSavedFormat, kSavedVersion));
    }
    elements = m.at("elements").get<uint64_t>();
    for (const auto& shard : m.at("shards")) {
      const std::string file = shard.at("file").get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos) {
        InputError(fmt::format("{}: shard name '{}' is not a file name",
                               manifest, file));
      }
      files.push_back(directory + "/" + file);
      counted += shard.at("elements").get<uint64_t>();
    }
  } catch (const nlohmann::json::exception& e) {
    InputError(fmt::format("{}: not a saved dataset's manifest: {}", manifest,
                           e.what()));
  }
  if (files.empty() || counted != elements) {
    InputError(fmt::format("{}: {} elements in all but {} in its {} shards",
                           manifest, elements, counted, files.size()));
  }
  for (const std::string& f : files) {
    if (!std::filesystem::exists(f)) {
      InputError(fmt::format("{}: shard {} of the saved dataset is missing",
                             directory, f));
    }
  }
  pipeline::MapOptions map;
  map.num_parallel_calls = options.num_parallel_calls;
  map.name = "decode_element";
  if (options.global_shuffle) {
    // The indexes count the records, once, as the source is made.  Counted
    // with the default options (one epoch, one shard): the options' epochs
    // and shard stride change what Cardinality() says.
    const int64_t indexed =
        pipeline::Dataset::FromTFRecordsGlobalShuffle(files).Cardinality();
    if (indexed != static_cast<int64_t>(elements)) {
      InputError(fmt::format(
          "{}: its shards' indexes hold {} records; dataset.json says {}",
          directory, indexed, elements));
    }
    return pipeline::Dataset::FromTFRecordsGlobalShuffle(
               files, *options.global_shuffle)
        .Map(pipeline::maps::DecodeElement(), map);
  }
  return pipeline::Dataset::FromTFRecords(files, options.reading)
      .Map(pipeline::maps::DecodeElement(), map)
      .AssertCardinality(static_cast<int64_t>(elements));
}

}  // namespace recflow::convert
