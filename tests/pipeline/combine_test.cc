// Zip, Concatenate, SampleFromDatasets, ChooseFromDatasets and Enumerate
// (combine.cc) against tf.data's documented behaviour.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Iota;

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

// Each element's input, for inputs Range(k * 1000, ...), and the values
// each input gave, in the order given.
struct Drawn {
  std::vector<int> input;
  std::vector<std::vector<int64_t>> values;
};
Drawn ByInput(const std::vector<Element>& elements, int inputs) {
  Drawn d;
  d.values.resize(static_cast<size_t>(inputs));
  for (int64_t v : Ints(elements)) {
    d.input.push_back(static_cast<int>(v / 1000));
    d.values[static_cast<size_t>(v / 1000)].push_back(v);
  }
  return d;
}

TEST(CombineTest, SampleDrawsWithTheWeightsEachInputInItsOrder) {
  const std::vector<double> weights = {1, 2, 5};  // 1/8, 2/8, 5/8
  const auto sample = [&](uint64_t seed) {
    return Dataset::SampleFromDatasets(
        {Dataset::Range(0, 1000).Repeat(), Dataset::Range(1000, 2000).Repeat(),
         Dataset::Range(2000, 3000).Repeat()},
        {.weights = weights, .seed = seed});
  };
  constexpr size_t kN = 16000;
  const Drawn d = ByInput(Collect(sample(7), {}, kN), 3);
  ASSERT_EQ(d.input.size(), kN);
  for (size_t i = 0; i < 3; ++i) {
    const double p = weights[i] / 8, n = static_cast<double>(kN);
    // Within 5 standard deviations of the binomial's mean.
    EXPECT_NEAR(static_cast<double>(d.values[i].size()), n * p,
                5 * std::sqrt(n * p * (1 - p)))
        << "input " << i;
    // Each input's elements in its own order, none skipped.
    for (size_t k = 0; k < d.values[i].size(); ++k) {
      ASSERT_EQ(d.values[i][k], static_cast<int64_t>(i * 1000 + k % 1000));
    }
  }
  // A seed gives one stream; another seed another.
  EXPECT_EQ(ByInput(Collect(sample(7), {}, 500), 3).input,
            std::vector<int>(d.input.begin(), d.input.begin() + 500));
  EXPECT_NE(ByInput(Collect(sample(8), {}, 500), 3).input,
            std::vector<int>(d.input.begin(), d.input.begin() + 500));
  EXPECT_EQ(
      sample(7).Describe().rfind("SampleFromDatasets([Range(0, 1000, 1)", 0),
      0u)
      << sample(7).Describe();
}

TEST(CombineTest, SampleGoesOnWithTheInputsLeftOrStopsWhenAsked) {
  const auto sample = [](bool stop) {
    return Collect(Dataset::SampleFromDatasets(
        {Dataset::Range(0, 10), Dataset::Range(1000, 1030)},
        {.seed = 11, .stop_on_empty_dataset = stop}));
  };
  // tf.data's default: every element of every input, each in its order.
  const Drawn all = ByInput(sample(false), 2);
  EXPECT_EQ(all.values[0], Iota(0, 10));
  EXPECT_EQ(all.values[1], Iota(1000, 1030));
  // Stopping: the stream ends at the first draw of an input that has
  // ended, so one input is complete and the other is not.
  const Drawn some = ByInput(sample(true), 2);
  ASSERT_LT(some.input.size(), 40u);
  EXPECT_EQ(all.input.size(), 40u);
  const size_t done = some.values[0].size() == 10 ? 0 : 1;
  EXPECT_EQ(some.values[done].size(), done == 0 ? 10u : 30u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& want = i == 0 ? all.values[0] : all.values[1];
    ASSERT_LE(some.values[i].size(), want.size());
    EXPECT_TRUE(
        std::equal(some.values[i].begin(), some.values[i].end(), want.begin()));
  }
  // An input of weight 0 is never read (this one would throw), and the
  // stream ends with the inputs of weight > 0.
  const Dataset never = Dataset::Range(1000, 1005).Map([](Element) -> Element {
    throw Error("read an input of weight 0");
  });
  for (bool stop : {false, true}) {
    EXPECT_EQ(Ints(Collect(Dataset::SampleFromDatasets(
                  {Dataset::Range(0, 5), never},
                  {.weights = {1, 0}, .stop_on_empty_dataset = stop}))),
              Iota(0, 5));
  }
  // An input that is empty from the start.
  EXPECT_EQ(Ints(Collect(Dataset::SampleFromDatasets(
                {Dataset::Range(0, 0), Dataset::Range(0, 5)}, {.seed = 1}))),
            Iota(0, 5));
}

TEST(CombineTest, SampleRedrawsPerEpochOnlyWhenAsked) {
  const auto epochs = [](std::optional<uint64_t> seed, bool rerandomize) {
    const Drawn d = ByInput(
        Collect(Dataset::SampleFromDatasets(
                    {Dataset::Range(0, 20), Dataset::Range(1000, 1020)},
                    {.seed = seed, .rerandomize_each_iteration = rerandomize})
                    .Repeat(2)),
        2);
    EXPECT_EQ(d.input.size(), 80u);
    return std::make_pair(
        std::vector<int>(d.input.begin(), d.input.begin() + 40),
        std::vector<int>(d.input.begin() + 40, d.input.end()));
  };
  const auto same = epochs(5, false);
  EXPECT_EQ(same.first, same.second);
  const auto redrawn = epochs(5, true);
  EXPECT_NE(redrawn.first, redrawn.second);
  EXPECT_EQ(epochs(5, true), redrawn);  // seeded: the same every run
  // Unseeded: each iterator draws its own sequence.
  EXPECT_NE(epochs(std::nullopt, false).first,
            epochs(std::nullopt, false).first);
}

TEST(CombineTest, SampleRefusesBadWeightsAndOtherComponents) {
  const std::vector<Dataset> two = {Dataset::Range(0, 3), Dataset::Range(5, 8)};
  const auto refused = [&](std::vector<double> w) {
    try {
      Dataset::SampleFromDatasets(two, {.weights = std::move(w)});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(refused({1}),
            "SampleFromDatasets: 1 weights for 2 datasets; give one weight "
            "per dataset");
  EXPECT_EQ(refused({1, -0.5}),
            "SampleFromDatasets: weight 1 is -0.5; weights must be finite and "
            ">= 0");
  EXPECT_EQ(refused({std::numeric_limits<double>::quiet_NaN(), 1})
                .rfind("SampleFromDatasets: weight 0 is nan", 0),
            0u);
  EXPECT_EQ(refused({0, 0}),
            "SampleFromDatasets: the weights sum to 0; they must sum to a "
            "finite number > 0");
  EXPECT_THROW(Dataset::SampleFromDatasets({}), Error);
  EXPECT_EQ(ErrorOf(Dataset::SampleFromDatasets(
                {Named(0, 50, "a"), Named(0, 50, "b")}, {.seed = 2})),
            "sample_from_datasets: input 1's elements have components [b], "
            "input 0's [a]; every input must give the same names");
}

TEST(CombineTest, ChooseFollowsTensorFlowsExample) {
  // tf.data: choose_from_datasets([foo, bar, baz], range(3).repeat(3)) ->
  // foo bar baz foo bar baz foo bar baz, each input giving its next.
  const std::vector<Dataset> three = {
      Dataset::Range(10, 20), Dataset::Range(20, 30), Dataset::Range(30, 40)};
  EXPECT_EQ(Ints(Collect(Dataset::ChooseFromDatasets(
                three, Dataset::Range(0, 3).Repeat(3)))),
            (std::vector<int64_t>{10, 20, 30, 11, 21, 31, 12, 22, 32}));
  // int32 choices, under any name.
  const Dataset int32 = Dataset::Range(0, 3).Map([](Element e) {
    Element out;
    out.Set("pick", Tensor::Scalar<int32_t>(static_cast<int32_t>(
                        2 - e["value"].scalar<int64_t>())));
    return out;
  });
  EXPECT_EQ(Ints(Collect(Dataset::ChooseFromDatasets(three, int32))),
            (std::vector<int64_t>{30, 20, 10}));
}

TEST(CombineTest, ChooseStopsOnAnEndedInputOrSkipsIt) {
  const std::vector<Dataset> inputs = {Dataset::Range(0, 2),
                                       Dataset::Range(10, 20)};
  const Dataset choices = Dataset::FromTensorSlices([] {
    Element e;
    const std::vector<int64_t> c = {0, 0, 0, 1, 0, 1};
    e.Set("c", Tensor::FromValues<int64_t>(c, Shape{6}));
    return e;
  }());
  EXPECT_EQ(Ints(Collect(Dataset::ChooseFromDatasets(inputs, choices))),
            (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(Ints(Collect(Dataset::ChooseFromDatasets(inputs, choices, false))),
            (std::vector<int64_t>{0, 1, 10, 11}));
  // Without stopping, the stream ends once every input has ended, even
  // while choices go on.
  EXPECT_EQ(Ints(Collect(Dataset::ChooseFromDatasets(
                {Dataset::Range(0, 2), Dataset::Range(10, 11)},
                Dataset::Range(0, 2).Repeat(), false))),
            (std::vector<int64_t>{0, 10, 1}));
}

TEST(CombineTest, ChooseRefusesABadChoiceNamingIt) {
  const std::vector<Dataset> three = {
      Dataset::Range(10, 20), Dataset::Range(20, 30), Dataset::Range(30, 40)};
  EXPECT_EQ(
      ErrorOf(Dataset::ChooseFromDatasets(three, Dataset::Range(0, 5))),
      "ChooseFromDatasets: choice 3 is 3, not in [0, 3) (the datasets given)");
  EXPECT_EQ(ErrorOf(Dataset::ChooseFromDatasets(three, Dataset::Range(-1, 0))),
            "ChooseFromDatasets: choice 0 is -1, not in [0, 3) (the datasets "
            "given)");
  const Dataset floats = Dataset::Range(0, 2).Map([](Element) {
    Element out;
    out.Set("c", Tensor::Scalar<float>(1.0f));
    return out;
  });
  EXPECT_EQ(ErrorOf(Dataset::ChooseFromDatasets(three, floats)),
            "ChooseFromDatasets: choice 0 is [c: float32 []]; each element "
            "of the choice dataset must be one int64 or int32 scalar");
  // The error uses up its choice: skipping errors goes on after it.
  EXPECT_EQ(Ints(Collect(Dataset::ChooseFromDatasets(
                             three, Dataset::Range(0, 5).Map([](Element e) {
                               const int64_t v = e["value"].scalar<int64_t>();
                               return testing::Int((v * 2) % 5);
                             }))
                             .IgnoreErrors())),
            (std::vector<int64_t>{10, 30, 20}));  // choices 0 2 (4) 1 (3)
  EXPECT_THROW(Dataset::ChooseFromDatasets({}, Dataset::Range(0, 1)), Error);
}

}  // namespace
}  // namespace recflow::pipeline
