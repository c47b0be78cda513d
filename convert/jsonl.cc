#include <nlohmann/json.hpp>

#include "convert/sources.h"
#include "records/csv_reader.h"
#include "records/wire_format.h"

namespace recflow::convert {
namespace {

using records::DType;

// --- JSON Lines ---------------------------------------------------------

CellType JsonType(const nlohmann::json& v) {
  if (v.is_number_integer()) return CellType::kInt64;
  if (v.is_boolean()) return CellType::kInt64;
  if (v.is_number()) return CellType::kFloat;
  if (v.is_string()) return CellType::kBytes;
  return CellType::kNone;
}

class JsonlSource final : public ExampleSource {
 public:
  JsonlSource(std::vector<std::string> files, const records::FeatureSpec* spec)
      : files_(std::move(files)) {
    for (const auto& f : files_) total_bytes_ += FileSize(f);
    // First pass: the type of every key (numbers widen int64 -> float;
    // strings and numbers under one key are an error in the rows that
    // disagree with the first seen) and the row count.
    InexactIntegers inexact;
    std::map<std::string, size_t> slots;  // of keys with such integers
    for (const auto& path : files_) {
      File file(path);
      std::string line;
      uint64_t line_number = 0;
      while (ReadLine(file.f, &line)) {
        ++line_number;
        if (IsBlank(line)) continue;
        ++rows_;
        nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
        if (!row.is_object()) continue;  // reported in the second pass
        for (const auto& [key, value] : row.items()) {
          const auto type_of = [&](const nlohmann::json& e) {
            std::optional<float> rounded;
            if (e.is_number_unsigned()) {
              rounded = InexactIntegers::Rounded(e.get<uint64_t>());
            } else if (e.is_number_integer()) {
              rounded = InexactIntegers::Rounded(e.get<int64_t>());
            }
            if (rounded) {
              const size_t slot =
                  slots.emplace(key, slots.size()).first->second;
              inexact.Add(
                  slot, *rounded, [&] { return e.dump(); },
                  [&] { return fmt::format("{}:{}", path, line_number); });
            }
            return JsonType(e);
          };
          CellType t = CellType::kNone;
          if (value.is_array()) {
            for (const auto& e : value) t = Widen(t, type_of(e));
          } else {
            t = type_of(value);
          }
          CellType& known = types_[key];
          if (known == CellType::kNone ||
              (known != CellType::kBytes && t != CellType::kBytes)) {
            known = Widen(known, t);
          }
        }
      }
    }
    // The spec types keys by name: one no row has is a misspelt or wrong
    // key, not a feature to leave out silently (as for CSV's header).
    if (spec != nullptr) {
      for (const auto& [name, config] : spec->features) {
        if (types_.count(name) == 0) {
          std::vector<std::string> keys;
          for (const auto& [key, type] : types_) {
            if (keys.size() == kKeysNamed) {
              keys.push_back("...");
              break;
            }
            keys.push_back(key);
          }
          InputError(fmt::format(
              "{}: --spec names key '{}', which no row of the input has "
              "(its keys: {})",
              files_.size() == 1
                  ? files_[0]
                  : fmt::format("{} and {} more", files_[0], files_.size() - 1),
              name, fmt::join(keys, ", ")));
        }
      }
    }
    for (auto& [key, type] : types_) {
      type = FromSpec(spec, key, type);
      if (type == CellType::kNone) {
        warnings_.push_back(
            UntypedWarning("key", key, "null or [] in every row that has it"));
      }
      const auto slot = slots.find(key);
      if (slot == slots.end()) continue;
      if (auto w = inexact.Warning(slot->second, key, "key", type)) {
        warnings_.push_back(std::move(*w));
      }
    }
    Open(0);
  }

  bool NextRow(Row* r) override {
    r->built = false;
    r->error.clear();
    while (true) {
      if (file_ == nullptr) return false;
      if (ReadLine(file_->f, &r->text)) {
        ++line_number_;
        if (!IsBlank(r->text)) break;
        continue;
      }
      bytes_done_ += FileSize(file_->path);
      Open(file_index_ + 1);
    }
    r->path = file_->path;
    r->line = line_number_;
    return true;
  }

  void Build(const Row& r, records::ExampleBuilder* b) const override {
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(r.text);
    } catch (const nlohmann::json::exception& e) {
      // "[json.exception.parse_error.101] parse error at line 1, column 9:
      // ..." (or out_of_range.406: "number overflow parsing '1e400'")
      // without the library's tag and the line within the line.
      std::string what = e.what();
      if (const size_t tag = what.find("] "); tag != std::string::npos) {
        what.erase(0, tag + 2);
      }
      if (const size_t at = what.find("at line 1, column ");
          at != std::string::npos) {
        what.replace(at, 18, "at column ");
      }
      RowError(fmt::format("{}:{}: not JSON: {}", r.path, r.line, what));
    }
    if (!row.is_object()) {
      RowError(
          fmt::format("{}:{}: expected one JSON object per line, found "
                      "{}",
                      r.path, r.line, row.type_name()));
    }
    std::vector<int64_t> ints;
    std::vector<float> floats;
    std::vector<std::string> strings;
    for (const auto& [key, value] : row.items()) {
      if (value.is_null()) continue;  // absent
      const auto known = types_.find(key);
      const CellType type =
          known == types_.end() ? CellType::kNone : known->second;
      const nlohmann::json values =
          value.is_array() ? value : nlohmann::json::array({value});
      if (!records::wire::IsValidUtf8(key)) {
        RowError(fmt::format("{}:{}: key is not UTF-8", r.path, r.line));
      }
      try {
        switch (type) {
          case CellType::kInt64: {
            ints.clear();
            for (const auto& e : values) {
              if (!e.is_number_integer() && !e.is_boolean()) throw 0;
              if (e.is_number_unsigned() &&
                  e.get<uint64_t>() >
                      static_cast<uint64_t>(INT64_MAX)) {  // not to wrap
                RowError(
                    fmt::format("{}:{}: key '{}': {} does not fit in "
                                "int64",
                                r.path, r.line, key, e.dump()));
              }
              ints.push_back(e.is_boolean() ? e.get<bool>() : e.get<int64_t>());
            }
            b->AddInt64List(key, ints);
            break;
          }
          case CellType::kFloat: {
            floats.clear();
            for (const auto& e : values) {
              if (!e.is_number() && !e.is_boolean()) throw 0;
              if (e.is_number_float() &&
                  !records::FitsFloat32(e.get<double>())) {
                RowError(fmt::format(
                    "{}:{}: key '{}': {} is outside float32's range (a float "
                    "feature would hold inf)",
                    r.path, r.line, key, e.dump()));
              }
              floats.push_back(e.is_boolean() ? e.get<bool>() : e.get<float>());
            }
            b->AddFloatList(key, floats);
            break;
          }
          case CellType::kBytes: {
            strings.clear();
            for (const auto& e : values) {
              if (!e.is_string()) throw 0;
              strings.push_back(e.get<std::string>());
            }
            b->AddBytesList(key, strings);
            break;
          }
          case CellType::kNone:
            if (!values.empty()) throw 0;
            break;
        }
      } catch (int) {
        RowError(fmt::format(
            "{}:{}: key '{}': expected {} (numbers, strings, booleans, or "
            "lists of one of them), found {}",
            r.path, r.line, key,
            type == CellType::kBytes   ? "string values"
            : type == CellType::kFloat ? "numeric values"
            : type == CellType::kInt64 ? "integer values"
                                       : "feature values",
            value.dump().substr(0, 80)));
      }
    }
  }

  std::optional<uint64_t> rows() const override { return rows_; }
  uint64_t bytes_read() const override {
    return bytes_done_ +
           (file_ ? static_cast<uint64_t>(std::ftell(file_->f)) : 0);
  }
  uint64_t total_bytes() const override { return total_bytes_; }
  std::vector<std::string> warnings() const override { return warnings_; }

 private:
  static bool ReadLine(FILE* f, std::string* line) {
    line->clear();
    int c;
    while ((c = getc_unlocked(f)) != EOF && c != '\n') {
      line->push_back(static_cast<char>(c));
    }
    return c != EOF || !line->empty();
  }
  static bool IsBlank(const std::string& s) {
    return s.find_first_not_of(" \t\r") == std::string::npos;
  }
  void Open(size_t index) {
    file_index_ = index;
    file_.reset();
    line_number_ = 0;
    if (index < files_.size()) file_ = std::make_unique<File>(files_[index]);
  }

  static constexpr size_t kKeysNamed = 20;  // in an error, at most

  std::vector<std::string> files_;
  std::map<std::string, CellType> types_;
  std::vector<std::string> warnings_;
  std::unique_ptr<File> file_;
  size_t file_index_ = 0;
  uint64_t line_number_ = 0;
  uint64_t rows_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_done_ = 0;
};

}  // namespace

std::unique_ptr<ExampleSource> OpenJsonl(std::vector<std::string> files,
                                         const records::FeatureSpec* spec) {
  return std::make_unique<JsonlSource>(std::move(files), spec);
}

}  // namespace recflow::convert
