// Helpers shared by the pipeline tests.
#ifndef RECFLOW_TESTS_PIPELINE_PIPELINE_TEST_UTIL_H_
#define RECFLOW_TESTS_PIPELINE_PIPELINE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/dataset.h"
#include "records/example_builder.h"
#include "records/feature_spec.h"
#include "records/tfrecord_format.h"
#include "test_util.h"

namespace recflow::testing {

// Host memory for IteratorOptions::output_memory and Tensor::CopyInto that
// remembers each block it handed out and has not taken back, and which
// threads asked for them: whether a tensor lies in it, where copies were
// made, and that every block comes back.  Pinned host memory by kind (what
// a GPU backend gives), ordinary memory underneath.
class RecordingMemory final : public pipeline::Allocator {
 public:
  explicit RecordingMemory(
      pipeline::MemoryKind kind = pipeline::MemoryKind::kPinnedHost)
      : kind_(kind) {}
  ~RecordingMemory() override {
    for (auto& [p, bytes] : live_) std::free(p);
  }

  void* Allocate(size_t bytes) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) throw pipeline::Error("RecordingMemory: out of memory");
    std::lock_guard<std::mutex> lock(mu_);
    live_[static_cast<char*>(p)] = bytes;
    threads_.insert(std::this_thread::get_id());
    ++allocations_;
    return p;
  }
  void Deallocate(void* p, size_t bytes) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<char*>(p));
    if (it == live_.end() || it->second != bytes) {
      ++bad_frees_;
      return;
    }
    live_.erase(it);
    std::free(p);
  }
  pipeline::MemoryKind kind() const override { return kind_; }
  std::string name() const override { return "recording memory"; }

  // Whether [p, p + n) lies in one block handed out and not yet back.
  bool Holds(const void* p, size_t n) const {
    std::lock_guard<std::mutex> lock(mu_);
    const char* c = static_cast<const char*>(p);
    auto it = live_.upper_bound(const_cast<char*>(c));
    if (it == live_.begin()) return false;
    --it;
    return c >= it->first && c + n <= it->first + it->second;
  }
  size_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  uint64_t allocations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocations_;
  }
  // Deallocate calls of a block not handed out, or with another size.
  uint64_t bad_frees() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_frees_;
  }
  std::set<std::thread::id> threads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  const pipeline::MemoryKind kind_;
  mutable std::mutex mu_;
  std::map<char*, size_t> live_;
  std::set<std::thread::id> threads_;
  uint64_t allocations_ = 0;
  uint64_t bad_frees_ = 0;
};

// Whether every tensor of `e` that Tensor::CopyInto copies (not ragged,
// numeric or bytes values of one length, not empty) lies in `memory`; the
// names of those that do not, else "".
inline std::string OutsideMemory(const pipeline::Element& e,
                                 const RecordingMemory& memory) {
  std::string outside;
  for (const auto& c : e.components) {
    const pipeline::Tensor& t = c.tensor;
    if (t.ragged() || t.num_elements() == 0) continue;
    if (t.dtype() == pipeline::DType::kBytes) {
      bool one_length = true;
      for (int64_t k = 1; k < t.num_elements(); ++k) {
        one_length &= t.bytes(k).size() == t.bytes(0).size();
      }
      if (!one_length || t.bytes(0).empty()) continue;
      if (!memory.Holds(t.bytes(0).data(), t.byte_size())) {
        outside += " " + c.name;
      }
    } else if (!memory.Holds(t.raw_data(), t.byte_size())) {
      outside += " " + c.name;
    }
  }
  return outside;
}

// Every element of `ds` (at most `limit`).
inline std::vector<pipeline::Element> Collect(const pipeline::Dataset& ds,
                                              pipeline::IteratorOptions o = {},
                                              size_t limit = SIZE_MAX) {
  pipeline::Iterator it = ds.MakeIterator(o);
  std::vector<pipeline::Element> out;
  pipeline::Element e;
  while (out.size() < limit && it.Next(&e)) out.push_back(std::move(e));
  return out;
}

// The next element's DebugString, "<end>", or the error in its place as
// "!" + its message.
inline std::string NextOrError(pipeline::Iterator& it) {
  try {
    auto e = it.Next();
    return e ? e->DebugString() : "<end>";
  } catch (const recflow::Error& e) {  // a reader's (records::) or a stage's
    return std::string("!") + e.what();
  }
}
// NextOrError until the end, "<end>" last.
inline std::vector<std::string> DrainWithErrors(pipeline::Iterator& it) {
  std::vector<std::string> out;
  while (out.empty() || out.back() != "<end>") out.push_back(NextOrError(it));
  return out;
}

// `all`, what one whole iteration of `ds` gave (DrainWithErrors): saved
// after each of its elements and errors, a new iterator restored from the
// state gives exactly the rest.
inline void ExpectRestoresAfterEveryElement(
    const pipeline::Dataset& ds, const std::vector<std::string>& all) {
  for (size_t k = 0; k < all.size(); ++k) {
    pipeline::Iterator it = ds.MakeIterator();
    for (size_t i = 0; i < k; ++i) NextOrError(it);
    pipeline::Iterator restored = ds.MakeIterator();
    restored.Restore(it.Save());
    ASSERT_EQ(
        DrainWithErrors(restored),
        std::vector<std::string>(all.begin() + static_cast<long>(k), all.end()))
        << "saved after " << k;
  }
}

// Fields of a state as the StateWriter writes them (8-byte little-endian
// integers; a string is its length, then its bytes).
inline std::string U64s(std::initializer_list<uint64_t> values) {
  std::string out;
  for (uint64_t v : values) {
    char b[8];
    records::EncodeLittleEndian<uint64_t>(b, v);
    out.append(b, 8);
  }
  return out;
}
inline std::string StateString(std::string_view s) {
  return U64s({s.size()}) + std::string(s);
}

// `state` with the first `fields` replaced by `replacement` and the CRC made
// right again: a forged state that only the stages' own checks can refuse.
inline std::string Forged(const std::string& state, const std::string& fields,
                          const std::string& replacement) {
  const size_t at = state.find(fields);
  EXPECT_NE(at, std::string::npos);
  if (at == std::string::npos) return state;
  return WithStateCrc(state.substr(0, at) + replacement +
                      state.substr(at + fields.size()));
}

// Restoring `state` into a new iterator of `ds` throws an Error whose
// message holds `expected`.
inline void ExpectRefused(const pipeline::Dataset& ds, const std::string& state,
                          const std::string& expected) {
  pipeline::Iterator b = ds.MakeIterator();
  try {
    b.Restore(state);
    FAIL() << "accepted; expected " << expected;
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find(expected), std::string::npos)
        << err.what();
  }
}

// [a, b) as int64s.
inline std::vector<int64_t> Iota(int64_t a, int64_t b) {
  std::vector<int64_t> v(static_cast<size_t>(b - a));
  std::iota(v.begin(), v.end(), a);
  return v;
}

// The int64 scalar `name` of each element.
inline std::vector<int64_t> Ints(const std::vector<pipeline::Element>& v,
                                 const std::string& name = "value") {
  std::vector<int64_t> out;
  for (const auto& e : v) {
    const auto& t = e[name];
    for (int64_t x : t.values<int64_t>()) out.push_back(x);
  }
  return out;
}

// The "record" bytes of each element.
inline std::vector<std::string> Records(
    const std::vector<pipeline::Element>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.emplace_back(e["record"].bytes(0));
  return out;
}

// Example i of file f: a label (f * 1000 + i), a [3] float vector, a
// ragged int64 list of i % 4 values and a bytes value whose length varies,
// so that records cross 4 KiB blocks; MixedSpec() parses all four.
inline std::string MixedExample(int f, int i) {
  records::ExampleBuilder b;
  b.AddInt64("label", f * 1000 + i);
  b.AddFloatList("x", std::vector<float>{1.0f * i, 2.0f * f, 0.5f});
  b.AddInt64List("tokens", std::vector<int64_t>(static_cast<size_t>(i % 4), f));
  b.AddBytes("blob", std::string(static_cast<size_t>((i * 389) % 5000), 'b'));
  return std::string(b.Serialize());
}

inline records::FeatureSpec MixedSpec() {
  return records::FeatureSpec::FromJsonText(R"({"features": {
    "label": {"kind": "fixed", "dtype": "int64", "shape": []},
    "x": {"kind": "fixed", "dtype": "float32", "shape": [3]},
    "tokens": {"kind": "var", "dtype": "int64"},
    "blob": {"kind": "fixed", "dtype": "bytes", "shape": []}}})");
}

inline pipeline::Element Int(int64_t v) {
  pipeline::Element e;
  e.Set("value", pipeline::Tensor::Scalar<int64_t>(v));
  return e;
}

// {"value": v * v} for the int64 scalar "value" of `e`.
inline pipeline::Element Square(pipeline::Element e) {
  const int64_t v = e["value"].scalar<int64_t>();
  return Int(v * v);
}

}  // namespace recflow::testing

#endif  // RECFLOW_TESTS_PIPELINE_PIPELINE_TEST_UTIL_H_
