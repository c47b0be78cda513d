// Layers, Keras' in TF 1.x's functional form: each call applies the layer
// named `name` (or a fresh unique name) to its input, creating the
// layer's variables on first use ("<name>/kernel", "<name>/bias", ...).
//
//   Var h = layers::Dense(ctx, x, {.units = 256, .activation = kRelu});
//   h = layers::Dropout(ctx, h, 0.2f);
//   Var logits = layers::Dense(ctx, h, {.units = 10});
//
// Shapes: Dense takes [batch, features]; Conv2D and pooling take NHWC.
// Errors (shapes that do not fit) throw train::Error naming the layer.
#ifndef RECFLOW_TRAIN_LAYERS_H_
#define RECFLOW_TRAIN_LAYERS_H_

#include <cstdint>
#include <string>

#include "train/model_context.h"
#include "train/ops.h"

namespace recflow::train::layers {

struct DenseOptions {
  int64_t units = 0;
  Activation activation = Activation::kLinear;
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::GlorotUniform();
  std::string name = {};  // default "dense", "dense_1", ...
};
Var Dense(ModelContext& ctx, const Var& x, const DenseOptions& o);

struct Conv2DOptions {
  int64_t filters = 0;
  int kernel_h = 3, kernel_w = 3;
  int stride_h = 1, stride_w = 1;
  Padding padding = Padding::kValid;
  Activation activation = Activation::kLinear;
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::GlorotUniform();
  std::string name = {};  // default "conv2d", ...
};
Var Conv2D(ModelContext& ctx, const Var& x, const Conv2DOptions& o);

struct Pool2DOptions {
  int pool_h = 2, pool_w = 2;
  int stride_h = 0, stride_w = 0;  // 0: the pool size (Keras' default)
  Padding padding = Padding::kValid;
};
Var MaxPool2D(ModelContext& ctx, const Var& x, const Pool2DOptions& o = {});
Var AvgPool2D(ModelContext& ctx, const Var& x, const Pool2DOptions& o = {});

// [batch, ...] -> [batch, rest].
Var Flatten(ModelContext& ctx, const Var& x);

// Identity outside training.
Var Dropout(ModelContext& ctx, const Var& x, float rate);

struct BatchNormOptions {
  float momentum = 0.99f;
  float epsilon = 1e-3f;
  std::string name = {};  // default "batch_normalization", ...
};
// Over the last axis; moving averages are non-trainable variables
// ("<name>/moving_mean", "<name>/moving_variance") saved in checkpoints.
Var BatchNorm(ModelContext& ctx, const Var& x, const BatchNormOptions& o = {});

struct EmbeddingOptions {
  int64_t input_dim = 0;  // rows: ids in [0, input_dim)
  int64_t output_dim = 0;
  Initializer initializer = Initializer::RandomUniform(0.05f);
  std::string name = {};  // default "embedding", ...
};
// ids (integers of any shape) -> ids.shape + [output_dim].
Var Embedding(ModelContext& ctx, const Tensor& ids, const EmbeddingOptions& o);

}  // namespace recflow::train::layers

#endif  // RECFLOW_TRAIN_LAYERS_H_
