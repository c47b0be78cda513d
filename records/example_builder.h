// ExampleBuilder: writes a serialized tf.train.Example straight in the wire
// format (FloatList and Int64List packed, as TensorFlow writes them),
// without building protobuf messages; what the converters use.
//
//   ExampleBuilder b;
//   b.AddBytes("image", raw).AddInt64("label", 7);
//   writer.Write(b.Serialize());   // view valid until the next Clear/Add
//   b.Clear();
//
// Features are written in the order they were added; adding a name twice
// writes it twice, and readers keep the last (protobuf's rule).  Not
// thread-safe; reuse one per thread.
#ifndef RECFLOW_RECORDS_EXAMPLE_BUILDER_H_
#define RECFLOW_RECORDS_EXAMPLE_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace recflow::records {

class ExampleBuilder {
 public:
  ExampleBuilder();

  ExampleBuilder& AddInt64(std::string_view name, int64_t value);
  ExampleBuilder& AddInt64List(std::string_view name,
                               std::span<const int64_t> values);
  ExampleBuilder& AddFloat(std::string_view name, float value);
  ExampleBuilder& AddFloatList(std::string_view name,
                               std::span<const float> values);
  ExampleBuilder& AddBytes(std::string_view name, std::string_view value);
  ExampleBuilder& AddBytesList(std::string_view name,
                               std::span<const std::string> values);
  ExampleBuilder& AddBytesList(std::string_view name,
                               std::span<const std::string_view> values);

  // The serialized Example; valid until the builder is next changed.
  std::string_view Serialize();
  // Empty again, keeping its buffer's capacity.
  void Clear();

 private:
  // Room before the Features' bytes for the Example's tag and length (a
  // varint of up to 10 bytes), which Serialize writes there.
  static constexpr size_t kHead = 11;

  // Appends a map entry: the key `name`, and a Feature whose field `kind`
  // holds `list_size` bytes, which write_list(p) writes from p.
  template <typename WriteList>
  void AddEntry(std::string_view name, int kind, size_t list_size,
                WriteList write_list);

  std::string buffer_;  // kHead bytes, then the Features message's
};

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_EXAMPLE_BUILDER_H_
