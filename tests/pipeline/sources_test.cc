// Range, Counter, Random, Tensors, TensorSlices (sources.cc) and ListFiles
// against tf.data's documented behaviour.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "records/file_list.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Iota;

TEST(SourcesTest, RangeCountsLikePython) {
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 5))), Iota(0, 5));
  EXPECT_EQ(Ints(Collect(Dataset::Range(5, 0, -2))),
            (std::vector<int64_t>{5, 3, 1}));
  EXPECT_TRUE(Collect(Dataset::Range(3, 3)).empty());
}

TEST(SourcesTest, CounterCountsWithoutEnd) {
  EXPECT_EQ(Ints(Collect(Dataset::Counter().Take(3))), Iota(0, 3));
  EXPECT_EQ(Ints(Collect(Dataset::Counter(5, -2).Take(4))),
            (std::vector<int64_t>{5, 3, 1, -1}));
  EXPECT_EQ(Ints(Collect(Dataset::Counter(7, 0).Take(3))),
            (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(Dataset::Counter().Cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Dataset::Counter(2, 3).Describe(), "Counter(2, 3)");
  // tf.data's idiom: zip a dataset with a counter.
  const auto zipped = Collect(Dataset::Zip(
      {Dataset::Range(10, 13), Dataset::Counter(100).Map([](Element e) {
         Element out;
         out.Set("n", e["value"]);
         return out;
       })}));
  EXPECT_EQ(Ints(zipped, "n"), Iota(100, 103));
}

TEST(SourcesTest, RandomIsUniformEndlessAndSeeded) {
  const std::vector<int64_t> a = Ints(Collect(Dataset::Random(3).Take(2000)));
  EXPECT_EQ(a, Ints(Collect(Dataset::Random(3).Take(2000))));
  EXPECT_NE(a, Ints(Collect(Dataset::Random(4).Take(2000))));
  EXPECT_EQ(Dataset::Random(3).Cardinality(), kInfiniteCardinality);
  // Over every int64 value: each of the 64 bits set about half the time.
  EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), a.size());
  for (int bit = 0; bit < 64; ++bit) {
    int set = 0;
    for (int64_t v : a) set += (static_cast<uint64_t>(v) >> bit) & 1;
    EXPECT_GT(set, 850) << "bit " << bit;
    EXPECT_LT(set, 1150) << "bit " << bit;
  }
  // Each epoch the same sequence (tf.data's default), or a new one.
  const auto same = Ints(Collect(Dataset::Random(5).Take(4).Repeat(2)));
  EXPECT_EQ(std::vector<int64_t>(same.begin(), same.begin() + 4),
            std::vector<int64_t>(same.begin() + 4, same.end()));
  const auto fresh = Ints(Collect(Dataset::Random(5, true).Take(4).Repeat(2)));
  EXPECT_NE(std::vector<int64_t>(fresh.begin(), fresh.begin() + 4),
            std::vector<int64_t>(fresh.begin() + 4, fresh.end()));
  // Unseeded: the iterator's own seed, so two iterators differ.
  EXPECT_NE(Ints(Collect(Dataset::Random().Take(8))),
            Ints(Collect(Dataset::Random().Take(8))));
}

std::vector<std::string> Filenames(const std::vector<Element>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.emplace_back(e["filename"].bytes(0));
  return out;
}

TEST(SourcesTest, ListFilesGivesEveryMatchSortedOrShuffledEachEpoch) {
  testing::TempDir dir;
  std::vector<std::string> files;
  for (int f = 0; f < 12; ++f) {
    files.push_back(dir.File(fmt::format("part-{:02}.tfrecord", f)));
    testing::WriteRecords(files.back(),
                          std::vector<std::string>{fmt::format("file {}", f)});
  }
  testing::WriteFileBytes(dir.File("notes.txt"), "x");
  const std::string pattern = dir.File("part-*.tfrecord");
  EXPECT_EQ(Filenames(Collect(Dataset::ListFiles({pattern}, false))), files);
  // Two patterns: their matches sorted together, every file (not only
  // record files), a name both match twice, as tf.io.matching_files.
  std::vector<std::string> both = files;
  both.push_back(dir.File("notes.txt"));
  both.push_back(files[3]);
  std::sort(both.begin(), both.end());
  EXPECT_EQ(Filenames(Collect(Dataset::ListFiles(
                {dir.File("*.txt"), dir.File("part-03*"), pattern}, false))),
            both);
  // Shuffled: the same files, in an order the seed fixes, new each epoch.
  const Dataset shuffled = Dataset::ListFiles({pattern}, true, 7);
  const auto order = Filenames(Collect(shuffled));
  EXPECT_NE(order, files);
  EXPECT_EQ(std::multiset<std::string>(order.begin(), order.end()),
            std::multiset<std::string>(files.begin(), files.end()));
  EXPECT_EQ(Filenames(Collect(Dataset::ListFiles({pattern}, true, 7))), order);
  const auto two = Filenames(Collect(shuffled.Repeat(2)));
  EXPECT_NE(std::vector<std::string>(two.begin(), two.begin() + 12),
            std::vector<std::string>(two.begin() + 12, two.end()));
  EXPECT_EQ(shuffled.Cardinality(), 12);
  // tf.data's idiom: the files' records through an interleave.
  const auto records = testing::Records(Collect(shuffled.Interleave(
      [](const Element& e) {
        return Dataset::FromTFRecords({std::string(e["filename"].bytes(0))});
      },
      4)));
  EXPECT_EQ(std::multiset<std::string>(records.begin(), records.end()).size(),
            12u);
  EXPECT_EQ(
      std::set<std::string>(records.begin(), records.end()).count("file 11"),
      1u);
  // Nothing matched: an error naming the patterns.
  try {
    Dataset::ListFiles({dir.File("*.csv"), dir.File("none")});
    FAIL() << "no error";
  } catch (const records::FileListError& err) {
    EXPECT_EQ(std::string(err.what()),
              fmt::format("ListFiles: no file matches '{}', '{}'",
                          dir.File("*.csv"), dir.File("none")));
  }
}

TEST(SourcesTest, TensorSlicesAreViewsOfTheArrays) {
  std::vector<float> data(12);
  std::iota(data.begin(), data.end(), 0.0f);
  Element arrays;
  arrays.Set("x",
             Tensor::View(DType::kFloat32, Shape{4, 3}, data.data(), nullptr));
  auto out = Collect(Dataset::FromTensorSlices(arrays));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2]["x"].shape(), (Shape{3}));
  EXPECT_EQ(out[2]["x"].data<float>(), data.data() + 6);  // no copy
}

std::vector<Element> Rest(Iterator& it) {
  std::vector<Element> out;
  while (auto e = it.Next()) out.push_back(std::move(*e));
  return out;
}

TEST(SourcesTest, TensorSlicesNeedArraysOfOneFirstDimension) {
  const auto error = [](Element arrays) {
    try {
      Dataset::FromTensorSlices(std::move(arrays));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error({}), "FromTensorSlices: no arrays given");
  Element scalar;
  scalar.Set("s", Tensor::Scalar<int64_t>(1));
  EXPECT_EQ(error(scalar),
            "FromTensorSlices: 's' is a scalar; arrays need a first dimension "
            "to slice");
  Element uneven;
  uneven.Set("a", Tensor::Allocate(DType::kFloat32, Shape{3}));
  uneven.Set("b", Tensor::Allocate(DType::kInt64, Shape{2, 5}));
  EXPECT_EQ(error(uneven),
            "FromTensorSlices: 'b' has 2 rows, 'a' has 3; all arrays need the "
            "same first dimension");
  Element slices;
  slices.Set("a", Tensor::Allocate(DType::kFloat32, Shape{3}));
  const Dataset ds = Dataset::FromTensorSlices(slices);
  EXPECT_EQ(ds.Describe(), "TensorSlices(a:float32[3])");
  Iterator it = ds.MakeIterator();
  it.Next();
  Iterator restored = ds.MakeIterator();
  restored.Restore(it.Save());
  EXPECT_EQ(Rest(restored).size(), 2u);
}

TEST(SourcesTest, TensorsAreOneElementViewingTheArrays) {
  std::vector<float> data(6, 1.5f);
  Element arrays;
  arrays.Set("x",
             Tensor::View(DType::kFloat32, Shape{2, 3}, data.data(), nullptr));
  arrays.Set("s", Tensor::Scalar<int64_t>(7));  // scalars are whole too
  const Dataset ds = Dataset::FromTensors(arrays);
  EXPECT_EQ(ds.Describe(), "Tensors(x:float32[2, 3], s:int64[])");
  EXPECT_EQ(ds.Cardinality(), 1);
  auto out = Collect(ds.Repeat(3));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2]["x"].shape(), (Shape{2, 3}));
  EXPECT_EQ(out[2]["x"].data<float>(), data.data());  // no copy
  EXPECT_EQ(out[2]["s"].scalar<int64_t>(), 7);
  Iterator it = ds.MakeIterator();
  ASSERT_TRUE(it.Next());
  Iterator restored = ds.MakeIterator();
  restored.Restore(it.Save());
  EXPECT_TRUE(Rest(restored).empty());
  try {
    Dataset::FromTensors({});
    FAIL() << "no arrays accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "FromTensors: no arrays given");
  }
}

// A generator's state is how many elements it gave: a restore makes it
// afresh and skips as many, so a deterministic generator continues exactly;
// one that gives fewer the second time is told so.
TEST(SourcesTest, AGeneratorRestoresByReplayingItsElements) {
  const auto count_to = [](int64_t n) {
    return [n]() -> std::function<std::optional<Element>()> {
      return [i = int64_t{0}, n]() mutable -> std::optional<Element> {
        if (i == n) return std::nullopt;
        return testing::Int(i++);
      };
    };
  };
  const Dataset ds = Dataset::FromGenerator(count_to(5), "five");
  EXPECT_EQ(ds.Describe(), "Generator(five)");
  for (size_t k = 0; k <= 6; ++k) {
    Iterator it = ds.MakeIterator();
    for (size_t i = 0; i < k; ++i) it.Next();
    Iterator restored = ds.MakeIterator();
    restored.Restore(it.Save());
    EXPECT_EQ(Ints(Rest(restored)), Iota(std::min<int64_t>(k, 5), 5))
        << "saved after " << k;
  }
  // Saved at element 4 of one generator, restored with one of 3.
  Iterator it = ds.MakeIterator();
  for (int i = 0; i < 4; ++i) it.Next();
  Iterator shorter = Dataset::FromGenerator(count_to(3), "five").MakeIterator();
  try {
    shorter.Restore(it.Save());
    FAIL() << "restored past the generator's end";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "generator 'five' ended after 3 elements while restoring a "
                  "state at element 4; is it deterministic?"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace recflow::pipeline
