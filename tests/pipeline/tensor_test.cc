// Tensor and Element (tensor.cc): shared storage, views and slices, bytes
// and ragged values, compaction, batch origins, and the errors that name
// what was wrong.
#include "pipeline/tensor.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline_test_util.h"

namespace recflow::pipeline {
namespace {

using testing::RecordingMemory;

TEST(TensorTest, SlicesAndReshapesShareStorage) {
  const float v[] = {1, 2, 3, 4, 5, 6};
  const Tensor t = Tensor::FromValues<float>(v, Shape{3, 2});
  const Tensor row = t.Slice(1);
  EXPECT_EQ(row.shape(), Shape{2});
  EXPECT_EQ(row.data<float>(), t.data<float>() + 2);  // a view, no copy
  EXPECT_EQ(row.values<float>()[1], 4.0f);
  const Tensor flat = t.Reshape(Shape{6});
  EXPECT_EQ(flat.data<float>(), t.data<float>());
  EXPECT_THROW(t.Reshape(Shape{4}), Error);
  EXPECT_THROW(t.data<int64_t>(), Error);  // another dtype
  EXPECT_EQ(t.NumberAt(5), 6.0);
  EXPECT_EQ(Tensor::Scalar<int64_t>(9).scalar<int64_t>(), 9);
  // A tensor with no value (a restored state may hold one where a scalar
  // was saved: the fuzzer found that read of a null pointer).
  try {
    Tensor::Allocate(DType::kInt64, Shape{0}).scalar<int64_t>();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "scalar(): this int64[0] tensor holds no value");
  }
}

// Exclusive: storage recflow made for a tensor and that nothing else
// shares; what Python's DLPack export hands out without a copy.
TEST(TensorTest, ExclusiveIsStorageMadeForTheTensorAndSharedWithNothing) {
  Tensor t =
      Tensor::FromValues<float>(std::vector<float>{1, 2, 3, 4}, Shape{2, 2});
  EXPECT_TRUE(t.Exclusive());
  {
    const Tensor copy = t;  // a cache's, a batch's slice: shared
    EXPECT_FALSE(t.Exclusive());
    EXPECT_FALSE(copy.Exclusive());
    const Tensor row = t.Slice(1);
    EXPECT_FALSE(row.Exclusive());
  }
  EXPECT_TRUE(t.Exclusive());
  Tensor row = t.Slice(0);
  t = Tensor();
  EXPECT_TRUE(row.Exclusive());  // the slice alone holds the storage
  EXPECT_TRUE(Tensor::Allocate(DType::kInt64, Shape{3}).Exclusive());
  // Memory owned elsewhere (a caller's array) never is, held alone or not.
  auto array = std::make_shared<std::vector<float>>(4, 1.0f);
  const float* data = array->data();
  const Tensor view =
      Tensor::View(DType::kFloat32, Shape{4}, data, std::move(array));
  EXPECT_FALSE(view.Exclusive());
  EXPECT_FALSE(view.Compact().Exclusive());  // 16 bytes: Compact keeps it
  // A ragged tensor's values share its storage.
  Tensor ragged = Tensor::Ragged(
      Tensor::FromValues<float>(std::vector<float>{1, 2, 3}, Shape{3}),
      Tensor::FromValues<int64_t>(std::vector<int64_t>{1, 2}, Shape{2}));
  const Tensor values = ragged.FlatValues();
  EXPECT_FALSE(values.ragged());
  EXPECT_FALSE(values.Exclusive());
  ragged = Tensor();
  EXPECT_TRUE(values.Exclusive());
}

TEST(TensorTest, AViewKeepsItsOwnerAliveAndCompactLetsGo) {
  auto block = std::make_shared<std::vector<char>>(1 << 20, 'x');
  std::weak_ptr<std::vector<char>> alive = block;
  const char* data = block->data() + 100;
  Tensor record = Tensor::BytesView(data, 5, block, block->size());
  block.reset();
  ASSERT_FALSE(alive.expired());  // the view holds the block
  EXPECT_EQ(record.bytes(0), "xxxxx");
  EXPECT_FALSE(record.IsCompact());  // 5 bytes keeping 1 MiB
  Tensor own = record.Compact();
  EXPECT_TRUE(own.IsCompact());
  record = Tensor();
  EXPECT_TRUE(alive.expired());  // the compact copy does not
  EXPECT_EQ(own.bytes(0), "xxxxx");
}

// BytesAsUInt8 reads the offsets once: a row sliced out of a batch (its
// values start past the batch's first), a scalar, an empty batch, and
// values of another length, named by index (FirstBytesNotOfLength);
// bytes(k) of a tensor that is not bytes throws.
TEST(TensorTest, BytesAsUInt8ViewsEveryBytesTensorOfOneLength) {
  const std::vector<std::string> s = {"ab", "cd", "ef", "gh", "ij", "kl"};
  const Tensor grid = Tensor::FromStrings(s, Shape{3, 2});
  const Tensor all = grid.BytesAsUInt8();
  EXPECT_EQ(all.shape(), (Shape{3, 2, 2}));
  EXPECT_EQ(all.raw_data(), grid.bytes(0).data());
  const Tensor row = grid.Slice(1);  // "ef", "gh"
  const Tensor raw = row.BytesAsUInt8();
  EXPECT_EQ(raw.shape(), (Shape{2, 2}));
  EXPECT_EQ(raw.raw_data(), grid.bytes(2).data());
  EXPECT_EQ(std::string(raw.raw_data(), 4), "efgh");
  const Tensor one = row.Slice(1);  // "gh", a scalar
  EXPECT_EQ(one.BytesAsUInt8().shape(), (Shape{2}));
  EXPECT_EQ(one.BytesAsUInt8().raw_data(), grid.bytes(3).data());
  const Tensor scalar = Tensor::BytesScalar("xyz");
  EXPECT_EQ(scalar.BytesAsUInt8().shape(), (Shape{3}));
  EXPECT_EQ(std::string(scalar.BytesAsUInt8().raw_data(), 3), "xyz");
  const Tensor none = Tensor::FromStrings(std::vector<std::string>{}, Shape{0});
  EXPECT_EQ(none.BytesAsUInt8().shape(), (Shape{0, 0}));

  const std::vector<std::string> uneven = {"ab", "cd", "e", "fg"};
  const Tensor mixed = Tensor::FromStrings(uneven, Shape{4});
  EXPECT_EQ(mixed.FirstBytesNotOfLength(2), 2);
  EXPECT_EQ(mixed.FirstBytesNotOfLength(1), 0);
  EXPECT_EQ(mixed.Slice(3).FirstBytesNotOfLength(2), 1);  // all of them
  EXPECT_EQ(grid.FirstBytesNotOfLength(2), 6);
  EXPECT_EQ(scalar.FirstBytesNotOfLength(3), 1);
  EXPECT_EQ(scalar.FirstBytesNotOfLength(2), 0);
  EXPECT_EQ(none.FirstBytesNotOfLength(5), 0);
  try {
    Tensor::FromStrings(uneven, Shape{4}).BytesAsUInt8();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "bytes value 2 holds 1 bytes where value 0 holds 2: the values "
              "are not of one length");
  }
  const float f[] = {1, 2};
  try {
    Tensor::FromValues<float>(f, Shape{2}).bytes(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "tensor holds float32, not bytes");
  }
}

TEST(TensorTest, BytesValuesRaggedRowsAndDecodeRaw) {
  const std::vector<std::string> s = {"ab", "cd", "ef"};
  const Tensor t = Tensor::FromStrings(s, Shape{3});
  EXPECT_EQ(t.bytes(2), "ef");
  EXPECT_EQ(t.byte_size(), 6u);
  const Tensor raw = t.BytesAsUInt8();
  EXPECT_EQ(raw.shape(), (Shape{3, 2}));
  EXPECT_EQ(raw.values<uint8_t>()[3], 'd');
  const std::vector<std::string> uneven = {"a", "bc"};
  EXPECT_THROW(Tensor::FromStrings(uneven, Shape{2}).BytesAsUInt8(), Error);

  const int64_t values[] = {1, 2, 3, 4, 5};
  const int64_t lengths[] = {2, 0, 3};
  const Tensor r =
      Tensor::Ragged(Tensor::FromValues<int64_t>(values, Shape{5}),
                     Tensor::FromValues<int64_t>(lengths, Shape{3}));
  EXPECT_TRUE(r.ragged());
  EXPECT_EQ(r.num_rows(), 3);
  EXPECT_EQ(r.Slice(1).num_elements(), 0);
  EXPECT_EQ(r.Slice(2).values<int64_t>()[0], 3);
  const int64_t wrong[] = {2, 2};
  EXPECT_THROW(Tensor::Ragged(Tensor::FromValues<int64_t>(values, Shape{5}),
                              Tensor::FromValues<int64_t>(wrong, Shape{2})),
               Error);
}

// A ragged tensor's rows, of numbers or strings with a shape past the
// first dimension, each where its row starts; a row that is not there, or a
// negative length, is an error rather than a read outside the values.
TEST(TensorTest, RaggedRowsSliceWhereTheyStartAndOnlyThere) {
  std::vector<std::string> s;
  for (int k = 0; k < 12; ++k) s.push_back(std::string(1, char('a' + k)));
  const int64_t lengths[] = {1, 0, 3, 2};  // rows of [length, 2] strings
  const Tensor r =
      Tensor::Ragged(Tensor::FromStrings(s, Shape{6, 2}),
                     Tensor::FromValues<int64_t>(lengths, Shape{4}));
  EXPECT_EQ(r.num_rows(), 4);
  const Tensor row2 = r.Slice(2);
  EXPECT_FALSE(row2.ragged());
  EXPECT_EQ(row2.shape(), (Shape{3, 2}));
  std::string got;
  for (int64_t k = 0; k < row2.num_elements(); ++k) got += row2.bytes(k);
  EXPECT_EQ(got, "cdefgh");
  EXPECT_EQ(r.Slice(3).bytes(3), "l");
  EXPECT_EQ(r.Slice(1).shape(), (Shape{0, 2}));
  EXPECT_EQ(r.row_lengths().values<int64_t>()[2], 3);
  for (int64_t bad : {-1, 4}) {
    try {
      r.Slice(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(
          std::string(e.what()),
          fmt::format("cannot take row {} of a ragged tensor of 4 rows", bad));
    }
  }
  const int64_t negative[] = {3, -1, 4};
  const int64_t values[] = {1, 2, 3, 4, 5, 6};
  try {
    Tensor::Ragged(Tensor::FromValues<int64_t>(values, Shape{6}),
                   Tensor::FromValues<int64_t>(negative, Shape{3}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "row 1 of a ragged tensor has length -1");
  }
  // Sliced from a copy, the same rows (the starts travel with the lengths).
  const Tensor copy = r.Compact();
  EXPECT_EQ(copy.Slice(3).bytes(0), "i");
  EXPECT_TRUE(copy == r);
}

TEST(TensorTest, CopyIntoPutsNumbersAndBytesOfOneLengthInTheMemory) {
  auto memory = std::make_shared<RecordingMemory>();
  {
    const float f[] = {1.5f, -2, 3, 4, 5, 6};
    const Tensor floats = Tensor::FromValues<float>(f, Shape{2, 3});
    const Tensor fc = floats.CopyInto(memory);
    EXPECT_EQ(fc, floats);
    EXPECT_NE(fc.raw_data(), floats.raw_data());
    EXPECT_TRUE(memory->Holds(fc.raw_data(), fc.byte_size()));

    const std::vector<std::string> s = {"abcd", "efgh", "ijkl"};
    const Tensor strings = Tensor::FromStrings(s, Shape{3});
    const Tensor sc = strings.CopyInto(memory);
    EXPECT_EQ(sc, strings);
    EXPECT_TRUE(memory->Holds(sc.bytes(0).data(), 12));
    // decode_raw's form views the copy: what a GPU copies from.
    const Tensor raw = sc.BytesAsUInt8();
    EXPECT_EQ(raw.shape(), (Shape{3, 4}));
    EXPECT_EQ(raw.raw_data(), sc.bytes(0).data());
    // A row of the copy is a view into the same block.
    EXPECT_EQ(sc.Slice(2).bytes(0), "ijkl");

    const Tensor scalar = Tensor::BytesScalar("xyz");
    const Tensor scalar_copy = scalar.CopyInto(memory);
    EXPECT_EQ(scalar_copy, scalar);
    EXPECT_EQ(scalar_copy.shape().rank(), 0);
    EXPECT_TRUE(memory->Holds(scalar_copy.bytes(0).data(), 3));
    EXPECT_EQ(memory->live(), 3u);

    // What has no one-array form stays where it is: bytes of mixed
    // lengths, ragged tensors, no values.
    const std::vector<std::string> uneven = {"a", "bc"};
    const Tensor mixed = Tensor::FromStrings(uneven, Shape{2});
    EXPECT_EQ(mixed.CopyInto(memory).bytes(0).data(), mixed.bytes(0).data());
    const int64_t values[] = {1, 2, 3};
    const int64_t lengths[] = {1, 2};
    const Tensor ragged =
        Tensor::Ragged(Tensor::FromValues<int64_t>(values, Shape{3}),
                       Tensor::FromValues<int64_t>(lengths, Shape{2}));
    EXPECT_EQ(ragged.CopyInto(memory).raw_data(), ragged.raw_data());
    const Tensor none = Tensor::Allocate(DType::kFloat32, Shape{0, 4});
    EXPECT_EQ(none.CopyInto(memory).shape(), (Shape{0, 4}));
    EXPECT_EQ(memory->live(), 3u);

    Element e;
    e.Set("x", floats);
    e.Set("s", strings);
    e.Set("mixed", mixed);
    e.CopyInto(memory);
    EXPECT_EQ(testing::OutsideMemory(e, *memory), "");
    EXPECT_EQ(e["x"], floats);
    EXPECT_EQ(e["mixed"].raw_data(), mixed.raw_data());
    EXPECT_EQ(memory->live(), 5u);
  }
  // Every block went back when its last tensor went.
  EXPECT_EQ(memory->live(), 0u);
  EXPECT_EQ(memory->bad_frees(), 0u);

  const Tensor t = Tensor::Scalar<int64_t>(7);
  auto device = std::make_shared<RecordingMemory>(MemoryKind::kDevice);
  EXPECT_THROW(t.CopyInto(device), Error);
  EXPECT_THROW(t.CopyInto(nullptr), Error);
}

TEST(TensorTest, EqualityAndTheElementsNames) {
  const float a[] = {1, 2};
  const float b[] = {1, 3};
  EXPECT_EQ(Tensor::FromValues<float>(a, Shape{2}),
            Tensor::FromValues<float>(a, Shape{2}));
  EXPECT_FALSE(Tensor::FromValues<float>(a, Shape{2}) ==
               Tensor::FromValues<float>(b, Shape{2}));
  EXPECT_FALSE(Tensor::FromValues<float>(a, Shape{2}) ==
               Tensor::FromValues<float>(a, Shape{1, 2}));
  Element e;
  e.Set("x", Tensor::Scalar<int64_t>(1));
  e.Set("x", Tensor::Scalar<int64_t>(2));  // replaces
  e.Set("y", Tensor::BytesScalar("v"));
  EXPECT_EQ(e.components.size(), 2u);
  EXPECT_EQ(e["x"].scalar<int64_t>(), 2);
  EXPECT_EQ(e.Find("z"), nullptr);
  try {
    (void)e["z"];
    FAIL() << "a missing name was found";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("x"), std::string::npos)
        << err.what();  // lists the names there are
  }
}

// A batch's origins keep each file name once, also when rows come back to
// files met earlier, and give every row back whole: its file, offset,
// record and frame CRC, or no file where it had none.
TEST(TensorTest, BatchOriginsKeepEachFileOnceAndGiveEveryRowBack) {
  std::vector<std::shared_ptr<const std::string>> names;
  for (int f = 0; f < 20; ++f) {
    names.push_back(
        std::make_shared<const std::string>("f" + std::to_string(f)));
  }
  std::vector<Origin> origins;
  for (int i = 0; i < 100; ++i) {
    Origin o;
    // Files in a scattered order that comes back to old ones, as a
    // shuffle's rows do; every seventh row has no file.
    if (i % 7 != 3) o.file = names[static_cast<size_t>((i * 13) % 20)];
    o.offset = static_cast<uint64_t>(1000 + i);
    o.record = static_cast<uint64_t>(i);
    if (i % 2 == 0) o.frame_crc = static_cast<uint32_t>(0xABC00000u + i);
    origins.push_back(o);
  }
  std::vector<const Origin*> pointers;
  for (const Origin& o : origins) pointers.push_back(&o);
  const auto batch = BatchOrigins::Of(pointers);
  ASSERT_NE(batch, nullptr);
  ASSERT_EQ(batch->size(), origins.size());
  EXPECT_EQ(batch->files().size(), names.size());
  for (size_t k = 0; k < batch->files().size(); ++k) {
    for (size_t j = 0; j < k; ++j) {
      EXPECT_NE(batch->files()[k], batch->files()[j]) << k << " " << j;
    }
  }
  for (size_t i = 0; i < origins.size(); ++i) {
    const Origin o = (*batch)[i];
    EXPECT_EQ(o.file, origins[i].file) << i;  // the same name, not a copy
    EXPECT_EQ(o.offset, origins[i].offset) << i;
    EXPECT_EQ(o.record, origins[i].record) << i;
    EXPECT_EQ(o.frame_crc, origins[i].frame_crc) << i;
  }

  Element e;
  e.batch_origins = batch;
  EXPECT_FALSE(e.OriginOf(3).has_value());  // a row with no file
  ASSERT_TRUE(e.OriginOf(4).has_value());
  EXPECT_EQ(e.OriginOf(4)->ToString(), "f12: record 4 at offset 1004");
  EXPECT_FALSE(e.OriginOf(100).has_value());
  EXPECT_FALSE(e.OriginOf(-1).has_value());

  // No file at all: no origins; a row naming a file that is not there is
  // refused.
  Origin none;
  const Origin* just_none[] = {&none};
  EXPECT_EQ(BatchOrigins::Of(just_none), nullptr);
  BatchOrigins::Row bad;
  bad.file = 2;
  EXPECT_THROW(BatchOrigins(std::make_shared<const BatchOrigins::Files>(
                                names.begin(), names.begin() + 2),
                            {bad}),
               Error);
}

}  // namespace
}  // namespace recflow::pipeline
