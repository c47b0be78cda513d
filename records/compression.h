// Compression of a whole TFRecord stream, as TensorFlow does it: the framed
// records pass through one zlib (ZLIB) or gzip (GZIP) stream.  ZSTD is
// recflow's own addition and TensorFlow cannot read it.
#ifndef RECFLOW_RECORDS_COMPRESSION_H_
#define RECFLOW_RECORDS_COMPRESSION_H_

#include <optional>
#include <string>
#include <string_view>

namespace recflow::records {

enum class Compression { kNone, kZlib, kGzip, kZstd };

// "none", "zlib", "gzip", "zstd".
std::string_view CompressionName(Compression c);
// Accepts the names above in any case, and "" as none (TensorFlow's
// compression_type=""); std::nullopt for anything else.
std::optional<Compression> ParseCompression(std::string_view name);

// The suffix recflow appends to a file name: "", ".zz", ".gz", ".zst".
std::string_view CompressionSuffix(Compression c);

// What a file's first bytes say.  An uncompressed stream whose first 12 bytes
// are a valid record header (its length CRC checks) is none, even when the
// length happens to begin with a magic number (a first record of 35615
// bytes starts with 1f 8b); otherwise gzip (1f 8b) or zstd (28 b5 2f fd)
// magic; otherwise a name ending in .zz or .zlib means ZLIB (a zlib stream
// has no reliable magic); otherwise none.  `head` is the first bytes of the
// file: 12 or more, fewer only when the file is shorter.
Compression DetectCompression(std::string_view head, std::string_view path);

class ReadableFile;
// The same for an open file, reading its first bytes; a file that is not
// regular (a pipe), whose bytes cannot be read twice, goes by its name.
Compression DetectCompression(const ReadableFile& file);

// For output names: .gz -> gzip, .zz/.zlib -> zlib, .zst/.zstd -> zstd,
// otherwise none.
Compression CompressionFromSuffix(std::string_view path);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_COMPRESSION_H_
