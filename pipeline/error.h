// The errors of pipeline/.
#ifndef RECFLOW_PIPELINE_ERROR_H_
#define RECFLOW_PIPELINE_ERROR_H_

#include "records/errors.h"

namespace recflow::pipeline {

// A misuse of the API or an element that a transformation cannot handle.
// The message says where.  A sibling of records::Error and train::Error
// under recflow::Error (records/errors.h): a damaged file read by a
// pipeline still surfaces as the records::RecordError the reader threw.
class Error : public recflow::Error {
 public:
  using recflow::Error::Error;
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_ERROR_H_
