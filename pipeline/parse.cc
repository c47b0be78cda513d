// Parse: serialized tf.Examples to tensors, through records::ExampleParser.
// A batch of records (a vector) is parsed in one vectorised call; its
// FixedLen outputs are adopted as tensors without a copy.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "pipeline/stages.h"
#include "records/example_parser.h"

namespace recflow::pipeline::stages {
namespace {

Tensor FeatureTensor(records::ParsedFeature& f, bool batched, int64_t n) {
  using Kind = records::FeatureConfig::Kind;
  const bool fixed = f.config.kind == Kind::kFixed;
  Shape shape;
  if (fixed) {
    shape = Shape(std::span<const int64_t>(f.config.shape));
    if (batched) shape = shape.Prepend(n);
  } else {
    shape = Shape{static_cast<int64_t>(f.num_values())};
  }
  Tensor values;
  switch (f.config.dtype) {
    case records::DType::kFloat32:
      values = Tensor::Adopt(std::move(f.floats), shape);
      break;
    case records::DType::kInt64:
      values = Tensor::Adopt(std::move(f.ints), shape);
      break;
    case records::DType::kBytes:
      values = Tensor::AdoptBytes(std::move(f.bytes_data),
                                  std::move(f.bytes_offsets), shape);
      break;
  }
  if (fixed || !batched) return values;
  return Tensor::Ragged(
      std::move(values),
      Tensor::Adopt(std::move(f.row_lengths),
                    Shape{static_cast<int64_t>(f.row_lengths.size())}));
}

class ParseFn {
 public:
  ParseFn(records::FeatureSpec spec, ParseOptions options)
      : parser_(std::make_shared<records::ExampleParser>(std::move(spec))),
        options_(std::move(options)) {}

  Element operator()(Element in) const {
    const Tensor* records_tensor = in.Find(options_.record_key);
    if (records_tensor == nullptr || records_tensor->dtype() != DType::kBytes ||
        records_tensor->shape().rank() > 1) {
      throw Error(fmt::format(
          "Parse: the element needs a bytes scalar or vector '{}' of "
          "serialized tf.Examples; it has {}",
          options_.record_key, in.DebugString()));
    }
    const bool batched = records_tensor->shape().rank() == 1;
    const int64_t n = batched ? records_tensor->shape()[0] : 1;
    std::vector<std::string_view> serialized(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) serialized[i] = records_tensor->bytes(i);

    records::ParsedBatch parsed;
    try {
      parser_->ParseBatch(serialized, &parsed,
                          batched ? records::ParseContext{} : Context(in, 0));
    } catch (const records::ParseError&) {
      if (!batched) throw;
      // Find the bad record and name it with its own origin.
      records::ParsedBatch one;
      for (int64_t i = 0; i < n; ++i) {
        parser_->ParseBatch(std::span(&serialized[i], 1), &one, Context(in, i));
      }
      throw;
    }
    Element out;
    for (auto& f : parsed.features) {
      out.components.push_back({f.name, FeatureTensor(f, batched, n)});
    }
    if (options_.keep_record) {
      out.components.push_back({options_.record_key, *records_tensor});
    }
    out.origin = std::move(in.origin);
    out.batch_origins = std::move(in.batch_origins);
    return out;
  }

 private:
  static records::ParseContext Context(const Element& e, int64_t i) {
    const Origin* o = e.OriginOf(i);
    if (o == nullptr || !o->file) return {};
    return {*o->file, o->record};
  }

  std::shared_ptr<const records::ExampleParser> parser_;
  ParseOptions options_;
};

}  // namespace

DatasetPtr Parse(DatasetPtr input, records::FeatureSpec spec,
                 ParseOptions options) {
  MapOptions map;
  map.num_parallel_calls = options.num_parallel_calls;
  map.deterministic = options.deterministic;
  map.name = fmt::format("parse[{:016x}]", Fingerprint(spec.ToJson().dump()));
  return Map(std::move(input), ParseFn(std::move(spec), std::move(options)),
             std::move(map));
}

}  // namespace recflow::pipeline::stages
