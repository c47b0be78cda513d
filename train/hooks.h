// SessionRunHook: TensorFlow's hook contract for watching and steering a
// training (or evaluation) loop.
//
// Order of calls, as tf.estimator:
//   begin()                          before anything runs
//   after_create_session(session)    variables restored, input ready
//   per step: before_run(ctx) -> SessionRunArgs (names of values to fetch)
//             the step runs
//             after_run(ctx, values) (the fetched values; may request_stop)
//   end(session)                     after the last step, also when the
//                                    input ran out; not after an exception
//   on_exception(e)                  when a step or a hook threw
// request_stop() takes effect after the current step: every hook still
// sees its after_run, then end().
//
// Fetchable names: "loss" (float32 scalar), "global_step" (int64 scalar,
// the step count after this step's update), and the names of the
// model_fn's predictions and tensors (EstimatorSpec::tensors holds any
// other value a hook should see, a learning rate for one).
#ifndef RECFLOW_TRAIN_HOOKS_H_
#define RECFLOW_TRAIN_HOOKS_H_

#include <exception>
#include <map>
#include <string>
#include <vector>

#include "pipeline/tensor.h"

namespace recflow::train {

class TrainingSession;

struct SessionRunArgs {
  std::vector<std::string> fetches;
};

struct SessionRunValues {
  std::map<std::string, pipeline::Tensor> results;  // what was asked for
  int64_t batch_size = 0;                           // examples in this step
  // The value of `name` as a double (scalars); throws Error when absent.
  double scalar(const std::string& name) const;
};

class RunContext {
 public:
  explicit RunContext(TrainingSession& session) : session_(session) {}
  TrainingSession& session() { return session_; }
  void request_stop() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }

 private:
  TrainingSession& session_;
  bool stop_requested_ = false;
};

class SessionRunHook {
 public:
  virtual ~SessionRunHook() = default;
  virtual void begin() {}
  virtual void after_create_session(TrainingSession& /*session*/) {}
  virtual SessionRunArgs before_run(RunContext& /*ctx*/) { return {}; }
  virtual void after_run(RunContext& /*ctx*/,
                         const SessionRunValues& /*values*/) {}
  virtual void end(TrainingSession& /*session*/) {}
  virtual void on_exception(const std::exception& /*e*/) {}
};

}  // namespace recflow::train

#endif  // RECFLOW_TRAIN_HOOKS_H_
