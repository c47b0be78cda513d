// records/tfrecord_format.h: the one frame check every reader of frames
// calls, and records::ReadRecordAt, which reads a saved reference with it.
#include "records/tfrecord_format.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "records/errors.h"
#include "records/file.h"
#include "records/index.h"
#include "test_util.h"

namespace recflow::records {
namespace {

std::string Frame(const std::string& payload) {
  std::string f(kHeaderBytes + payload.size() + kFooterBytes, '\0');
  EncodeHeader(f.data(), payload.size());
  std::memcpy(f.data() + kHeaderBytes, payload.data(), payload.size());
  EncodeFooter(f.data() + kHeaderBytes + payload.size(), payload.data(),
               payload.size());
  return f;
}

TEST(FrameCheckTest, FaultsInOrderLengthCrcMaximumThenEnd) {
  std::string f = Frame("hello");
  const char* h = f.data();
  EXPECT_EQ(CheckFrameHeader(h, true, 5, f.size()), FrameFault::kNone);
  EXPECT_EQ(CheckFrameHeader(h, true, 4, f.size()), FrameFault::kOverMaximum);
  EXPECT_EQ(CheckFrameHeader(h, true, 5, f.size() - 1), FrameFault::kPastEnd);
  EXPECT_EQ(CheckFrameHeader(h, true, 5, 3), FrameFault::kPastEnd);
  EXPECT_TRUE(DataChecks(h + kHeaderBytes, 5));
  f[3] ^= 1;  // the length now reads 16M+5 and fails its CRC
  EXPECT_EQ(CheckFrameHeader(h, true, 5, f.size()), FrameFault::kLengthCrc);
  EXPECT_EQ(CheckFrameHeader(h, false, 5, f.size()), FrameFault::kOverMaximum);
  EXPECT_EQ(CheckFrameHeader(h, false, UINT64_MAX, f.size()),
            FrameFault::kPastEnd);
  EXPECT_EQ(FrameFaultKind(FrameFault::kPastEnd, true),
            DamageKind::kTruncatedData);
  EXPECT_EQ(FrameFaultKind(FrameFault::kPastEnd, false),
            DamageKind::kImplausibleLength);
  EXPECT_EQ(FrameFaultDetail(FrameFault::kOverMaximum, true, h, 5, 0),
            "length 16777221 exceeds the maximum record size 5");
  EXPECT_EQ(FrameFaultDetail(FrameFault::kPastEnd, false, h, 5, 21),
            "length 16777221 runs past the end of the file (21 bytes left)");
  // A length near 2^64 does not wrap around the end check.
  std::string huge(kHeaderBytes, '\0');
  EncodeHeader(huge.data(), UINT64_MAX - 8);
  EXPECT_EQ(CheckFrameHeader(huge.data(), true, UINT64_MAX, 100),
            FrameFault::kPastEnd);
  std::string g = Frame("abc");
  g[kHeaderBytes] ^= 1;
  EXPECT_FALSE(DataChecks(g.data() + kHeaderBytes, 3));
  EXPECT_EQ(DataCrcDetail(g.data() + kHeaderBytes, 3)
                .rfind("payload of 3 bytes; stored CRC 0x", 0),
            0u);
}

// Short frames are checked many at once; the prefix that checks ends at
// the first damaged or incomplete frame, and each of its frames comes back
// with its length and data CRC.
TEST(VerifyFramesAheadTest, ChecksThePrefixAndKeepsEachFramesLengthAndCrc) {
  std::string bytes;
  std::vector<size_t> starts;
  for (int i = 0; i < 6; ++i) {
    starts.push_back(bytes.size());
    bytes += Frame(std::string(static_cast<size_t>(10 + i), 'a' + i));
  }
  const char* begin = bytes.data();
  const char* end = begin + bytes.size();
  std::vector<VerifiedFrame> frames;
  EXPECT_EQ(VerifyFramesAhead(begin, end, &frames), end);
  ASSERT_EQ(frames.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(frames[i].length, 10 + i);
    EXPECT_EQ(frames[i].data_crc,
              StoredDataCrc(begin + starts[i] + kHeaderBytes, 10 + i));
  }
  // The frame cut short by `end` is left to the one-record path.
  frames.clear();
  EXPECT_EQ(VerifyFramesAhead(begin, end - 1, &frames), begin + starts[5]);
  EXPECT_EQ(frames.size(), 5u);
  // A damaged payload: the frames before it check.
  bytes[starts[3] + kHeaderBytes + 2] ^= 1;
  frames.clear();
  EXPECT_EQ(VerifyFramesAhead(begin, end, &frames), begin + starts[3]);
  EXPECT_EQ(frames.size(), 3u);
  EXPECT_EQ(VerifyFramesAhead(begin, end), begin + starts[3]);
}

TEST(ReadRecordAtTest, ReadsTheFrameAtAnOffsetAndSaysWhatIsWrongElsewhere) {
  testing::TempDir dir;
  const std::string path = dir.File("r.tfrecord");
  testing::WriteRecords(path, std::vector<std::string>{"first", "second!"});
  ReadableFile file(path);
  AlignedVector<char> buffer;
  EXPECT_EQ(ReadRecordAt(file, 0, 0, &buffer), "first");
  EXPECT_EQ(ReadRecordAt(file, 21, 1, &buffer), "second!");
  try {
    ReadRecordAt(file, 20, 1, &buffer);
    FAIL() << "a frame read one byte early";
  } catch (const RecordError& e) {
    EXPECT_EQ(e.kind(), DamageKind::kLengthCrcMismatch);
    EXPECT_EQ(e.offset(), 20u);
    EXPECT_EQ(e.record_index(), 1u);
    EXPECT_EQ(e.path(), path);
  }
  try {
    ReadRecordAt(file, 40, 1, &buffer);
    FAIL() << "a frame read in the last bytes";
  } catch (const RecordError& e) {
    EXPECT_EQ(e.kind(), DamageKind::kTruncatedHeader);
  }
  std::string bytes = testing::ReadFileBytes(path);
  bytes[21 + kHeaderBytes] ^= 1;
  testing::WriteFileBytes(path, bytes);
  try {
    ReadRecordAt(ReadableFile(path), 21, 1, &buffer);
    FAIL() << "a changed payload was read";
  } catch (const RecordError& e) {
    EXPECT_EQ(e.kind(), DamageKind::kDataCrcMismatch);
  }
}

// A file of another format read as TFRecords fails at its first frame;
// the message says what it starts like.
TEST(StartOfStreamHintTest, NamesTheFormatAFileStartsLike) {
  const auto hint = [](std::string_view first) {
    return StartOfStreamHint(first);
  };
  EXPECT_EQ(hint("\x1f\x8b\x08\x00"
                 "abcdefgh"),
            "; the stream starts like gzip data, not a TFRecord frame: give "
            "--compression gzip");
  EXPECT_NE(hint("\x28\xb5\x2f\xfd\x00").find("zstd data"), std::string::npos);
  EXPECT_NE(hint("\x78\x9c\x01\x02").find("ZLIB data"), std::string::npos);
  EXPECT_NE(hint("\x78\x01").find("ZLIB data"), std::string::npos);
  EXPECT_NE(hint("PK\x03\x04xxxx").find("a ZIP archive"), std::string::npos);
  EXPECT_NE(hint("\x93NUMPY\x01\x00v\x00").find("a NumPy .npy file"),
            std::string::npos);
  EXPECT_NE(hint(std::string("\0\0\x08\x03\0\0\0\x05", 8)).find("an IDX file"),
            std::string::npos);
  EXPECT_EQ(hint("a,b,c\n1,2,3\n"),
            "; the stream starts like text, not a TFRecord frame: if it is CSV "
            "or JSON Lines, convert it with `recflow convert csv|jsonl`");
  // A damaged TFRecord header is none of these.
  std::string frame = Frame("hello");
  frame[0] ^= 0x40;
  EXPECT_EQ(hint(std::string_view(frame.data(), kHeaderBytes)), "");
  EXPECT_EQ(hint(""), "");
}

TEST(StartOfStreamHintTest, ReadersAddItAtTheFirstByteOnly) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"), "x,label\n0.5,1\n0.25,0\n");
  try {
    testing::ReadRecords(dir.File("a.csv"));
    FAIL() << "a CSV file read as records";
  } catch (const RecordError& e) {
    EXPECT_EQ(e.offset(), 0u);
    EXPECT_NE(std::string(e.what()).find("the stream starts like text"),
              std::string::npos)
        << e.what();
  }
  // Damage after the first record: no guess about the file's format.
  std::string two = Frame("one") + Frame("two");
  two[Frame("one").size() + 1] ^= 1;
  testing::WriteFileBytes(dir.File("b.tfrecord"), two);
  try {
    testing::ReadRecords(dir.File("b.tfrecord"));
    FAIL() << "damage was not seen";
  } catch (const RecordError& e) {
    EXPECT_EQ(std::string(e.what()).find("starts like"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace recflow::records
