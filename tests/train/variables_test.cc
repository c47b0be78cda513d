// VariableStore: variables by name, made once, initialised from the seed and
// the name alone, and restored from a checkpoint's values.
#include "train/variables.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <vector>

#include "train/error.h"

namespace recflow::train {
namespace {

std::vector<float> Values(const Variable& v) {
  const float* p = v.value.data<float>();
  return std::vector<float>(p, p + v.value.num_elements());
}

TEST(VariablesTest, MadeOnceByNameAndRefusedInAnotherShape) {
  VariableStore store(3);
  Variable& a = store.GetOrCreate("a", Shape{2, 3}, Initializer::Ones());
  EXPECT_EQ(&store.GetOrCreate("a", Shape{2, 3}, Initializer::Zeros()), &a);
  EXPECT_EQ(Values(a), std::vector<float>(6, 1.0f));  // not re-initialised
  EXPECT_THROW(store.GetOrCreate("a", Shape{3, 2}, Initializer::Ones()), Error);
  store.GetOrCreate("step", Shape{}, Initializer::Zeros(), false);
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.trainable().size(), 1u);
  EXPECT_EQ(store.all()[1]->name, "step");
  EXPECT_EQ(store.Find("missing"), nullptr);
}

TEST(VariablesTest, InitialValuesDependOnTheSeedAndNameNotTheOrder) {
  VariableStore first(11), second(11), other_seed(12);
  const Initializer glorot = Initializer::GlorotUniform();
  first.GetOrCreate("x", Shape{30, 20}, glorot);
  first.GetOrCreate("y", Shape{30, 20}, glorot);
  second.GetOrCreate("y", Shape{30, 20}, glorot);
  second.GetOrCreate("x", Shape{30, 20}, glorot);
  other_seed.GetOrCreate("x", Shape{30, 20}, glorot);
  EXPECT_EQ(Values(*first.Find("x")), Values(*second.Find("x")));
  EXPECT_NE(Values(*first.Find("x")), Values(*first.Find("y")));
  EXPECT_NE(Values(*first.Find("x")), Values(*other_seed.Find("x")));
  // Glorot uniform: within +-sqrt(6 / (fan_in + fan_out)).
  const float limit = std::sqrt(6.0f / 50);
  for (float v : Values(*first.Find("x"))) {
    EXPECT_LE(std::fabs(v), limit);
  }
}

TEST(VariablesTest, RestoredValuesReplaceInitialisationAndMismatchesSaySo) {
  VariableStore store(1);
  Variable& early = store.GetOrCreate("early", Shape{2}, Initializer::Zeros());
  const float saved[] = {4, 5};
  std::map<std::string, Tensor> values;
  values["early"] = Tensor::FromValues<float>(saved, Shape{2});
  values["late"] = Tensor::FromValues<float>(saved, Shape{2});
  values["unused"] = Tensor::FromValues<float>(saved, Shape{2});
  values["wrong"] = Tensor::FromValues<float>(saved, Shape{2});
  store.Restore(values, "model.ckpt-9");
  EXPECT_EQ(Values(early), (std::vector<float>{4, 5}));  // applied at once
  Variable& late = store.GetOrCreate("late", Shape{2}, Initializer::Ones());
  EXPECT_EQ(Values(late), (std::vector<float>{4, 5}));
  try {
    store.GetOrCreate("wrong", Shape{1, 2}, Initializer::Ones());
    FAIL() << "a restored value of another shape was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.ckpt-9"), std::string::npos)
        << e.what();
  }
  const auto unused = store.UnusedRestoredNames();
  EXPECT_NE(std::find(unused.begin(), unused.end(), "unused"), unused.end());
}

// A checkpoint that lacks a variable, or holds it as another dtype, is
// refused by name, whether the variable was made before the restore or
// after it.
TEST(VariablesTest, ACheckpointLackingAVariableIsRefusedByName) {
  const float saved[] = {4, 5};
  const auto error = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  VariableStore before(1);
  before.GetOrCreate("w", Shape{2}, Initializer::Zeros());
  EXPECT_EQ(error([&] {
              before.Restore(
                  {{"v", Tensor::FromValues<float>(saved, Shape{2})}},
                  "ckpt-1");
            }),
            "checkpoint ckpt-1 holds no variable w (shape [2])");
  VariableStore typed(1);
  typed.GetOrCreate("w", Shape{2}, Initializer::Zeros());
  const int64_t ints[] = {4, 5};
  EXPECT_EQ(error([&] {
              typed.Restore(
                  {{"w", Tensor::FromValues<int64_t>(ints, Shape{2})}},
                  "ckpt-2");
            }),
            "checkpoint ckpt-2 holds variable w as int64 [2]; the model has "
            "float32 [2]");
  VariableStore after(1);
  after.Restore({{"v", Tensor::FromValues<float>(saved, Shape{2})}}, "ckpt-3");
  EXPECT_EQ(
      error([&] { after.GetOrCreate("w", Shape{2}, Initializer::Zeros()); }),
      "checkpoint ckpt-3 holds no variable w (shape [2]); it was written "
      "by another model");
}

// The random initialisers' distributions: He normal is Keras's truncated
// normal (cut at two standard deviations, widened by 1 / 0.8796 so that
// what remains has stddev sqrt(2 / fan_in)); random normal has the stddev
// it is given and mean 0.
TEST(VariablesTest, RandomInitialisersHaveTheirDistributions) {
  const auto stats = [](const Variable& v) {
    const std::vector<float> x = Values(v);
    double sum = 0, squares = 0, most = 0;
    for (float f : x) {
      sum += f;
      squares += double{f} * f;
      most = std::max(most, std::fabs(double{f}));
    }
    const double n = static_cast<double>(x.size());
    const double mean = sum / n;
    return std::array<double, 3>{mean, std::sqrt(squares / n - mean * mean),
                                 most};
  };
  VariableStore store(5);
  // A 3x3 conv of 16 -> 64 channels: fan_in 144.
  const auto he = stats(
      store.GetOrCreate("he", Shape{3, 3, 16, 64}, Initializer::HeNormal()));
  const double want = std::sqrt(2.0 / 144);
  EXPECT_NEAR(he[0], 0, 0.02 * want);
  EXPECT_NEAR(he[1], want, 0.03 * want);
  EXPECT_LE(he[2], 2 * want / 0.87962566103423978);
  EXPECT_GT(he[2], 1.9 * want / 0.87962566103423978);  // it is truncated there
  const auto normal = stats(
      store.GetOrCreate("n", Shape{200, 100}, Initializer::RandomNormal(0.5f)));
  EXPECT_NEAR(normal[0], 0, 0.01);
  EXPECT_NEAR(normal[1], 0.5, 0.015);
  EXPECT_GT(normal[2], 3 * 0.5);  // not truncated
  const auto uniform = stats(store.GetOrCreate(
      "u", Shape{200, 100}, Initializer::RandomUniform(0.3f)));
  EXPECT_NEAR(uniform[1], 0.3 / std::sqrt(3.0), 0.01);
  EXPECT_LE(uniform[2], 0.3);
}

}  // namespace
}  // namespace recflow::train
