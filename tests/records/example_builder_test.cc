#include "records/example_builder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "records/example.pb.h"
#include "records/example_parser.h"
#include "records/wire_format.h"

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

// Many features of every kind, with names, values and lists whose sizes
// cross the varints' one- and two-byte bounds (127/128, 16383/16384),
// built into one builder, cleared and reused: byte for byte protobuf's
// encoding of each feature, in the order added, and the Example's tag and
// length before them.
TEST(ExampleBuilderTest, BytesEqualProtobufsFeatureByFeature) {
  std::mt19937_64 rng(11);
  const std::vector<size_t> sizes = {
      0, 1, 2, 15, 16, 127, 128, 129, 2047, 4095, 4096, 16383, 16384, 20000};
  auto size = [&] { return sizes[rng() % sizes.size()]; };
  ExampleBuilder b;
  for (int example = 0; example < 40; ++example) {
    b.Clear();
    std::string want_features;
    const int features = static_cast<int>(rng() % 8);
    for (int f = 0; f < features; ++f) {
      // Not empty: protobuf leaves out a map entry's empty key, which the
      // builder writes (both read back the same).
      const std::string name(std::clamp<size_t>(size(), 1, 300), 'a' + f);
      tensorflow::Features one;
      tensorflow::Feature& feature = (*one.mutable_feature())[name];
      switch (rng() % 5) {
        case 0: {  // int64s, of every varint length, negatives too
          std::vector<int64_t> v(size() / 8);
          for (int64_t& x : v) {
            x = static_cast<int64_t>(rng() >> (rng() % 64));
            if (rng() % 4 == 0) x = -x;
          }
          b.AddInt64List(name, v);
          feature.mutable_int64_list()->mutable_value()->Assign(v.begin(),
                                                                v.end());
          break;
        }
        case 1: {
          std::vector<float> v(size() / 4);
          for (float& x : v) x = static_cast<float>(rng() % 1000) / 7;
          b.AddFloatList(name, v);
          feature.mutable_float_list()->mutable_value()->Assign(v.begin(),
                                                                v.end());
          break;
        }
        case 2: {
          std::vector<std::string> v(rng() % 4);
          for (std::string& x : v) x.assign(size(), static_cast<char>(rng()));
          b.AddBytesList(name, v);
          feature.mutable_bytes_list();  // set, if empty
          for (const std::string& x : v)
            feature.mutable_bytes_list()->add_value(x);
          break;
        }
        case 3: {
          const int64_t x = static_cast<int64_t>(rng());
          b.AddInt64(name, x);
          feature.mutable_int64_list()->add_value(x);
          break;
        }
        default: {
          const std::string x(size(), 'v');
          b.AddBytes(name, x);
          feature.mutable_bytes_list()->add_value(x);
          break;
        }
      }
      want_features += one.SerializeAsString();
    }
    tensorflow::Example want;
    ASSERT_TRUE(want.mutable_features()->ParseFromString(want_features));
    // Field 1 of the Example, holding the features in the order added
    // (protobuf's own serializer may order a map's entries otherwise).
    std::string expected;
    wire::PutLengthDelimited(expected, 1, want_features);
    const std::string got(b.Serialize());
    size_t differ = 0;
    while (differ < got.size() && differ < expected.size() &&
           got[differ] == expected[differ]) {
      ++differ;
    }
    ASSERT_EQ(got, expected)
        << "example " << example << ", from byte " << differ;
    // Serializing again changes nothing.
    ASSERT_EQ(std::string(b.Serialize()), expected);
  }
}

}  // namespace
}  // namespace recflow::records
