#include <zlib.h>

#include "convert/sources.h"

namespace recflow::convert {
namespace {

using records::DType;

// --- IDX (MNIST) --------------------------------------------------------

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    f_ = gzopen(path.c_str(), "rb");  // reads plain files too
    if (f_ == nullptr) {
      InputError(
          fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    gzbuffer(f_, 1 << 18);
  }
  ~GzFile() { gzclose(f_); }
  void ReadExactly(void* dst, size_t n, const std::string& what) {
    const int got = gzread(f_, dst, static_cast<unsigned>(n));
    if (got < 0 || static_cast<size_t>(got) != n) {
      int err = 0;
      const char* msg = gzerror(f_, &err);
      InputError(fmt::format("{}: {}{}", path_, what,
                             err != Z_OK ? std::string(" (") + msg + ")" : ""));
    }
  }
  // Fails unless the file (its decompressed data) ends here.
  void ExpectEnd(const std::string& what) {
    char c;
    const int got = gzread(f_, &c, 1);
    if (got < 0) ReadExactly(&c, 1, what);  // says zlib's error
    if (got > 0) InputError(fmt::format("{}: {}", path_, what));
  }
  uint64_t consumed() { return static_cast<uint64_t>(gzoffset(f_)); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gzFile f_;
};

class IdxSource final : public BuildingSource {
 public:
  IdxSource(const std::string& images, const std::string& labels)
      : images_(images),
        labels_(labels),
        total_bytes_(FileSize(images) + FileSize(labels)) {
    unsigned char h[16];
    images_.ReadExactly(h, 16, "truncated IDX header");
    if (Be32(h) != 0x00000803) {
      InputError(
          fmt::format("{}: not an IDX file of unsigned bytes with 3 "
                      "dimensions (magic {:#010x}, expected "
                      "0x00000803)",
                      images, Be32(h)));
    }
    rows_ = Be32(h + 4);
    height_ = Be32(h + 8);
    width_ = Be32(h + 12);
    if (height_ == 0 || width_ == 0 ||
        uint64_t{height_} * width_ > (1u << 28)) {
      InputError(fmt::format("{}: implausible image size {}x{}", images,
                             height_, width_));
    }
    unsigned char l[8];
    labels_.ReadExactly(l, 8, "truncated IDX header");
    if (Be32(l) != 0x00000801) {
      InputError(
          fmt::format("{}: not an IDX file of unsigned bytes with 1 "
                      "dimension (magic {:#010x}, expected "
                      "0x00000801)",
                      labels, Be32(l)));
    }
    if (Be32(l + 4) != rows_) {
      InputError(fmt::format("{} holds {} images but {} holds {} labels",
                             images, rows_, labels, Be32(l + 4)));
    }
    image_.resize(uint64_t{height_} * width_);
  }
  bool Next(records::ExampleBuilder* b) override {
    if (row_ == rows_) {
      // Nothing may follow what the headers count: it would be left out
      // unseen (a header that lies, or files that do not belong together).
      images_.ExpectEnd(fmt::format(
          "more data after the {} images its header counts", rows_));
      labels_.ExpectEnd(fmt::format(
          "more data after the {} labels its header counts", rows_));
      return false;
    }
    images_.ReadExactly(
        image_.data(), image_.size(),
        fmt::format("data ends inside image {} of {}", row_, rows_));
    unsigned char label;
    labels_.ReadExactly(
        &label, 1, fmt::format("data ends at label {} of {}", row_, rows_));
    ++row_;
    b->AddBytes("image", image_)
        .AddInt64("label", label)
        .AddInt64("height", height_)
        .AddInt64("width", width_);
    return true;
  }
  std::string RowName() const override {
    return fmt::format("{}: image {}", images_.path(), row_ - 1);
  }
  std::optional<uint64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    return const_cast<GzFile&>(images_).consumed() +
           const_cast<GzFile&>(labels_).consumed();
  }
  uint64_t total_bytes() const override { return total_bytes_; }

 private:
  GzFile images_;
  GzFile labels_;
  uint64_t total_bytes_;
  uint32_t rows_ = 0, height_ = 0, width_ = 0;
  uint32_t row_ = 0;
  std::string image_;
};

}  // namespace

std::unique_ptr<ExampleSource> OpenIdx(const std::string& images,
                                       const std::string& labels) {
  return std::make_unique<IdxSource>(images, labels);
}

}  // namespace recflow::convert
