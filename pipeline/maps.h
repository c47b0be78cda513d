// Built-in maps: the element transformations most input pipelines need
// after Parse, written in C++ so that they run on the pipeline's threads
// (MapOptions::num_parallel_calls) without a user function, and so that
// the Python module can offer them without holding the GIL.
//
//   ds.Parse(spec)
//     .Map(maps::DecodeRaw("image", DType::kUInt8, Shape{28, 28}))
//     .Map(maps::Scale("image", 1.0 / 255))
//     .Map(maps::Cast("label", DType::kInt32));
//
// Each returns a MapFn that leaves every other component as it is.  They
// work on single elements and on batches alike (a batch has one more, first
// dimension).  Errors (Error) name the component, the element's origin and
// what was expected.  Thread-safe: the functions hold no state.
#ifndef RECFLOW_PIPELINE_MAPS_H_
#define RECFLOW_PIPELINE_MAPS_H_

#include <string>
#include <vector>

#include "pipeline/dataset.h"

namespace recflow::pipeline::maps {

// tf.io.decode_raw: the bytes of each value of the bytes component `key`
// reinterpreted as little-endian `dtype` (numeric), reshaped to `shape`
// (empty: [n], the values one record's bytes hold; -1 in one dimension:
// inferred).  uint8 is a view of the bytes where they lie back to back (as
// after Parse); other dtypes are copied.  Every value must hold the same
// number of bytes, a multiple of the dtype's size, matching `shape`.
MapFn DecodeRaw(std::string key, DType dtype, std::vector<int64_t> shape = {});

// tf.cast: the numeric component `key` converted to `dtype` (numeric), as
// static_cast does (float to integer rounds toward zero; past float32's
// range a float is +-inf).  A value outside an integer dtype's range (or
// NaN) is an Error naming it, where tf.cast would wrap it or leave it
// undefined.
MapFn Cast(std::string key, DType dtype);

// value * scale + offset, as float32 (the usual normalisation of images:
// Scale("image", 1.0 / 255)).
MapFn Scale(std::string key, double scale, double offset = 0);

// Keeps only the components in `keys`, in that order; throws Error naming
// a missing one.
MapFn Select(std::vector<std::string> keys);

// Renames component `from` to `to` (keeping its place); `to` may not be
// empty.
MapFn Rename(std::string from, std::string to);

// The element a record holds (EncodeElementRecord, as a saved dataset
// keeps them: Python's Dataset.save / load): the bytes scalar `key` becomes
// that element, exactly (names, dtypes, shapes, ragged rows), with the
// record's origin.  Anything else in `key` is an Error naming the record.
MapFn DecodeElement(std::string key = "record");

}  // namespace recflow::pipeline::maps

#endif  // RECFLOW_PIPELINE_MAPS_H_
