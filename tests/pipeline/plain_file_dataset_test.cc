// Dataset::FromTextLines and FromFixedLengthRecords (plain_file_dataset.cc):
// tf.data's TextLineDataset and FixedLengthRecordDataset.
#include <gtest/gtest.h>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "records/errors.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using records::Compression;
using testing::Collect;
using testing::DrainWithErrors;
using testing::NextOrError;

std::vector<std::string> Values(const Dataset& ds, const std::string& key) {
  std::vector<std::string> out;
  for (const Element& e : Collect(ds)) {
    EXPECT_EQ(e.components.size(), 1u);
    out.emplace_back(e[key].bytes(0));
  }
  return out;
}

// TensorFlow's line reader (BufferedInputStream::ReadLine): the '\n' ends
// a line and is dropped, every '\r' is dropped wherever it is, empty lines
// count, and a last line without '\n' counts unless nothing is left of it.
TEST(PlainFileDatasetTest, LinesAreSplitAsTensorFlowSplitsThem) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.txt"),
                          "one\r\n\ntwo\rparts\n\r\nlast without newline");
  testing::WriteFileBytes(dir.File("b.txt"), "x\n\r");  // "\r": no line
  testing::WriteFileBytes(dir.File("c.txt"), "");
  testing::WriteFileBytes(dir.File("d.txt"), "y\n");
  const Dataset ds =
      Dataset::FromTextLines({dir.File("a.txt"), dir.File("b.txt"),
                              dir.File("c.txt"), dir.File("d.txt")});
  EXPECT_EQ(Values(ds, "line"),
            (std::vector<std::string>{"one", "", "twoparts", "",
                                      "last without newline", "x", "y"}));
  // Each element says where it came from: file, line, offset.
  const std::vector<Element> all = Collect(ds);
  EXPECT_EQ(*all[2].origin.file, dir.File("a.txt"));
  EXPECT_EQ(all[2].origin.record, 2u);
  EXPECT_EQ(all[2].origin.offset, 6u);
  EXPECT_EQ(*all[6].origin.file, dir.File("d.txt"));
  EXPECT_EQ(all[6].origin.record, 0u);
  EXPECT_EQ(ds.Cardinality(), kUnknownCardinality);
  EXPECT_NE(ds.Describe().find("TextLines(4 files"), std::string::npos)
      << ds.Describe();
}

// Every compression gives the same lines, whatever the read size (a 5-byte
// buffer grows to hold a long line, and splits every other one).
TEST(PlainFileDatasetTest, CompressedFilesAndSmallBuffersGiveTheSameLines) {
  testing::TempDir dir;
  std::string text;
  std::vector<std::string> want;
  for (int i = 0; i < 300; ++i) {
    want.push_back(std::string(static_cast<size_t>(i % 37), 'a' + i % 26) +
                   std::to_string(i));
    text += want.back() + (i % 3 == 0 ? "\r\n" : "\n");
  }
  for (const Compression c : testing::kAllCompressions) {
    SCOPED_TRACE(std::string(records::CompressionName(c)));
    const std::string path = dir.File("t.txt");
    testing::WriteFileBytes(path, testing::Compressed(text, c));
    for (const size_t buffer : {size_t{5}, size_t{256} << 10}) {
      PlainFileOptions o;
      o.compression = c;
      o.buffer_bytes = buffer;
      EXPECT_EQ(Values(Dataset::FromTextLines({path}, o), "line"), want);
    }
  }
}

// Without a compression given, each file's name says: .gz, .zz/.zlib and
// .zst/.zstd are decoded; other names are read as they are, even where
// their first bytes are a codec's magic.
TEST(PlainFileDatasetTest, CompressionComesFromEachFilesName) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.txt.gz"),
                          testing::Compressed("gz\n", Compression::kGzip));
  testing::WriteFileBytes(dir.File("b.txt.zst"),
                          testing::Compressed("zst\n", Compression::kZstd));
  testing::WriteFileBytes(dir.File("c.txt.zz"),
                          testing::Compressed("zz\n", Compression::kZlib));
  testing::WriteFileBytes(dir.File("d.bin"), "\x1f\x8b\n");
  EXPECT_EQ(Values(Dataset::FromTextLines(
                       {dir.File("a.txt.gz"), dir.File("b.txt.zst"),
                        dir.File("c.txt.zz"), dir.File("d.bin")}),
                   "line"),
            (std::vector<std::string>{"gz", "zst", "zz", "\x1f\x8b"}));
  PlainFileOptions o;
  o.compression = Compression::kNone;  // given: every file as it is
  const std::vector<std::string> raw =
      Values(Dataset::FromTextLines({dir.File("a.txt.gz")}, o), "line");
  ASSERT_FALSE(raw.empty());
  EXPECT_EQ(raw[0].substr(0, 2), "\x1f\x8b");
}

// Saved after any element or error, a restored iterator gives exactly the
// rest, in every compression: lines after the position, the next file
// after a damaged one (whose lines before the damage came first).
TEST(PlainFileDatasetTest, ARestoredIteratorContinuesAfterEveryLineAndError) {
  testing::TempDir dir;
  for (const Compression c : testing::kAllCompressions) {
    SCOPED_TRACE(std::string(records::CompressionName(c)));
    std::string lines;
    for (int i = 0; i < 40; ++i) lines += "line " + std::to_string(i) + "\n";
    testing::WriteFileBytes(dir.File("a"), testing::Compressed(lines, c));
    testing::WriteFileBytes(dir.File("b"),
                            testing::Compressed("b0\nb1\nb2", c));
    std::vector<std::string> files = {dir.File("a"), dir.File("b")};
    if (c != Compression::kNone) {  // a stream cut in its middle
      const std::string whole = testing::Compressed(lines + lines, c);
      testing::WriteFileBytes(dir.File("cut"),
                              whole.substr(0, whole.size() / 2));
      files.insert(files.begin() + 1, dir.File("cut"));
    }
    PlainFileOptions o;
    o.compression = c;
    o.buffer_bytes = 16;
    const Dataset ds = Dataset::FromTextLines(files, o);
    Iterator whole = ds.MakeIterator();
    const std::vector<std::string> all = DrainWithErrors(whole);
    const size_t errors = static_cast<size_t>(
        std::count_if(all.begin(), all.end(),
                      [](const std::string& s) { return s[0] == '!'; }));
    EXPECT_EQ(errors, c == Compression::kNone ? 0u : 1u);
    for (const std::string& s : all) {  // the damage names the file
      if (s[0] != '!') continue;
      EXPECT_EQ(s.rfind("!" + dir.File("cut") + ": cannot be decoded as " +
                            std::string(records::CompressionName(c)) + ": ",
                        0),
                0u)
          << s;
    }
    EXPECT_GE(all.size(), 44u);  // 43 lines, the end (and cut's lines)
    EXPECT_NE(all[all.size() - 2].find("b2"), std::string::npos);
    testing::ExpectRestoresAfterEveryElement(ds, all);
    // Read ahead in parallel: the same lines and error, interleaved, and
    // a state saved with lines and the error read ahead restores too.
    o.num_parallel_reads = 2;
    const Dataset two = Dataset::FromTextLines(files, o);
    Iterator both = two.MakeIterator();
    std::vector<std::string> interleaved = DrainWithErrors(both);
    testing::ExpectRestoresAfterEveryElement(two, interleaved);
    std::sort(interleaved.begin(), interleaved.end());
    std::vector<std::string> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(interleaved, sorted);
  }
}

// A line longer than max_line_bytes (its bytes before the '\n') ends its
// file's reading with an error naming the file, the line and its offset;
// the lines before it came first, the next file follows, and a state saved
// around the error restores.  A line of exactly max_line_bytes, its '\r'
// counted, is a line.
TEST(PlainFileDatasetTest, ALineLongerThanMaxLineBytesEndsItsFile) {
  testing::TempDir dir;
  const std::string text = std::string(50, 'a') + "\n" + std::string(49, 'b') +
                           "\r\n" + std::string(51, 'c') + "\nnever\n";
  for (const Compression c : testing::kAllCompressions) {
    testing::WriteFileBytes(dir.File("a"), testing::Compressed(text, c));
    testing::WriteFileBytes(dir.File("b"), testing::Compressed("b0\n", c));
    // No line end at all: the last line is refused too.
    testing::WriteFileBytes(dir.File("c"),
                            testing::Compressed(std::string(300, 'x'), c));
    // The line found whole in a buffer, or past it in 16-byte reads.
    for (const size_t buffer : {size_t{16}, size_t{256} << 10}) {
      SCOPED_TRACE(std::string(records::CompressionName(c)) + " " +
                   std::to_string(buffer));
      PlainFileOptions o;
      o.compression = c;
      o.buffer_bytes = buffer;
      o.max_line_bytes = 50;
      const Dataset ds = Dataset::FromTextLines(
          {dir.File("a"), dir.File("b"), dir.File("c")}, o);
      Iterator it = ds.MakeIterator();
      const std::vector<std::string> all = DrainWithErrors(it);
      ASSERT_EQ(all.size(), 6u);
      Iterator lines = ds.MakeIterator();
      EXPECT_EQ((*lines.Next())["line"].bytes(0), std::string(50, 'a'));
      EXPECT_EQ((*lines.Next())["line"].bytes(0), std::string(49, 'b'));
      const std::string where =
          c == Compression::kNone
              ? std::string()
              : " of the " + std::string(records::CompressionName(c)) +
                    "-decoded stream";
      EXPECT_EQ(all[2], "!" + dir.File("a") + ": line 3, at byte 102" + where +
                            ", is longer than 50 bytes, the most a line may "
                            "hold (max_line_bytes): is the file text, with "
                            "line ends?");
      EXPECT_NE(all[3].find("b0"), std::string::npos);
      EXPECT_EQ(all[4].rfind("!" + dir.File("c") + ": line 1, at byte 0", 0),
                0u)
          << all[4];
      testing::ExpectRestoresAfterEveryElement(ds, all);
    }
  }
  PlainFileOptions none;
  none.max_line_bytes = 0;
  EXPECT_THROW(Dataset::FromTextLines({dir.File("a")}, none), Error);
}

// A state whose line position no longer falls after a '\n', or falls past
// the end (the file was rewritten), is refused, naming the file, rather
// than read mid-line.
TEST(PlainFileDatasetTest, AStateIntoAChangedFileIsRefused) {
  testing::TempDir dir;
  const std::string path = dir.File("a.txt");
  testing::WriteFileBytes(path, "first\nsecond\nthird\n");
  const Dataset ds = Dataset::FromTextLines({path});
  Iterator it = ds.MakeIterator();
  it.Next();
  const std::string state = it.Save();
  testing::WriteFileBytes(path, "1st\nsecond\nthird\n");
  Iterator restored = ds.MakeIterator();
  try {
    restored.Restore(state);
    FAIL() << "restored into a changed file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": the state's offset 6 is "
                                                "not at the start of a line"),
              std::string::npos)
        << e.what();
  }
  testing::WriteFileBytes(path, "1st\n");
  testing::ExpectRefused(ds, state,
                         path +
                             ": the state's offset 6 is past its end (4 "
                             "bytes): the file changed since");
}

std::string Record(int file, int i, size_t bytes) {
  std::string r(bytes, static_cast<char>('A' + file));
  r[0] = static_cast<char>(i);
  return r;
}

// Header and footer around whole records; every compression alike.
TEST(PlainFileDatasetTest, FixedLengthRecordsSkipHeaderAndFooter) {
  testing::TempDir dir;
  for (const Compression c : testing::kAllCompressions) {
    SCOPED_TRACE(std::string(records::CompressionName(c)));
    std::vector<std::string> files, want;
    for (int f = 0; f < 3; ++f) {
      std::string bytes = "HEAD!";
      for (int i = 0; i < 7; ++i) {
        want.push_back(Record(f, i, 4));
        bytes += want.back();
      }
      files.push_back(dir.File("f" + std::to_string(f)));
      testing::WriteFileBytes(files.back(),
                              testing::Compressed(bytes + "FT", c));
    }
    PlainFileOptions o;
    o.compression = c;
    o.buffer_bytes = 3;
    const Dataset ds = Dataset::FromFixedLengthRecords(files, 4, 5, 2, o);
    EXPECT_EQ(Values(ds, "record"), want);
    const std::vector<Element> all = Collect(ds);
    EXPECT_EQ(all[8].origin.offset, 5u + 4u);
    EXPECT_EQ(all[8].origin.record, 1u);
    Iterator whole = ds.MakeIterator();
    testing::ExpectRestoresAfterEveryElement(ds, DrainWithErrors(whole));
  }
}

// A body that is not whole records is an error naming the sizes (the
// wording of tf.data's, which tests the same files): before any record of
// an uncompressed file, after the whole ones of a compressed file, where
// the decoded end shows it.  The next file follows.
TEST(PlainFileDatasetTest, ABodyOfPartRecordsIsAnError) {
  testing::TempDir dir;
  for (const Compression c : {Compression::kNone, Compression::kGzip}) {
    SCOPED_TRACE(std::string(records::CompressionName(c)));
    std::string body;
    for (int i = 0; i < 7; ++i) body += Record(0, i, 3);
    testing::WriteFileBytes(dir.File("bad"),
                            testing::Compressed("HEAD!" + body + "FT", c));
    testing::WriteFileBytes(dir.File("good"),
                            testing::Compressed("HEAD!abcdFT", c));
    PlainFileOptions o;
    o.compression = c;
    Iterator it = Dataset::FromFixedLengthRecords(
                      {dir.File("bad"), dir.File("good")}, 4, 5, 2, o)
                      .MakeIterator();
    const std::vector<std::string> all = DrainWithErrors(it);
    const size_t whole = c == Compression::kNone ? 0 : 5;  // 21 = 5 * 4 + 1
    ASSERT_EQ(all.size(), whole + 3);
    EXPECT_EQ(all[whole],
              "!" + dir.File("bad") +
                  ": without its header (5 bytes) and footer (2 bytes), its "
                  "body is 21 bytes" +
                  (c == Compression::kNone ? "" : " decoded (gzip)") +
                  ", not a whole number of records of 4 bytes");
    EXPECT_NE(all[whole + 1].find("abcd"), std::string::npos);
  }
  testing::WriteFileBytes(dir.File("short"), "HEA");
  Iterator it = Dataset::FromFixedLengthRecords({dir.File("short")}, 4, 5, 2)
                    .MakeIterator();
  EXPECT_EQ(NextOrError(it), "!" + dir.File("short") +
                                 ": 3 bytes, fewer than its header (5 bytes) "
                                 "and footer (2 bytes)");
  EXPECT_THROW(Dataset::FromFixedLengthRecords({dir.File("short")}, 0), Error);
  EXPECT_THROW(Dataset::FromFixedLengthRecords({dir.File("short")}, 4,
                                               ~uint64_t{0} - 1, 2),
               Error);
}

// Forged states (an offset between records or before the header, a count
// that does not match the offset, a file past the list) are refused by the
// stage's own checks.
TEST(PlainFileDatasetTest, ForgedStatesAreRefused) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("f"), "HEAD!abcdefghFT");
  const Dataset ds = Dataset::FromFixedLengthRecords({dir.File("f")}, 4, 5, 2);
  Iterator it = ds.MakeIterator();
  it.Next();
  const std::string good = it.Save();
  // The stage's fields: file 0, offset 9 (after "HEAD!abcd"), 1 record.
  const std::string fields =
      testing::StateString("fixed_length_record") + testing::U64s({0, 9, 1});
  {  // unchanged, it restores
    Iterator b = ds.MakeIterator();
    b.Restore(testing::Forged(good, fields, fields));
    EXPECT_NE(NextOrError(b).find("efgh"), std::string::npos);
  }
  const auto forge = [&](std::initializer_list<uint64_t> v) {
    return testing::Forged(
        good, fields,
        testing::StateString("fixed_length_record") + testing::U64s(v));
  };
  testing::ExpectRefused(ds, forge({0, 10, 1}),
                         "offset 10 for record 1 (header 5, records of 4)");
  testing::ExpectRefused(ds, forge({0, 9, 2}), "offset 9 for record 2");
  testing::ExpectRefused(ds, forge({0, 3, 0}), "offset 3 for record 0");
  testing::ExpectRefused(ds, forge({2, 0, 0}), "file 2 of 1");
  testing::ExpectRefused(ds, forge({0, 0, 4}), "4 elements at offset 0");
}

// num_parallel_reads: one line from each open file in turn (tf.data's
// order), restorable; Shard takes whole files.
TEST(PlainFileDatasetTest, ParallelReadsInterleaveFilesAndShardTakesFiles) {
  testing::TempDir dir;
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    files.push_back(dir.File("f" + std::to_string(f)));
    std::string text;
    for (int i = 0; i < 2 + f; ++i) {
      text += std::to_string(f) + "." + std::to_string(i) + "\n";
    }
    testing::WriteFileBytes(files.back(), text);
  }
  PlainFileOptions o;
  o.num_parallel_reads = 2;
  const Dataset ds = Dataset::FromTextLines(files, o);
  // File 0 ends at its slot's turn, which passes to file 1; file 2 then
  // opens in slot 0 (tf.data's interleave).
  EXPECT_EQ(Values(ds, "line"),
            (std::vector<std::string>{"0.0", "1.0", "0.1", "1.1", "1.2", "2.0",
                                      "2.1", "2.2", "2.3"}));
  Iterator whole = ds.MakeIterator();
  testing::ExpectRestoresAfterEveryElement(ds, DrainWithErrors(whole));
  EXPECT_EQ(Values(Dataset::FromTextLines(files).Shard(2, 1), "line"),
            (std::vector<std::string>{"1.0", "1.1", "1.2"}));
  // Read in parallel too, a shard is its files (0 and 2), interleaved,
  // not every other line of all three.
  const Dataset shard = ds.Shard(2, 0);
  EXPECT_EQ(
      Values(shard, "line"),
      (std::vector<std::string>{"0.0", "2.0", "0.1", "2.1", "2.2", "2.3"}));
  Iterator sharded = shard.MakeIterator();
  testing::ExpectRestoresAfterEveryElement(shard, DrainWithErrors(sharded));
  // A state read over other files of the same count (another shard's) is
  // refused, not restored into them.
  const Dataset reversed =
      Dataset::FromTextLines({files[2], files[1], files[0]}, o);
  Iterator it = ds.MakeIterator();
  it.Next();
  testing::ExpectRefused(reversed, it.Save(),
                         "iterator state was saved from another pipeline");
  o.num_parallel_reads = 0;
  EXPECT_THROW(Dataset::FromTextLines(files, o), Error);
}

}  // namespace
}  // namespace recflow::pipeline
