#include "records/example_builder.h"

#include <gtest/gtest.h>

#include "records/example.pb.h"
#include "records/example_parser.h"

namespace recflow::records {
namespace {

TEST(ExampleBuilderTest, ProtobufReadsWhatItWrites) {
  ExampleBuilder b;
  const std::vector<float> floats = {1.5f, -2.f, 0.f};
  const std::vector<int64_t> ints = {-1, 0, int64_t{1} << 62};
  const std::vector<std::string> strings = {"a", "", std::string(300, 'z')};
  b.AddFloatList("f", floats)
      .AddInt64List("i", ints)
      .AddBytesList("s", strings)
      .AddInt64("scalar", 42)
      .AddFloat("x", 0.25f)
      .AddBytes("raw", std::string("\0\x01\xff", 3))
      .AddInt64List("empty", {});
  tensorflow::Example ex;
  ASSERT_TRUE(ex.ParseFromString(std::string(b.Serialize())));
  const auto& m = ex.features().feature();
  EXPECT_EQ(std::vector<float>(m.at("f").float_list().value().begin(),
                               m.at("f").float_list().value().end()),
            floats);
  EXPECT_EQ(std::vector<int64_t>(m.at("i").int64_list().value().begin(),
                                 m.at("i").int64_list().value().end()),
            ints);
  EXPECT_EQ(m.at("s").bytes_list().value_size(), 3);
  EXPECT_EQ(m.at("s").bytes_list().value(2), strings[2]);
  EXPECT_EQ(m.at("scalar").int64_list().value(0), 42);
  EXPECT_EQ(m.at("x").float_list().value(0), 0.25f);
  EXPECT_EQ(m.at("raw").bytes_list().value(0), std::string("\0\x01\xff", 3));
  EXPECT_EQ(m.at("empty").kind_case(), tensorflow::Feature::kInt64List);
  EXPECT_EQ(m.at("empty").int64_list().value_size(), 0);
}

// Byte for byte what protobuf serializes for the same single feature.
TEST(ExampleBuilderTest, BytesEqualProtobufsForOneFeature) {
  tensorflow::Example ex;
  auto* list =
      (*ex.mutable_features()->mutable_feature())["image"].mutable_float_list();
  for (int k = 0; k < 784; ++k) list->add_value(static_cast<float>(k));
  std::vector<float> values(784);
  for (int k = 0; k < 784; ++k) values[k] = static_cast<float>(k);
  ExampleBuilder b;
  b.AddFloatList("image", values);
  EXPECT_EQ(std::string(b.Serialize()), ex.SerializeAsString());
  b.Clear();
  EXPECT_EQ(
      std::string(b.Serialize()),
      tensorflow::Example().SerializeAsString() + std::string("\x0a\x00", 2));
}

}  // namespace
}  // namespace recflow::records
