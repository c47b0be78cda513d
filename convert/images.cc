#include <algorithm>
#include <filesystem>

#include "convert/sources.h"

namespace recflow::convert {

namespace fs = std::filesystem;
namespace {

using records::DType;

// --- Image folders ------------------------------------------------------

std::string Lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Width and height from a PNG's IHDR or a JPEG's frame header; false if
// the bytes are neither.
bool ImageSize(const std::string& bytes, std::string* format, int64_t* height,
               int64_t* width) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n >= 24 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0 &&
      std::memcmp(p + 12, "IHDR", 4) == 0) {
    *format = "png";
    *width = Be32(p + 16);
    *height = Be32(p + 20);
    return true;
  }
  if (n >= 4 && p[0] == 0xff && p[1] == 0xd8) {
    size_t at = 2;
    while (at + 4 <= n) {
      if (p[at] != 0xff) return false;
      const unsigned char marker = p[at + 1];
      if (marker == 0xff) {  // fill byte
        ++at;
        continue;
      }
      if (marker == 0xd8 || (marker >= 0xd0 && marker <= 0xd7) ||
          marker == 0x01) {
        at += 2;
        continue;
      }
      const size_t len = (p[at + 2] << 8) | p[at + 3];
      const bool sof = marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 &&
                       marker != 0xc8 && marker != 0xcc;
      if (sof) {
        if (at + 9 > n) return false;
        *format = "jpeg";
        *height = (p[at + 5] << 8) | p[at + 6];
        *width = (p[at + 7] << 8) | p[at + 8];
        return true;
      }
      if (marker == 0xda || marker == 0xd9) return false;  // no frame header
      at += 2 + len;
    }
  }
  return false;
}

class ImagesSource final : public BuildingSource {
 public:
  explicit ImagesSource(const std::string& dir)
      : classes_(ImageClassNames(dir)) {
    // What is left out is said (warnings()), as the other sources say what
    // they change: names starting with '.' (hidden) are passed over unsaid.
    LeftOut beside, not_images, folders;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!Hidden(e.path()) && !e.is_directory()) beside.Add(e.path());
    }
    std::vector<size_t> empty;  // labels
    for (size_t label = 0; label < classes_.size(); ++label) {
      std::vector<std::string> files;
      for (const auto& e :
           fs::directory_iterator(fs::path(dir) / classes_[label])) {
        if (Hidden(e.path())) continue;
        const std::string ext = Lower(e.path().extension().string());
        if (e.is_directory()) {
          folders.Add(e.path());
        } else if (e.is_regular_file() &&
                   (ext == ".jpg" || ext == ".jpeg" || ext == ".png")) {
          files.push_back(e.path().string());
        } else {
          not_images.Add(e.path());
        }
      }
      if (files.empty()) empty.push_back(label);
      std::sort(files.begin(), files.end());
      for (auto& f : files) {
        total_bytes_ += FileSize(f);
        items_.push_back({std::move(f), static_cast<int64_t>(label)});
      }
    }
    if (items_.empty()) {
      InputError(
          fmt::format("{}: no .jpg, .jpeg or .png files in its class "
                      "folders",
                      dir));
    }
    not_images.Warn(&warnings_, "file",
                    "in class folders without a .jpg, .jpeg or .png name", "");
    folders.Warn(&warnings_, "folder", "inside class folders",
                 ": images are read from each class folder itself, not from "
                 "folders below it");
    beside.Warn(&warnings_, "file", "beside the class folders",
                ": an image's class is the folder it is in");
    for (const size_t label : empty) {
      warnings_.push_back(fmt::format(
          "class folder '{}' holds no images: its label {} has no records",
          classes_[label], label));
    }
  }
  std::vector<std::string> warnings() const override { return warnings_; }
  bool Next(records::ExampleBuilder* b) override {
    if (next_ == items_.size()) return false;
    const Item& item = items_[next_++];
    FileStream in(item.path);
    bytes_.resize(FileSize(item.path));
    in.ReadExactly(bytes_.data(), bytes_.size(), item.path + ": short read");
    bytes_read_ += bytes_.size();
    std::string format;
    int64_t height = 0, width = 0;
    if (!ImageSize(bytes_, &format, &height, &width)) {
      RowError(
          fmt::format("{}: not a JPEG or PNG image (no frame header "
                      "found)",
                      item.path));
    }
    b->AddBytes("image/encoded", bytes_)
        .AddBytes("image/format", format)
        .AddInt64("image/height", height)
        .AddInt64("image/width", width)
        .AddInt64("image/class/label", item.label)
        .AddBytes("image/class/text", classes_[static_cast<size_t>(item.label)])
        .AddBytes("image/filename", fs::path(item.path).filename().string());
    return true;
  }
  std::string RowName() const override { return items_[next_ - 1].path; }
  std::optional<uint64_t> rows() const override { return items_.size(); }
  uint64_t bytes_read() const override { return bytes_read_; }
  uint64_t total_bytes() const override { return total_bytes_; }

 private:
  struct Item {
    std::string path;
    int64_t label;
  };
  // Entries of the input left out: how many, and the first by name (not
  // the directory's order, which differs between file systems).
  struct LeftOut {
    uint64_t count = 0;
    std::string first;
    void Add(const fs::path& path) {
      if (count++ == 0 || path.string() < first) first = path.string();
    }
    // "left out 2 files WHERE (the first: PATH)WHY".
    void Warn(std::vector<std::string>* warnings, std::string_view noun,
              std::string_view where, std::string_view why) const {
      if (count == 0) return;
      warnings->push_back(fmt::format(
          "left out {} {}{} {} ({}{}){}", count, noun, count == 1 ? "" : "s",
          where, count == 1 ? "" : "the first: ", first, why));
    }
  };
  static bool Hidden(const fs::path& path) {
    const std::string name = path.filename().string();
    return !name.empty() && name[0] == '.';
  }

  std::vector<std::string> classes_;
  std::vector<std::string> warnings_;
  std::vector<Item> items_;
  size_t next_ = 0;
  std::string bytes_;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_read_ = 0;
};

}  // namespace

std::unique_ptr<ExampleSource> OpenImages(const std::string& directory) {
  return std::make_unique<ImagesSource>(directory);
}

std::vector<std::string> ImageClassNames(const std::string& directory) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    InputError(directory +
               ": not a directory (images expects one subfolder "
               "per class)");
  }
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(directory)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && !name.empty() && name[0] != '.') {
      classes.push_back(name);
    }
  }
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    InputError(directory + ": no class subfolders");
  }
  return classes;
}

}  // namespace recflow::convert
