// The fast parser against protobuf's parser plus extraction: the same
// output for every input protobuf accepts, a rejection for every input it
// rejects.
#include "records/example_parser.h"

#include <fmt/format.h>
#include <google/protobuf/stubs/logging.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "records/example.pb.h"
#include "records/wire_format.h"

namespace recflow::records {
namespace {

using wire::PutLengthDelimited;
using wire::PutTag;
using wire::PutVarint;

// --- Reference: protobuf's parser, then extraction by the spec. ---------

// Empty features for `spec` in `out`.
void ResetReference(const FeatureSpec& spec, size_t n, ParsedBatch* out) {
  out->batch_size = static_cast<int64_t>(n);
  out->features.clear();
  for (const auto& [name, c] : spec.features) {
    ParsedFeature f;
    f.name = name;
    f.config = c;
    f.bytes_offsets.push_back(0);
    out->features.push_back(f);
  }
}

void AppendReferenceValues(const tensorflow::Feature& feature,
                           ParsedFeature* f) {
  for (float v : feature.float_list().value()) f->floats.push_back(v);
  for (int64_t v : feature.int64_list().value()) f->ints.push_back(v);
  for (const auto& v : feature.bytes_list().value()) {
    f->bytes_data += v;
    f->bytes_offsets.push_back(f->bytes_data.size());
  }
}

size_t ReferenceCount(const tensorflow::Feature& feature) {
  switch (feature.kind_case()) {
    case tensorflow::Feature::kBytesList:
      return feature.bytes_list().value_size();
    case tensorflow::Feature::kFloatList:
      return feature.float_list().value_size();
    case tensorflow::Feature::kInt64List:
      return feature.int64_list().value_size();
    default:
      return 0;
  }
}

int WantKind(DType d) {
  return d == DType::kBytes ? 1 : d == DType::kFloat32 ? 2 : 3;
}

std::string ShapeText(const FeatureConfig& c) {
  std::string shape = "[";
  for (size_t k = 0; k < c.shape.size(); ++k) {
    if (k) shape += ',';
    shape += std::to_string(c.shape[k]);
  }
  return shape + "]";
}

const char* kKindNames[] = {"none", "string", "float", "int64"};
const char* kValueNames[] = {"", "bytes", "float", "int64"};

// Example i's Features extracted by the spec, protobuf-side.
std::string ReferenceExtract(const tensorflow::Features& features, size_t i,
                             ParsedBatch* out) {
  for (ParsedFeature& f : out->features) {
    const FeatureConfig& c = f.config;
    const auto& map = features.feature();
    auto it = map.find(f.name);
    const bool fixed = c.kind == FeatureConfig::Kind::kFixed;
    if (it == map.end() ||
        it->second.kind_case() == tensorflow::Feature::KIND_NOT_SET) {
      if (!fixed) {
        f.row_lengths.push_back(0);
        continue;
      }
      if (!c.default_value) {
        return "Feature: " + f.name +
               " (data type: " + std::string(TensorFlowDTypeName(c.dtype)) +
               ") is required but could not be found.";
      }
      for (int64_t j = 0; j < c.num_elements(); ++j) {
        const DefaultValue& d = *c.default_value;
        if (c.dtype == DType::kFloat32) {
          f.floats.push_back(d.floats[d.floats.size() == 1 ? 0 : j]);
        } else if (c.dtype == DType::kInt64) {
          f.ints.push_back(d.ints[d.ints.size() == 1 ? 0 : j]);
        } else {
          f.bytes_data += d.bytes[d.bytes.size() == 1 ? 0 : j];
          f.bytes_offsets.push_back(f.bytes_data.size());
        }
      }
      continue;
    }
    const tensorflow::Feature& feature = it->second;
    const int kind = feature.kind_case();
    if (kind != WantKind(c.dtype)) {
      return "Key: " + f.name + ", Index: " + std::to_string(i) +
             ".  Data types don't match. Data type: " + kKindNames[kind] +
             " but expected type: " + std::string(TensorFlowDTypeName(c.dtype));
    }
    const size_t count = ReferenceCount(feature);
    if (fixed && count != static_cast<size_t>(c.num_elements())) {
      return "Key: " + f.name + ", Index: " + std::to_string(i) +
             ".  Number of " + kValueNames[kind] +
             " values != expected.  Values size: " + std::to_string(count) +
             " but output shape: " + ShapeText(c);
    }
    AppendReferenceValues(feature, &f);
    if (!fixed) f.row_lengths.push_back(static_cast<int64_t>(count));
  }
  return "";
}

// Returns "" and fills `out`, or TensorFlow's error message.
std::string ReferenceParse(const FeatureSpec& spec,
                           const std::vector<std::string>& serialized,
                           ParsedBatch* out) {
  ResetReference(spec, serialized.size(), out);
  for (size_t i = 0; i < serialized.size(); ++i) {
    tensorflow::Example ex;
    if (!ex.ParseFromString(serialized[i])) {
      return "Can't parse serialized Example.";
    }
    const std::string error = ReferenceExtract(ex.features(), i, out);
    if (!error.empty()) return error;
  }
  return "";
}

std::string FastParse(const FeatureSpec& spec,
                      const std::vector<std::string>& serialized,
                      ParsedBatch* out, int threads = 1) {
  std::vector<std::string_view> views(serialized.begin(), serialized.end());
  try {
    ExampleParser(spec).ParseBatch(views, out, {}, threads);
  } catch (const ParseError& e) {
    return e.what();
  }
  return "";
}

void ExpectSameBatch(const ParsedBatch& a, const ParsedBatch& b,
                     const std::string& context) {
  ASSERT_EQ(a.batch_size, b.batch_size) << context;
  ASSERT_EQ(a.features.size(), b.features.size());
  for (size_t d = 0; d < a.features.size(); ++d) {
    const auto& x = a.features[d];
    const auto& y = b.features[d];
    ASSERT_EQ(x.name, y.name);
    // Bit patterns, so that NaNs compare.
    ASSERT_EQ(x.floats.size(), y.floats.size()) << x.name << context;
    ASSERT_TRUE(
        x.floats.empty() ||
        std::memcmp(x.floats.data(), y.floats.data(), x.floats.size() * 4) == 0)
        << x.name << context;
    ASSERT_EQ(x.ints, y.ints) << x.name << context;
    ASSERT_EQ(x.bytes_data, y.bytes_data) << x.name << context;
    ASSERT_EQ(x.bytes_offsets, y.bytes_offsets) << x.name << context;
    ASSERT_EQ(x.row_lengths, y.row_lengths) << x.name << context;
  }
}

template <typename T>
std::vector<T> Vec(const AlignedVector<T>& v) {
  return {v.begin(), v.end()};
}

std::string Hex(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) out += fmt::format("{:02x} ", ch);
  return out;
}

// --- A generator of Examples in every legal encoding. -------------------

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  bool Coin(int one_in) { return rng_() % one_in == 0; }
  size_t Below(size_t n) { return n == 0 ? 0 : rng_() % n; }

  // An unknown field of any wire type (sometimes a group).
  void UnknownField(std::string& out) {
    const uint32_t field = 4 + static_cast<uint32_t>(Below(40));
    switch (Below(5)) {
      case 0:
        PutTag(out, field, wire::kVarint);
        PutVarint(out, rng_());
        break;
      case 1:
        PutTag(out, field, wire::kFixed64);
        out.append(8, 'x');
        break;
      case 2:
        PutLengthDelimited(out, field, "unknown bytes");
        break;
      case 3:
        PutTag(out, field, wire::kFixed32);
        out.append(4, 'y');
        break;
      case 4:
        PutTag(out, field, wire::kStartGroup);
        PutTag(out, 1, wire::kVarint);
        PutVarint(out, 7);
        PutTag(out, field, wire::kEndGroup);
        break;
    }
  }

  // A list message of `kind` holding `n` values, packed or not, sometimes
  // with unknown fields between them.
  std::string List(int kind, size_t n, std::vector<float>* floats,
                   std::vector<int64_t>* ints,
                   std::vector<std::string>* bytes) {
    std::string out;
    const bool packed = Coin(2);
    std::string run;
    auto flush = [&] {
      if (!run.empty()) PutLengthDelimited(out, 1, run);
      run.clear();
    };
    for (size_t i = 0; i < n; ++i) {
      if (Coin(15)) {
        flush();
        UnknownField(out);
      }
      if (kind == 2) {
        float v =
            static_cast<float>(static_cast<int64_t>(rng_() % 2001) - 1000) / 8;
        if (Coin(50)) v = std::numeric_limits<float>::quiet_NaN();
        floats->push_back(v);
        char b[4];
        std::memcpy(b, &v, 4);
        if (packed) {
          run.append(b, 4);
        } else {
          PutTag(out, 1, wire::kFixed32);
          out.append(b, 4);
        }
      } else if (kind == 3) {
        int64_t v = static_cast<int64_t>(rng_()) >> Below(64);
        ints->push_back(v);
        if (packed) {
          PutVarint(run, static_cast<uint64_t>(v));
        } else {
          PutTag(out, 1, wire::kVarint);
          PutVarint(out, static_cast<uint64_t>(v));
        }
      } else {
        std::string v(Below(12), 'a');
        for (auto& ch : v) ch = static_cast<char>(rng_());
        bytes->push_back(v);
        PutLengthDelimited(out, 1, v);
      }
    }
    flush();
    if (Coin(6)) UnknownField(out);
    return out;
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

// A serialized Example with features drawn from `names`: each a random
// kind and count, values sometimes split over several list messages or
// several Feature messages, keys sometimes repeated (the last wins),
// Features sometimes split in two, unknown fields anywhere.
std::string RandomExample(Generator& g, const std::vector<std::string>& names,
                          const FeatureSpec& spec) {
  std::string features;
  for (const std::string& name : names) {
    if (g.Coin(6)) continue;  // absent
    const int copies = g.Coin(8) ? 2 : 1;
    for (int copy = 0; copy < copies; ++copy) {
      const FeatureConfig* c = spec.Find(name);
      int kind = 1 + static_cast<int>(g.Below(3));
      size_t n = g.Below(6);
      if (c != nullptr && !g.Coin(8)) {  // usually what the spec wants
        kind = c->dtype == DType::kBytes     ? 1
               : c->dtype == DType::kFloat32 ? 2
                                             : 3;
        if (c->kind == FeatureConfig::Kind::kFixed && !g.Coin(10)) {
          n = static_cast<size_t>(c->num_elements());
        }
      }
      std::vector<float> fl;
      std::vector<int64_t> il;
      std::vector<std::string> bl;
      std::string feature;
      if (!g.Coin(12)) {  // else: a Feature with no list at all
        const size_t first = g.Coin(4) ? g.Below(n + 1) : n;
        PutLengthDelimited(feature, kind, g.List(kind, first, &fl, &il, &bl));
        if (first < n) {  // the rest in a second list message: merged
          PutLengthDelimited(feature, kind,
                             g.List(kind, n - first, &fl, &il, &bl));
        }
      }
      if (g.Coin(10)) g.UnknownField(feature);
      std::string entry;
      if (g.Coin(2)) {
        PutLengthDelimited(entry, 1, name);
        PutLengthDelimited(entry, 2, feature);
      } else {  // value before key is legal too
        PutLengthDelimited(entry, 2, feature);
        PutLengthDelimited(entry, 1, name);
      }
      PutLengthDelimited(features, 1, entry);
    }
  }
  std::string example;
  if (g.Coin(5)) {  // Features in two parts, merged by protobuf
    const size_t cut = features.size() / 2;
    // Cut only at an entry boundary: re-split by parsing is complex, so
    // put all entries in the first part and an empty second part.
    (void)cut;
    PutLengthDelimited(example, 1, features);
    PutLengthDelimited(example, 1, "");
  } else {
    PutLengthDelimited(example, 1, features);
  }
  if (g.Coin(4)) g.UnknownField(example);
  return example;
}

FeatureSpec TestSpec() {
  return FeatureSpec::FromJsonText(R"({"features": {
    "image": {"kind": "fixed", "dtype": "float32", "shape": [2, 3]},
    "label": {"kind": "fixed", "dtype": "int64", "shape": [], "default": -1},
    "name":  {"kind": "fixed", "dtype": "bytes", "shape": [1], "default": "?"},
    "tokens": {"kind": "var", "dtype": "int64"},
    "weights": {"kind": "var", "dtype": "float32"},
    "tags": {"kind": "var", "dtype": "bytes"}
  }})");
}

const std::vector<std::string> kNames = {"image",   "label", "name",  "tokens",
                                         "weights", "tags",  "other", ""};

// 3,000 batches from `make_batch`: the fast parser gives protobuf's values
// or its error for each, and they occur more than `min_ok` and
// `min_errors` times.  ExpectMatchesProtobufOnRandomBatches: batches of one
// to `max_batch` random Examples with features from `names`, each outcome
// more than 300 times.
void ExpectMatchesProtobufOnBatches(
    const FeatureSpec& spec, Generator& g,
    const std::function<std::vector<std::string>(Generator&)>& make_batch,
    int min_ok, int min_errors) {
  int ok = 0, errors = 0;
  for (int round = 0; round < 3000; ++round) {
    const std::vector<std::string> batch = make_batch(g);
    ParsedBatch fast, reference;
    const std::string fast_error = FastParse(spec, batch, &fast);
    const std::string reference_error = ReferenceParse(spec, batch, &reference);
    ASSERT_EQ(fast_error, reference_error) << "round " << round;
    if (fast_error.empty()) {
      ExpectSameBatch(fast, reference, " round " + std::to_string(round));
      ++ok;
    } else {
      ++errors;
    }
  }
  // Both paths must have been exercised.
  EXPECT_GT(ok, min_ok);
  EXPECT_GT(errors, min_errors);
}

void ExpectMatchesProtobufOnRandomBatches(const FeatureSpec& spec,
                                          const std::vector<std::string>& names,
                                          uint64_t seed, uint64_t max_batch) {
  Generator g(seed);
  ExpectMatchesProtobufOnBatches(
      spec, g,
      [&](Generator& g) {
        std::vector<std::string> batch;
        const size_t n = 1 + g.Below(max_batch);
        for (size_t i = 0; i < n; ++i)
          batch.push_back(RandomExample(g, names, spec));
        return batch;
      },
      300, 300);
}

TEST(ExampleParserTest, MatchesProtobufOnRandomExamples) {
  ExpectMatchesProtobufOnRandomBatches(TestSpec(), kNames, 1, 4);
}

TEST(ExampleParserTest, MatchesProtobufWithAllVarSpecOnRandomExamples) {
  FeatureSpec spec;
  for (const char* name : {"image", "label", "tokens", "tags"}) {
    FeatureConfig c;
    c.kind = FeatureConfig::Kind::kVar;
    c.dtype = std::string(name) == "tags" ? DType::kBytes : DType::kInt64;
    spec.Add(name, c);
  }
  Generator g(2);
  for (int round = 0; round < 2000; ++round) {
    const std::vector<std::string> batch = {RandomExample(g, kNames, spec)};
    ParsedBatch fast, reference;
    ASSERT_EQ(FastParse(spec, batch, &fast),
              ReferenceParse(spec, batch, &reference));
    ExpectSameBatch(fast, reference, " round " + std::to_string(round));
  }
}

// Mutated bytes: never a crash, and rejected exactly when protobuf rejects.
TEST(ExampleParserTest, MutatedBytesAreRejectedExactlyWhenProtobufRejects) {
  FeatureSpec spec;
  for (const std::string& name : kNames) {
    if (name.empty()) continue;
    FeatureConfig c;
    c.kind = FeatureConfig::Kind::kVar;
    c.dtype = name == "image" || name == "weights" ? DType::kFloat32
              : name == "tags" || name == "name"   ? DType::kBytes
                                                   : DType::kInt64;
    spec.Add(name, c);
  }
  // protobuf logs every invalid UTF-8 key it rejects; the test makes many.
  google::protobuf::LogSilencer silence;
  Generator g(::testing::GTEST_FLAG(random_seed) == 0
                  ? 3
                  : ::testing::GTEST_FLAG(random_seed));
  int rejected = 0, accepted = 0;
  for (int round = 0; round < 100000; ++round) {
    std::string bytes = RandomExample(g, kNames, TestSpec());
    const int edits = 1 + static_cast<int>(g.Below(3));
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      const size_t at = g.Below(bytes.size());
      switch (g.Below(4)) {
        case 0:
          bytes[at] = static_cast<char>(g.rng()());
          break;
        case 1:
          bytes[at] ^= static_cast<char>(1 << g.Below(8));
          break;
        case 2:
          bytes.erase(at, 1 + g.Below(3));
          break;
        case 3:
          bytes.resize(at);
          break;
      }
    }
    tensorflow::Example ex;
    const bool protobuf_ok = ex.ParseFromString(bytes);
    ParsedBatch fast, reference;
    const std::string fast_error = FastParse(spec, {bytes}, &fast);
    const bool fast_rejected = fast_error == "Can't parse serialized Example.";
    ASSERT_EQ(fast_rejected, !protobuf_ok)
        << "round " << round << ": " << fast_error << "\n"
        << Hex(bytes);
    if (protobuf_ok) {
      // Accepted: the same values, or the same complaint about them.
      ASSERT_EQ(fast_error, ReferenceParse(spec, {bytes}, &reference));
      if (fast_error.empty()) {
        ExpectSameBatch(fast, reference, " round " + std::to_string(round));
      }
      ++accepted;
    } else {
      ++rejected;
    }
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 1000);
}

// How UsualExample's features differ from TestSpec(): not at all, or in
// one way that holds for every Example of a dataset (so the layout memo
// learns it): `label` missing (it has a default), `image` with 4 values
// where the spec's shape holds 6, `name` an Int64List where the spec asks
// for bytes.
enum class Layout { kAsTheSpec, kNoLabel, kShortImage, kNameOfInts };

// An Example as serializers lay it out (per feature one key, one Feature,
// one list, one run of values), its values drawn at random at fixed sizes
// but for `tokens` varints: a dataset's Examples, the parser's layout memo
// (example_parser.cc) decodes the ones after the first without a walk and
// writes their rows straight from the values' places.
std::string UsualExample(Generator& g, size_t tokens,
                         Layout layout = Layout::kAsTheSpec) {
  std::string features;
  auto add = [&](const std::string& name, int kind, const std::string& run) {
    std::string list, feature, entry;
    PutLengthDelimited(list, 1, run);
    PutLengthDelimited(feature, kind, list);
    PutLengthDelimited(entry, 1, name);
    PutLengthDelimited(entry, 2, feature);
    PutLengthDelimited(features, 1, entry);
  };
  auto random_bytes = [&](size_t n) {
    std::string b(n, 0);
    for (char& ch : b) ch = static_cast<char>(g.rng()());
    return b;
  };
  auto varints = [&](size_t n) {
    std::string run;
    for (size_t i = 0; i < n; ++i) PutVarint(run, g.Below(128));
    return run;
  };
  // Float bits, NaNs included.
  add("image", 2, random_bytes(layout == Layout::kShortImage ? 16 : 24));
  if (layout != Layout::kNoLabel) add("label", 3, varints(1));
  if (layout == Layout::kNameOfInts) {
    add("name", 3, varints(1));
  } else {
    add("name", 1, random_bytes(5));
  }
  add("tokens", 3, varints(tokens));
  add("other", 3, varints(2));  // not in the spec
  add("weights", 2, random_bytes(8));
  add("tags", 1, random_bytes(3));
  std::string example;
  PutLengthDelimited(example, 1, features);
  return example;
}

// Batches of Examples laid out alike, some of them edited: a byte changed
// anywhere (around the values: another key, kind or length; inside them:
// another value, a varint cut or split in two), or another count of
// tokens.  Each batch parses to protobuf's values, or fails with its
// error, as the random Examples above.
TEST(ExampleParserTest, ExamplesLaidOutAlikeMatchProtobuf) {
  const FeatureSpec spec = TestSpec();
  google::protobuf::LogSilencer silence;
  Generator g(11);
  ExpectMatchesProtobufOnBatches(
      spec, g,
      [](Generator& g) {
        std::vector<std::string> batch = {UsualExample(g, 3)};
        for (int i = 0; i < 15; ++i) {
          // Half of them the one before with new values, half edits of it.
          std::string next = g.Coin(2) ? UsualExample(g, 3) : batch.back();
          if (g.Coin(20)) next = UsualExample(g, g.Coin(2) ? 2 : 4);
          if (g.Coin(12)) {
            const size_t at = g.Below(next.size());
            if (g.Coin(2)) {
              next[at] = static_cast<char>(g.rng()());
            } else {
              next[at] ^= static_cast<char>(1 << g.Below(8));
            }
          }
          batch.push_back(next);
        }
        return batch;
      },
      1000, 300);
}

// Batches of Examples laid out alike in a way the spec does not take as
// it is (a feature missing, or of another count or kind, in every one of
// them): protobuf's values (the default in place of the missing label) or
// its error, as with any other Examples.
TEST(ExampleParserTest, ExamplesLaidOutAlikeButNotAsTheSpecMatchProtobuf) {
  const FeatureSpec spec = TestSpec();
  for (Layout layout :
       {Layout::kNoLabel, Layout::kShortImage, Layout::kNameOfInts}) {
    SCOPED_TRACE(static_cast<int>(layout));
    Generator g(12);
    int ok = 0;
    for (int round = 0; round < 200; ++round) {
      std::vector<std::string> batch;
      for (int i = 0; i < 16; ++i) batch.push_back(UsualExample(g, 3, layout));
      ParsedBatch fast, reference;
      const std::string fast_error = FastParse(spec, batch, &fast);
      ASSERT_EQ(fast_error, ReferenceParse(spec, batch, &reference))
          << "round " << round;
      if (fast_error.empty()) {
        ExpectSameBatch(fast, reference, " round " + std::to_string(round));
        ++ok;
      }
    }
    // Only the missing label (it has a default) leaves the batch valid.
    EXPECT_EQ(ok, layout == Layout::kNoLabel ? 200 : 0);
  }
}

// A batch of Examples laid out alike parsed on several threads (each part
// writing its FixedLen rows into the whole batch's tensors in place; 5,000
// Examples of ~70 bytes make four parts of at least kMinPartBytes):
// protobuf's values, as on one thread.
TEST(ExampleParserTest, ExamplesLaidOutAlikeOnThreadsMatchProtobuf) {
  const FeatureSpec spec = TestSpec();
  Generator g(13);
  std::vector<std::string> batch;
  for (int i = 0; i < 5000; ++i) batch.push_back(UsualExample(g, 3));
  ParsedBatch reference;
  ASSERT_EQ(ReferenceParse(spec, batch, &reference), "");
  for (int threads : {1, 4}) {
    ParsedBatch fast;
    ASSERT_EQ(FastParse(spec, batch, &fast, threads), "");
    ExpectSameBatch(fast, reference, " threads " + std::to_string(threads));
  }
}

// Feature names of every length class the name table distinguishes (up to
// 16 bytes compared as words, longer ones byte by byte, one-byte and
// two-byte key lengths), names alike but for their middle, non-ASCII
// UTF-8, and a spec name that is not UTF-8 (protobuf rejects every key
// that is not): the same values and errors as protobuf.
TEST(ExampleParserTest, NamesOfEveryLengthMatchProtobuf) {
  const std::vector<std::string> names = {"x",
                                          "größe",
                                          "sixteen_bytes_16",
                                          "seventeen_bytes17",
                                          "prefix_same_A_suffix_same",
                                          "prefix_same_B_suffix_same",
                                          std::string(127, 'k'),
                                          std::string(128, 'k'),
                                          std::string(300, 'n') + "ü",
                                          "not_in_spec_but_a_long_name",
                                          "äöü_not_in_spec"};
  FeatureSpec spec;
  for (size_t i = 0; i < names.size() - 2; ++i) {
    FeatureConfig c;
    c.kind =
        i % 2 == 0 ? FeatureConfig::Kind::kVar : FeatureConfig::Kind::kFixed;
    c.dtype = i % 3 == 0   ? DType::kInt64
              : i % 3 == 1 ? DType::kBytes
                           : DType::kFloat32;
    if (c.kind == FeatureConfig::Kind::kFixed) {
      c.shape = {1};
      c.default_value = DefaultValue{};
      if (c.dtype == DType::kInt64) c.default_value->ints = {5};
      if (c.dtype == DType::kBytes) c.default_value->bytes = {"d"};
      if (c.dtype == DType::kFloat32) c.default_value->floats = {0.5f};
    }
    spec.Add(names[i], c);
  }
  google::protobuf::LogSilencer silence;
  ExpectMatchesProtobufOnRandomBatches(spec, names, 9, 3);

  // A spec may name a key no valid Example holds: protobuf refuses the
  // key, whether the spec asks for it or not.
  const std::string bad = "bad\xff\xfeutf8";
  FeatureConfig c;
  c.kind = FeatureConfig::Kind::kVar;
  c.dtype = DType::kInt64;
  spec.Add(bad, c);
  for (const std::string& key : {bad, std::string("x")}) {
    std::string list, feature, entry, features, example;
    PutLengthDelimited(list, 1, std::string("\x07", 1));
    PutLengthDelimited(feature, 3, list);
    PutLengthDelimited(entry, 1, key);
    PutLengthDelimited(entry, 2, feature);
    PutLengthDelimited(features, 1, entry);
    PutLengthDelimited(example, 1, features);
    ParsedBatch fast, reference;
    const std::string fast_error = FastParse(spec, {example}, &fast);
    EXPECT_EQ(fast_error, ReferenceParse(spec, {example}, &reference));
    EXPECT_EQ(fast_error.empty(), key == "x");
  }
}

TEST(ExampleParserTest, SerializedByProtobufParsesToTheSameValues) {
  tensorflow::Example ex;
  auto& map = *ex.mutable_features()->mutable_feature();
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}) {
    map["image"].mutable_float_list()->add_value(v);
  }
  map["label"].mutable_int64_list()->add_value(7);
  map["name"].mutable_bytes_list()->add_value("seven");
  map["tokens"].mutable_int64_list()->add_value(-3);
  map["tokens"].mutable_int64_list()->add_value(1ll << 40);
  map["unused"].mutable_bytes_list()->add_value("x");
  map["tags"];  // a Feature with no list: missing
  ParsedBatch b;
  ASSERT_EQ(FastParse(TestSpec(), {ex.SerializeAsString()}, &b), "");
  EXPECT_EQ(Vec(b.feature("image").floats),
            (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(Vec(b.feature("label").ints), std::vector<int64_t>{7});
  EXPECT_EQ(b.feature("name").bytes_value(0), "seven");
  EXPECT_EQ(Vec(b.feature("tokens").ints),
            (std::vector<int64_t>{-3, int64_t{1} << 40}));
  EXPECT_EQ(Vec(b.feature("tokens").row_lengths), std::vector<int64_t>{2});
  EXPECT_EQ(Vec(b.feature("tags").row_lengths), std::vector<int64_t>{0});
  EXPECT_TRUE(b.feature("weights").floats.empty());
}

TEST(ExampleParserTest, ErrorsAreTensorFlowsWithFileAndRecord) {
  const FeatureSpec spec = TestSpec();
  tensorflow::Example ex;
  (*ex.mutable_features()->mutable_feature())["image"]
      .mutable_float_list()
      ->add_value(1);
  const std::string one_float = ex.SerializeAsString();
  std::vector<std::string_view> batch = {one_float};
  ParsedBatch out;
  try {
    ExampleParser(spec).ParseBatch(batch, &out, {"train.tfrecord", 41});
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_STREQ(e.what(),
                 "train.tfrecord: record 41: Key: image, Index: 0.  Number "
                 "of float values != expected.  Values size: 1 but output "
                 "shape: [2,3]");
  }
  tensorflow::Example none;
  const std::string empty = none.SerializeAsString();
  batch = {empty};
  try {
    ExampleParser(spec).ParseBatch(batch, &out);
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_STREQ(e.what(),
                 "Feature: image (data type: float) is required but could "
                 "not be found.");
  }
  const std::string garbage = "\xff\xff";
  batch = {garbage};
  EXPECT_THROW(ExampleParser(spec).ParseBatch(batch, &out), ParseError);
}

// ShapeOutput makes an output one feature per spec feature, named and
// configured by the spec, before any parse: an output of the same spec
// keeps its buffers; another spec's is reshaped.
TEST(ExampleParserTest, ShapeOutputShapesForTheSpecAndKeepsItsOwnBuffers) {
  const ExampleParser parser(FeatureSpec::FromJsonText(R"({"features": {
    "label": {"kind": "fixed", "dtype": "int64", "shape": []},
    "x": {"kind": "fixed", "dtype": "float32", "shape": [3],
          "default": [1, 2, 3]}}})"));
  ParsedBatch out;
  parser.ShapeOutput(&out);
  ASSERT_EQ(out.features.size(), 2u);
  for (size_t d = 0; d < 2; ++d) {
    EXPECT_EQ(out.features[d].name, parser.spec().features[d].first);
    EXPECT_EQ(out.features[d].config.dtype,
              parser.spec().features[d].second.dtype);
    EXPECT_EQ(out.features[d].config.default_value.has_value(),
              parser.spec().features[d].second.default_value.has_value());
    EXPECT_EQ(out.features[d].num_values(), 0u);
  }
  ASSERT_TRUE(out.features[1].config.default_value.has_value());
  EXPECT_EQ(out.features[1].config.default_value->floats,
            (std::vector<float>{1, 2, 3}));
  // Shaped alike, its buffers stay for the parse to reuse.
  out.features[1].floats.reserve(300);
  const float* buffer = out.features[1].floats.data();
  parser.ShapeOutput(&out);
  EXPECT_EQ(out.features[1].floats.data(), buffer);
  EXPECT_GE(out.features[1].floats.capacity(), 300u);
  // Another spec's output is made this one's.
  const ExampleParser other(FeatureSpec::FromJsonText(R"({"features": {
    "label": {"kind": "fixed", "dtype": "float32", "shape": []}}})"));
  other.ShapeOutput(&out);
  ASSERT_EQ(out.features.size(), 1u);
  EXPECT_EQ(out.features[0].config.dtype, DType::kFloat32);
}

TEST(ExampleParserTest, ThreadsGiveTheSameBatch) {
  const FeatureSpec spec = TestSpec();
  Generator g(4);
  std::vector<std::string> batch;
  while (batch.size() < 1000) {
    std::string e = RandomExample(g, kNames, spec);
    std::vector<std::string> one = {e};
    ParsedBatch probe;
    if (ReferenceParse(spec, one, &probe).empty()) batch.push_back(e);
  }
  ParsedBatch one, four;
  ASSERT_EQ(FastParse(spec, batch, &one, 1), "");
  ASSERT_EQ(FastParse(spec, batch, &four, 4), "");
  ExpectSameBatch(one, four, "");
  // Reusing the output for another batch leaves nothing of the first.
  std::vector<std::string> small(batch.begin(), batch.begin() + 3);
  ParsedBatch fresh;
  ASSERT_EQ(FastParse(spec, small, &four, 4), "");
  ASSERT_EQ(FastParse(spec, small, &fresh, 1), "");
  ExpectSameBatch(four, fresh, "");
}

// --- SequenceExample ----------------------------------------------------

std::string ReferenceParseSequence(const FeatureSpec& context_spec,
                                   const FeatureSpec& sequence_spec,
                                   const std::vector<std::string>& serialized,
                                   ParsedSequenceBatch* out) {
  ResetReference(context_spec, serialized.size(), &out->context);
  ResetReference(sequence_spec, serialized.size(), &out->sequence);
  for (size_t i = 0; i < serialized.size(); ++i) {
    tensorflow::SequenceExample ex;
    if (!ex.ParseFromString(serialized[i])) {
      return "Can't parse serialized SequenceExample.";
    }
    std::string error = ReferenceExtract(ex.context(), i, &out->context);
    if (!error.empty()) return error;
    for (ParsedFeature& f : out->sequence.features) {
      const FeatureConfig& c = f.config;
      const auto& lists = ex.feature_lists().feature_list();
      auto it = lists.find(f.name);
      if (it == lists.end()) {
        f.row_lengths.push_back(0);
        continue;
      }
      const auto& steps = it->second.feature();
      for (int j = 0; j < steps.size(); ++j) {
        const int kind = steps[j].kind_case();
        const std::string where = "Key: " + f.name +
                                  ", Index: " + std::to_string(i) +
                                  ", Step: " + std::to_string(j) + ".  ";
        if (kind != 0 && kind != WantKind(c.dtype)) {
          return where +
                 "Data types don't match. Data type: " + kKindNames[kind] +
                 " but expected type: " +
                 std::string(TensorFlowDTypeName(c.dtype));
        }
        const size_t count = ReferenceCount(steps[j]);
        if (c.kind == FeatureConfig::Kind::kFixed &&
            count != static_cast<size_t>(c.num_elements())) {
          return where + "Number of " + kValueNames[WantKind(c.dtype)] +
                 " values != expected.  Values size: " + std::to_string(count) +
                 " but output shape: " + ShapeText(c);
        }
        AppendReferenceValues(steps[j], &f);
        if (c.kind == FeatureConfig::Kind::kVar) {
          f.step_lengths.push_back(static_cast<int64_t>(count));
        }
      }
      f.row_lengths.push_back(steps.size());
    }
  }
  return "";
}

// A SequenceExample: the context is a random Example's Features (same
// field number), the feature lists random steps in every encoding.
std::string RandomSequenceExample(Generator& g, const FeatureSpec& context,
                                  const FeatureSpec& sequence) {
  std::string out = RandomExample(g, kNames, context);
  std::string lists;
  for (const char* name : {"frames", "words", "other"}) {
    if (g.Coin(5)) continue;
    const FeatureConfig* c = sequence.Find(name);
    std::string feature_list;
    const size_t steps = g.Below(5);
    for (size_t j = 0; j < steps; ++j) {
      int kind = c ? WantKind(c->dtype) : 1 + static_cast<int>(g.Below(3));
      if (g.Coin(10)) kind = 1 + static_cast<int>(g.Below(3));
      size_t n = g.Below(4);
      if (c && c->kind == FeatureConfig::Kind::kFixed && !g.Coin(10)) {
        n = static_cast<size_t>(c->num_elements());
      }
      std::vector<float> fl;
      std::vector<int64_t> il;
      std::vector<std::string> bl;
      std::string feature;
      if (!g.Coin(15)) {
        PutLengthDelimited(feature, static_cast<uint32_t>(kind),
                           g.List(kind, n, &fl, &il, &bl));
      }
      PutLengthDelimited(feature_list, 1, feature);
    }
    std::string entry;
    PutLengthDelimited(entry, 1, name);
    if (g.Coin(4) && !feature_list.empty()) {  // two FeatureList pieces
      const size_t cut = feature_list.size() / 2;
      (void)cut;
      PutLengthDelimited(entry, 2, feature_list);
      PutLengthDelimited(entry, 2, feature_list);
    } else {
      PutLengthDelimited(entry, 2, feature_list);
    }
    PutLengthDelimited(lists, 1, entry);
  }
  PutLengthDelimited(out, 2, lists);
  return out;
}

TEST(SequenceExampleParserTest, MatchesProtobufOnRandomAndMutatedInputs) {
  const FeatureSpec context = TestSpec();
  const FeatureSpec sequence = FeatureSpec::FromJsonText(R"({"features": {
      "frames": {"kind": "fixed", "dtype": "float32", "shape": [2]},
      "words": {"kind": "var", "dtype": "bytes"}}})");
  const SequenceExampleParser parser(context, sequence);
  google::protobuf::LogSilencer silence;
  Generator g(::testing::GTEST_FLAG(random_seed) == 0
                  ? 9
                  : ::testing::GTEST_FLAG(random_seed));
  int ok = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string bytes = RandomSequenceExample(g, context, sequence);
    if (round % 2 == 1 && !bytes.empty()) {  // mutate half of them
      const size_t at = g.Below(bytes.size());
      if (g.Coin(2)) {
        bytes[at] ^= static_cast<char>(1 << g.Below(8));
      } else {
        bytes.resize(at);
      }
    }
    ParsedSequenceBatch fast, reference;
    std::string fast_error;
    const std::vector<std::string_view> views = {bytes};
    try {
      parser.ParseBatch(views, &fast);
    } catch (const ParseError& e) {
      fast_error = e.what();
    }
    ASSERT_EQ(fast_error,
              ReferenceParseSequence(context, sequence, {bytes}, &reference))
        << "round " << round << "\n"
        << Hex(bytes);
    if (fast_error.empty()) {
      ++ok;
      ExpectSameBatch(fast.context, reference.context, "context");
      ExpectSameBatch(fast.sequence, reference.sequence, "sequence");
      for (size_t d = 0; d < fast.sequence.features.size(); ++d) {
        ASSERT_EQ(fast.sequence.features[d].step_lengths,
                  reference.sequence.features[d].step_lengths);
      }
    }
  }
  EXPECT_GT(ok, 1000);
}

}  // namespace
}  // namespace recflow::records
