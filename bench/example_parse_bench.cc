// Parse throughput of the fast Example parser next to protobuf's generic
// ParseFromArray plus extraction of the same features into the same batch
// layout, in the same run, for these shapes of data (the argument is their
// index):
//   mnist:   784 packed floats + an int64 label
//   tabular: ~20 scalar features of all three kinds, some missing (TFX taxi)
//   text:    200 int64 tokens + a bytes field
//   fashion: 784 image bytes + three int64 scalars (label, height, width),
//            serialized by protobuf (its map's key order varies from one
//            Example to the next)
//   fashion_file: the same features as `recflow convert idx` writes them
//            (ExampleBuilder: one key order), each Example where a read
//            block holds it (after the previous record's CRC and its own
//            header), as the pipeline's parse tasks find them
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "records/example.pb.h"
#include "records/example_builder.h"
#include "records/example_parser.h"

namespace {

using namespace recflow::records;

constexpr size_t kBatch = 1024;

struct Shape {
  FeatureSpec spec;
  std::vector<std::string> serialized;
  std::vector<std::string_view> views;
  size_t bytes = 0;
  std::string block;  // fashion_file: the records framed as in a file
};

Shape MakeShape(const std::string& name) {
  Shape s;
  std::mt19937_64 rng(5);
  std::string spec_json;
  for (size_t i = 0; i < kBatch; ++i) {
    tensorflow::Example ex;
    auto& m = *ex.mutable_features()->mutable_feature();
    if (name == "mnist") {
      auto* f = m["image"].mutable_float_list();
      for (int k = 0; k < 784; ++k)
        f->add_value(static_cast<float>(rng() % 256) / 255.f);
      m["label"].mutable_int64_list()->add_value(
          static_cast<int64_t>(rng() % 10));
    } else if (name == "tabular") {
      for (int k = 0; k < 7; ++k) {
        if (rng() % 10 == 0) continue;  // missing (has a default)
        m["float_" + std::to_string(k)].mutable_float_list()->add_value(
            static_cast<float>(rng() % 10000) / 7.f);
      }
      for (int k = 0; k < 7; ++k) {
        if (rng() % 10 == 0) continue;
        m["int_" + std::to_string(k)].mutable_int64_list()->add_value(
            static_cast<int64_t>(rng() % 100000));
      }
      for (int k = 0; k < 6; ++k) {
        if (rng() % 10 == 0) continue;
        m["str_" + std::to_string(k)].mutable_bytes_list()->add_value(
            "value-" + std::to_string(rng() % 1000));
      }
    } else if (name == "fashion_file") {
      std::string image(784, '\0');
      for (char& c : image) c = static_cast<char>(rng() % 256);
      ExampleBuilder b;
      b.AddBytes("image", image)
          .AddInt64("label", static_cast<int64_t>(rng() % 10))
          .AddInt64("height", 28)
          .AddInt64("width", 28);
      s.serialized.emplace_back(b.Serialize());
      s.bytes += s.serialized.back().size();
      continue;
    } else if (name == "fashion") {
      std::string image(784, '\0');
      for (char& c : image) c = static_cast<char>(rng() % 256);
      m["image"].mutable_bytes_list()->add_value(image);
      m["label"].mutable_int64_list()->add_value(
          static_cast<int64_t>(rng() % 10));
      m["height"].mutable_int64_list()->add_value(28);
      m["width"].mutable_int64_list()->add_value(28);
    } else {  // text
      auto* t = m["tokens"].mutable_int64_list();
      for (int k = 0; k < 200; ++k)
        t->add_value(static_cast<int64_t>(rng() % 30000));
      m["text"].mutable_bytes_list()->add_value(std::string(600, 'w'));
    }
    s.serialized.push_back(ex.SerializeAsString());
    s.bytes += s.serialized.back().size();
  }
  if (name == "mnist") {
    spec_json =
        R"({"features": {"image": {"kind": "fixed", "dtype": "float32", "shape": [784]},
                                  "label": {"kind": "fixed", "dtype": "int64", "shape": []}}})";
  } else if (name == "tabular") {
    std::string f;
    for (int k = 0; k < 7; ++k)
      f += "\"float_" + std::to_string(k) +
           "\": {\"dtype\": \"float32\", \"shape\": [], \"default\": 0},";
    for (int k = 0; k < 7; ++k)
      f += "\"int_" + std::to_string(k) +
           "\": {\"dtype\": \"int64\", \"shape\": [], \"default\": 0},";
    for (int k = 0; k < 6; ++k)
      f += "\"str_" + std::to_string(k) +
           "\": {\"dtype\": \"bytes\", \"shape\": [], \"default\": \"\"},";
    f.pop_back();
    spec_json = "{\"features\": {" + f + "}}";
  } else if (name == "fashion" || name == "fashion_file") {
    spec_json =
        R"({"features": {"image": {"kind": "fixed", "dtype": "bytes", "shape": []},
                                  "label": {"kind": "fixed", "dtype": "int64", "shape": []},
                                  "height": {"kind": "fixed", "dtype": "int64", "shape": []},
                                  "width": {"kind": "fixed", "dtype": "int64", "shape": []}}})";
  } else {
    spec_json = R"({"features": {"tokens": {"kind": "var", "dtype": "int64"},
                                  "text": {"kind": "fixed", "dtype": "bytes", "shape": []}}})";
  }
  s.spec = FeatureSpec::FromJsonText(spec_json);
  if (name != "fashion_file") {
    s.views.assign(s.serialized.begin(), s.serialized.end());
    return s;
  }
  // A TFRecord frame around each: 12 bytes of header before, 4 of CRC
  // after (their values do not matter to the parser).
  for (const std::string& r : s.serialized) {
    s.block.append(12, '\0').append(r).append(4, '\0');
  }
  size_t at = 0;
  for (const std::string& r : s.serialized) {
    s.views.emplace_back(s.block.data() + at + 12, r.size());
    at += 16 + r.size();
  }
  return s;
}

const Shape& GetShape(int which) {
  static const Shape shapes[] = {MakeShape("mnist"), MakeShape("tabular"),
                                 MakeShape("text"), MakeShape("fashion"),
                                 MakeShape("fashion_file")};
  return shapes[which];
}

const char* kNames[] = {"mnist", "tabular", "text", "fashion", "fashion_file"};

void BM_FastParse(benchmark::State& state) {
  const Shape& s = GetShape(static_cast<int>(state.range(0)));
  const int threads = static_cast<int>(state.range(1));
  const ExampleParser parser(s.spec);
  ParsedBatch batch;
  for (auto _ : state) {
    parser.ParseBatch(s.views, &batch, {}, threads);
    benchmark::DoNotOptimize(batch.features.data());
  }
  state.SetLabel(kNames[state.range(0)]);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kBatch));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.bytes));
}

// The baseline: protobuf's generic parser, then the spec's features copied
// into the same batch layout.
void BM_ProtobufParse(benchmark::State& state) {
  const Shape& s = GetShape(static_cast<int>(state.range(0)));
  ParsedBatch out;
  for (const auto& [name, c] : s.spec.features) {
    ParsedFeature f;
    f.name = name;
    f.config = c;
    out.features.push_back(f);
  }
  tensorflow::Example ex;
  for (auto _ : state) {
    for (auto& f : out.features) {
      f.floats.clear();
      f.ints.clear();
      f.bytes_data.clear();
      f.bytes_offsets.assign(1, 0);
      f.row_lengths.clear();
    }
    for (const std::string_view v : s.views) {
      ex.ParseFromArray(v.data(), static_cast<int>(v.size()));
      const auto& map = ex.features().feature();
      for (auto& f : out.features) {
        auto it = map.find(f.name);
        const tensorflow::Feature* feature =
            it == map.end() ? nullptr : &it->second;
        size_t n = 0;
        if (f.config.dtype == DType::kFloat32) {
          if (feature) {
            for (float x : feature->float_list().value()) f.floats.push_back(x);
            n = feature->float_list().value_size();
          } else {
            f.floats.push_back(0);
          }
        } else if (f.config.dtype == DType::kInt64) {
          if (feature) {
            for (int64_t x : feature->int64_list().value()) f.ints.push_back(x);
            n = feature->int64_list().value_size();
          } else {
            f.ints.push_back(0);
          }
        } else {
          if (feature) {
            for (const auto& x : feature->bytes_list().value()) {
              f.bytes_data += x;
              f.bytes_offsets.push_back(f.bytes_data.size());
            }
            n = feature->bytes_list().value_size();
          } else {
            f.bytes_offsets.push_back(f.bytes_data.size());
          }
        }
        if (f.config.kind == FeatureConfig::Kind::kVar) {
          f.row_lengths.push_back(static_cast<int64_t>(n));
        }
      }
    }
    benchmark::DoNotOptimize(out.features.data());
  }
  state.SetLabel(kNames[state.range(0)]);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kBatch));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.bytes));
}

const int kCores =
    static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

BENCHMARK(BM_ProtobufParse)
    ->Name("parse/protobuf_baseline")
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({3, 1})
    ->Args({4, 1});
BENCHMARK(BM_FastParse)
    ->Name("parse/fast_1_thread")
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({3, 1})
    ->Args({4, 1});
BENCHMARK(BM_FastParse)
    ->Name("parse/fast_all_threads")
    ->Args({0, kCores})
    ->Args({1, kCores})
    ->Args({2, kCores})
    ->Args({3, kCores})
    ->UseRealTime();

}  // namespace
