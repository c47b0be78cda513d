// The errors of train/.
#ifndef RECFLOW_TRAIN_ERROR_H_
#define RECFLOW_TRAIN_ERROR_H_

#include "pipeline/tensor.h"

namespace recflow::train {

// A misuse of the API (shapes that do not fit, a label out of range, an
// unknown name) or a failure of training (a NaN loss, a damaged
// checkpoint).  The message says where and what was expected.
class Error : public pipeline::Error {
 public:
  using pipeline::Error::Error;
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_ERROR_H_
