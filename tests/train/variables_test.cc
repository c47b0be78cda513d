// VariableStore: variables by name, made once, initialised from the seed and
// the name alone, and restored from a checkpoint's values.
#include "train/variables.h"

#include <gtest/gtest.h>

#include <algorithm>
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

}  // namespace
}  // namespace recflow::train
