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
    case DType::kFloat32:
      values = Tensor::Adopt(std::move(f.floats), shape);
      break;
    case DType::kInt64:
      values = Tensor::Adopt(std::move(f.ints), shape);
      break;
    case DType::kBytes:
      values = Tensor::AdoptBytes(std::move(f.bytes_data),
                                  std::move(f.bytes_offsets), shape);
      break;
    default:  // not an Example dtype: ExampleParser refuses such a spec
      break;
  }
  if (fixed || !batched) return values;
  return Tensor::Ragged(
      std::move(values),
      Tensor::Adopt(std::move(f.row_lengths),
                    Shape{static_cast<int64_t>(f.row_lengths.size())}));
}

records::ParseContext Context(const Element& e, int64_t i) {
  const std::optional<Origin> o = e.OriginOf(i);
  if (!o) return {};
  return {*o->file, o->record};
}

class ParseFn {
 public:
  explicit ParseFn(std::shared_ptr<const ParseInfo> info)
      : info_(std::move(info)) {}

  Element operator()(Element in) const {
    const std::string& key = info_->options.record_key;
    const Tensor* records_tensor = in.Find(key);
    if (records_tensor == nullptr || records_tensor->dtype() != DType::kBytes ||
        records_tensor->shape().rank() > 1) {
      throw Error(fmt::format(
          "Parse: the element needs a bytes scalar or vector '{}' of "
          "serialized tf.Examples; it has {}",
          key, in.DebugString()));
    }
    const bool batched = records_tensor->shape().rank() == 1;
    const int64_t n = batched ? records_tensor->shape()[0] : 1;
    std::vector<std::string_view> serialized(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) serialized[i] = records_tensor->bytes(i);

    Element out;
    out.origin = std::move(in.origin);
    out.batch_origins = std::move(in.batch_origins);
    ParseRecords(*info_->parser, serialized, batched, &out);
    if (info_->options.keep_record) {
      out.components.push_back({key, *records_tensor});
    }
    return out;
  }

 private:
  std::shared_ptr<const ParseInfo> info_;
};

}  // namespace

void ParseRecords(const records::ExampleParser& parser,
                  std::span<const std::string_view> serialized, bool batched,
                  Element* out) {
  const auto n = static_cast<int64_t>(serialized.size());
  records::ParsedBatch parsed;
  try {
    parser.ParseBatch(serialized, &parsed,
                      batched ? records::ParseContext{} : Context(*out, 0));
  } catch (const records::ParseError&) {
    if (!batched) throw;
    // Find the bad record and name it with its own origin.
    records::ParsedBatch one;
    for (int64_t i = 0; i < n; ++i) {
      parser.ParseBatch(serialized.subspan(i, 1), &one, Context(*out, i));
    }
    throw;
  }
  for (auto& f : parsed.features) {
    out->components.push_back({f.name, FeatureTensor(f, batched, n)});
  }
}

DatasetPtr Parse(DatasetPtr input, records::FeatureSpec spec,
                 ParseOptions options) {
  MapOptions map;
  map.num_parallel_calls = options.num_parallel_calls;
  map.deterministic = options.deterministic;
  map.name = fmt::format("parse[{:016x}]", Fingerprint(spec.ToJson().dump()));
  auto info = std::make_shared<ParseInfo>();
  info->parser = std::make_shared<records::ExampleParser>(std::move(spec));
  info->options = std::move(options);
  return Map(std::move(input), ParseFn(info), std::move(map), info);
}

}  // namespace recflow::pipeline::stages
