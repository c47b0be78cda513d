// The binary form of an iterator's position (Iterator::Save/Restore).
//
// A blob is: "RFIS" | u32 version | the pipeline's description (so a state
// is never restored into a different pipeline) | each stage's fields, in the
// order the stages write them, every stage starting with its name | u32
// masked CRC-32C of all that.  Integers are little-endian.  Damage or a
// mismatch is an Error saying which stage and what was expected.
//
// Not thread-safe; a writer or reader belongs to one Save/Restore call.
#ifndef RECFLOW_PIPELINE_STATE_H_
#define RECFLOW_PIPELINE_STATE_H_

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "pipeline/tensor.h"

namespace recflow::pipeline {

class StateWriter {
 public:
  explicit StateWriter(std::string_view description);

  // Starts a stage's fields; StateReader::BeginStage checks the name.
  void BeginStage(std::string_view name) { String(name); }
  void U64(uint64_t v);
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Bool(bool v) { U64(v ? 1 : 0); }
  void String(std::string_view s);
  void WriteTensor(const Tensor& t);
  void WriteElement(const Element& e);

  // The finished blob (adds the CRC).
  std::string Finish() &&;

 private:
  std::string out_;
};

class StateReader {
 public:
  // Checks magic, version, CRC and that the blob was saved from a pipeline
  // described as `description`.
  StateReader(std::string_view blob, std::string_view description);

  void BeginStage(std::string_view name);
  uint64_t U64();
  int64_t I64() { return static_cast<int64_t>(U64()); }
  bool Bool() { return U64() != 0; }
  std::string String();
  Tensor ReadTensor();
  Element ReadElement();
  // Throws unless every byte was consumed.
  void Finish();
  // Throws Error naming the stage and the byte: for a value that the stage
  // could not have saved (a position outside its range).  Stages check
  // what they restore, so that a damaged or forged state with a valid CRC
  // fails here instead of making Next() run for ever or out of range.
  [[noreturn]] void Fail(std::string_view what) const;

 private:
  void Need(size_t n) const;

  std::string_view in_;
  size_t pos_ = 0;
  std::string stage_ = "header";
};

// A finished result an asynchronous stage holds: the end of its input
// (kind 0), an element (2) or an error (3), saved with its class and the
// fields it was made from, so a restored error is the same class with the
// same message (records::RecordError keeps its path, offset and damage;
// a class of another layer comes back as pipeline::Error with its message).
// Kind 1, an error saved by its message alone, is still read.
void WriteResult(StateWriter* w, bool end, const std::exception_ptr& error,
                 const Element& element);
// Reads one into whichever of *end, *error and *element it is; fails on
// another kind.
void ReadResult(StateReader* r, bool* end, std::exception_ptr* error,
                Element* element);
// A stage's buffer of finished results, as the stages that keep one save
// it: Bool(its input ended), U64(count), then each result (WriteResult),
// oldest first.  Reads them, calling add(end, error, element) on each in
// order, and returns whether the input ended.  Refuses (Fail) more than
// `max_results` results, an end that is not the last result, and an input
// marked ended without its end as the last result or the other way round:
// a driver stops once its input has ended, so its consumer would wait
// forever for an end that is not there.
bool ReadResults(StateReader* r, uint64_t max_results,
                 const std::function<void(bool end, std::exception_ptr error,
                                          Element element)>& add);

// One element as a self-contained, CRC-checked blob (a state of the
// description "recflow-cache-element" holding the element: its
// components' names, dtypes, shapes, ragged row lengths and values, and
// its origin): what a file Cache and a saved dataset keep per record.
std::string EncodeElementRecord(const Element& e);
// The element back; an Error (saying what is wrong) for any other bytes.
Element DecodeElementRecord(std::string_view blob);

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_STATE_H_
