// Zip, Concatenate and Enumerate (combine.cc) against tf.data's
// documented behaviour.
#include <gtest/gtest.h>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;

// {name: value} for each element of Range(start, stop).
Dataset Named(int64_t start, int64_t stop, const std::string& name) {
  return Dataset::Range(start, stop).Map([name](Element e) {
    Element out;
    out.Set(name, e["value"]);
    return out;
  });
}

std::string ErrorOf(const Dataset& ds) {
  try {
    Collect(ds);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CombineTest, ZipPairsElementsAndEndsWithTheShortest) {
  // tf.data: zip((range(1, 4), range(4, 7))) -> (1, 4), (2, 5), (3, 6);
  // inputs of unequal length stop at the shortest.
  const auto zipped =
      Collect(Dataset::Zip({Named(1, 4, "a"), Named(4, 9, "b")}));
  EXPECT_EQ(Ints(zipped, "a"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(Ints(zipped, "b"), (std::vector<int64_t>{4, 5, 6}));
  ASSERT_EQ(zipped[0].components.size(), 2u);
  EXPECT_EQ(zipped[0].components[0].name, "a");  // the inputs' order
  EXPECT_EQ(Collect(Dataset::Zip({Named(0, 5, "a"), Named(0, 0, "b")})).size(),
            0u);
  // Three inputs, and the description every state is checked against.
  const Dataset three =
      Dataset::Zip({Named(0, 3, "a"), Named(0, 3, "b"), Named(0, 3, "c")});
  EXPECT_EQ(Collect(three).size(), 3u);
  EXPECT_EQ(three.Describe().rfind("Zip(Range(0, 3, 1).Map(map), ", 0), 0u)
      << three.Describe();
}

TEST(CombineTest, ZipRefusesANameInTwoInputs) {
  EXPECT_EQ(ErrorOf(Dataset::Zip({Named(0, 3, "a"), Named(0, 3, "a")})),
            "Zip: input 1 has a component 'a', as an input before it does; "
            "rename one (Map) so that each name is one input's");
  EXPECT_THROW(Dataset::Zip({}), Error);
}

TEST(CombineTest, ZippedShufflesWithOneSeedStayAligned) {
  // Features and labels shuffled apart with the same seed stay paired, in
  // every epoch, as in tf.data.
  auto zip_with_itself = [](const Dataset& s) {
    return Collect(Dataset::Zip({s, s.Map([](Element x) {
                                   Element out;
                                   out.Set("other", x["value"]);
                                   return out;
                                 })})
                       .Repeat(3));
  };
  const auto e = zip_with_itself(Dataset::Range(0, 200).Shuffle(200, 7));
  const std::vector<int64_t> values = Ints(e, "value");
  EXPECT_EQ(values, Ints(e, "other"));
  // ... and still reshuffle each epoch.
  EXPECT_NE(std::vector<int64_t>(values.begin(), values.begin() + 200),
            std::vector<int64_t>(values.begin() + 200, values.begin() + 400));
}

TEST(CombineTest, ConcatenateFollowsTensorFlowsExample) {
  // tf.data's example: range(1, 4).concatenate(range(4, 8)) -> 1..7.
  EXPECT_EQ(
      Ints(Collect(Dataset::Range(1, 4).Concatenate(Dataset::Range(4, 8)))),
      (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  // An empty side, and a repeat of the whole (each epoch both inputs).
  EXPECT_EQ(
      Ints(Collect(Dataset::Range(0, 0).Concatenate(Dataset::Range(4, 6)))),
      (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(
      Ints(Collect(
          Dataset::Range(0, 2).Concatenate(Dataset::Range(7, 8)).Repeat(2))),
      (std::vector<int64_t>{0, 1, 7, 0, 1, 7}));
}

TEST(CombineTest, ConcatenateRefusesOtherComponents) {
  EXPECT_EQ(ErrorOf(Named(0, 2, "a").Concatenate(Named(0, 2, "b"))),
            "Concatenate: the second input's elements have components [b], "
            "the first's [a]");
}

TEST(CombineTest, EnumerateAddsTheIndex) {
  // tf.data: range(5, 8).enumerate(start=5) -> (5, 5), (6, 6), (7, 7).
  const auto e = Collect(Dataset::Range(5, 8).Enumerate(5));
  EXPECT_EQ(Ints(e, "index"), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(Ints(e, "value"), (std::vector<int64_t>{5, 6, 7}));
  const auto batched = Collect(Dataset::Range(0, 5).Enumerate(0, "i").Batch(2));
  EXPECT_EQ(Ints(batched, "i"), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ErrorOf(Dataset::Range(0, 2).Enumerate(0, "value")),
            "Enumerate: the elements already have a component 'value'; "
            "give the index another name");
  EXPECT_THROW(Dataset::Range(0, 2).Enumerate(0, ""), Error);
}

}  // namespace
}  // namespace recflow::pipeline
