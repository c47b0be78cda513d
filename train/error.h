// The errors of train/.
#ifndef RECFLOW_TRAIN_ERROR_H_
#define RECFLOW_TRAIN_ERROR_H_

#include "records/errors.h"

namespace recflow::train {

// A misuse of the API (shapes that do not fit, a label out of range, an
// unknown name) or a failure of training (a NaN loss, a damaged
// checkpoint).  The message says where and what was expected.  A sibling
// of records::Error and pipeline::Error under recflow::Error.
class Error : public recflow::Error {
 public:
  using recflow::Error::Error;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_ERROR_H_
