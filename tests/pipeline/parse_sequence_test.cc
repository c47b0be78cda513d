// ParseSequence (parse.cc): tf.train.SequenceExamples to tensors, one
// record at a time and a batch at a time, checked against protobuf's
// decoding of the same records.
#include <gtest/gtest.h>

#include <vector>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "records/example.pb.h"
#include "records/example_parser.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;

// Record i: context label = i and i tags; feature_lists "frame" (i + 1
// steps of 2 floats) and "tokens" (i + 1 steps, step s holding s + 1
// ints); record 1 has no "tokens" list.
std::vector<std::string> SequenceRecords() {
  std::vector<std::string> out;
  for (int i = 0; i < 3; ++i) {
    tensorflow::SequenceExample ex;
    auto& context = *ex.mutable_context()->mutable_feature();
    context["label"].mutable_int64_list()->add_value(i);
    auto* tags = context["tags"].mutable_bytes_list();
    for (int t = 0; t < i; ++t) tags->add_value("t" + std::to_string(t));
    auto& lists = *ex.mutable_feature_lists()->mutable_feature_list();
    for (int s = 0; s <= i; ++s) {
      auto* frame = lists["frame"].add_feature()->mutable_float_list();
      frame->add_value(static_cast<float>(10 * i + s));
      frame->add_value(0.5f);
      if (i == 1) continue;
      auto* tokens = lists["tokens"].add_feature()->mutable_int64_list();
      for (int k = 0; k <= s; ++k) tokens->add_value(100 * i + 10 * s + k);
    }
    out.push_back(ex.SerializeAsString());
  }
  return out;
}

records::FeatureSpec Spec(const char* json) {
  return records::FeatureSpec::FromJsonText(json);
}

const records::FeatureSpec kContext = Spec(R"({"features": {
    "label": {"kind": "fixed", "dtype": "int64", "shape": []},
    "tags": {"kind": "var", "dtype": "bytes"}}})");
const records::FeatureSpec kSequence = Spec(R"({"features": {
    "frame": {"kind": "fixed", "dtype": "float32", "shape": [2]},
    "tokens": {"kind": "var", "dtype": "int64"}}})");

template <typename T>
std::vector<T> Values(const Tensor& t) {
  const auto v = t.values<T>();
  return std::vector<T>(v.begin(), v.end());
}

class ParseSequenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteRecords(dir_.File("seq.tfrecord"), SequenceRecords());
  }
  Dataset Source() const {
    return Dataset::FromTFRecords({dir_.File("seq.tfrecord")});
  }
  testing::TempDir dir_;
};

TEST_F(ParseSequenceTest, OneRecordGivesStepsByFeatures) {
  const auto e = Collect(Source().ParseSequence(kContext, kSequence));
  ASSERT_EQ(e.size(), 3u);
  // Record 2: 3 steps.
  EXPECT_EQ(e[2]["label"].shape(), Shape{});
  EXPECT_EQ(e[2]["label"].scalar<int64_t>(), 2);
  EXPECT_EQ(e[2]["tags"].shape(), Shape{2});
  EXPECT_EQ(e[2]["tags"].bytes(1), "t1");
  EXPECT_EQ(e[2]["frame"].shape(), (Shape{3, 2}));
  EXPECT_EQ(Values<float>(e[2]["frame"]),
            (std::vector<float>{20, 0.5, 21, 0.5, 22, 0.5}));
  const Tensor& tokens = e[2]["tokens"];
  ASSERT_TRUE(tokens.ragged());  // [steps, (values)]
  EXPECT_EQ(Values<int64_t>(tokens.row_lengths()),
            (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(Values<int64_t>(tokens),
            (std::vector<int64_t>{200, 210, 211, 220, 221, 222}));
  // Record 1 has no "tokens" list: no steps of it.
  EXPECT_EQ(e[1]["tokens"].row_lengths().num_elements(), 0);
  EXPECT_EQ(e[1]["frame"].shape(), (Shape{2, 2}));
}

TEST_F(ParseSequenceTest, ABatchIsRaggedInItsSteps) {
  const auto batches =
      Collect(Source().Batch(3).ParseSequence(kContext, kSequence));
  ASSERT_EQ(batches.size(), 1u);
  const Element& b = batches[0];
  EXPECT_EQ(Values<int64_t>(b["label"]), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(Values<int64_t>(b["tags"].row_lengths()),
            (std::vector<int64_t>{0, 1, 2}));
  // frame: [batch, (steps), 2]
  const Tensor& frame = b["frame"];
  ASSERT_TRUE(frame.ragged());
  EXPECT_EQ(frame.shape(), (Shape{6, 2}));
  EXPECT_EQ(Values<int64_t>(frame.row_lengths()),
            (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(frame.Slice(1).shape(), (Shape{2, 2}));
  // tokens: two ragged dimensions as two components (nested row lengths).
  const Tensor& tokens = b["tokens"];
  ASSERT_TRUE(tokens.ragged());
  EXPECT_EQ(Values<int64_t>(tokens.row_lengths()),
            (std::vector<int64_t>{1, 0, 6}));
  EXPECT_EQ(Values<int64_t>(tokens),
            (std::vector<int64_t>{0, 200, 210, 211, 220, 221, 222}));
  const Tensor& steps = b["tokens/step_lengths"];
  ASSERT_TRUE(steps.ragged());
  EXPECT_EQ(Values<int64_t>(steps.row_lengths()),
            (std::vector<int64_t>{1, 0, 3}));
  EXPECT_EQ(Values<int64_t>(steps), (std::vector<int64_t>{1, 1, 2, 3}));
  // The same values as one record at a time.
  const auto one = Collect(Source().ParseSequence(kContext, kSequence));
  EXPECT_EQ(Values<int64_t>(one[2]["tokens"]),
            Values<int64_t>(tokens.Slice(2)));
}

TEST_F(ParseSequenceTest, ErrorsNameTheRecordAndTheSpecs) {
  // A required context feature missing: the file and the record.
  const records::FeatureSpec needs = Spec(R"({"features": {
      "missing": {"kind": "fixed", "dtype": "int64", "shape": []}}})");
  for (const Dataset& ds :
       {Source().ParseSequence(needs, kSequence),
        Source().Batch(2).ParseSequence(needs, kSequence)}) {
    try {
      Collect(ds);
      ADD_FAILURE() << "a missing feature was accepted";
    } catch (const records::ParseError& e) {
      EXPECT_NE(
          std::string(e.what()).find(dir_.File("seq.tfrecord") + ": record 0"),
          std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(Source().ParseSequence(kSequence, kSequence), Error);
  EXPECT_THROW(Source().ParseSequence(kContext, Spec(R"({"features": {
          "x/step_lengths": {"kind": "var", "dtype": "int64"}}})")),
               Error);
  // Not records: says what the element has.
  EXPECT_THROW(Collect(Dataset::Range(0, 2).ParseSequence(kContext, kSequence)),
               Error);
}

// Parse and ParseSequence take their records the same way: a bytes scalar
// or vector; a ragged vector's rows are not records (read as a flat batch
// of its values, a batch's origins would name the wrong records).
TEST_F(ParseSequenceTest, BothParsersNeedAScalarOrVectorOfRecords) {
  const Dataset ragged = Dataset::Range(0, 1).Map([](Element) {
    Element e;
    const std::vector<std::string> values = SequenceRecords();
    const std::vector<int64_t> rows = {2, 1};
    e.Set("record",
          Tensor::Ragged(Tensor::FromStrings(values, Shape{3}),
                         Tensor::FromValues<int64_t>(rows, Shape{2})));
    return e;
  });
  for (const auto& [ds, stage] :
       {std::pair{ragged.ParseSequence(kContext, kSequence),
                  "ParseSequence: the element needs a bytes scalar or vector "
                  "'record' of serialized tf.SequenceExamples"},
        std::pair{ragged.Parse(kContext),
                  "Parse: the element needs a bytes scalar or vector "
                  "'record' of serialized tf.Examples"}}) {
    try {
      Collect(ds);
      ADD_FAILURE() << "a ragged record component was parsed";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(stage, 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace recflow::pipeline
