#include "train/layers.h"

#include <fmt/format.h>

namespace recflow::train {

std::string_view ModeName(Mode m) {
  switch (m) {
    case Mode::kTrain:
      return "train";
    case Mode::kEval:
      return "eval";
    case Mode::kPredict:
      return "infer";
  }
  return "?";
}

std::string ModelContext::UniqueName(std::string_view base) {
  auto it = names_.find(base);
  if (it == names_.end()) {
    names_.emplace(std::string(base), 1);
    return std::string(base);
  }
  return fmt::format("{}_{}", base, it->second++);
}

uint64_t ModelContext::NextSeed() {
  return pipeline::MixSeed(
      pipeline::MixSeed(seed_, static_cast<uint64_t>(*global_step_)), ops_++);
}

namespace layers {
namespace {

std::string NameOf(ModelContext& ctx, const std::string& given,
                   std::string_view base) {
  return given.empty() ? ctx.UniqueName(base) : given;
}

Var Pool(ModelContext& ctx, Pooling kind, const Var& x,
         const Pool2DOptions& o) {
  return ops::Pool2D(ctx.backend(), kind, x, o.pool_h, o.pool_w,
                     o.stride_h == 0 ? o.pool_h : o.stride_h,
                     o.stride_w == 0 ? o.pool_w : o.stride_w, o.padding);
}

}  // namespace

Var Dense(ModelContext& ctx, const Var& x, const DenseOptions& o) {
  const std::string name = NameOf(ctx, o.name, "dense");
  if (o.units <= 0) {
    throw Error(fmt::format("layer {}: units must be positive", name));
  }
  if (x.shape().rank() != 2) {
    throw Error(fmt::format(
        "layer {}: Dense takes [batch, features], got {} (Flatten first?)",
        name, x.shape().ToString()));
  }
  VariableStore& vars = ctx.variables();
  Variable& kernel = vars.GetOrCreate(
      name + "/kernel", Shape{x.shape()[1], o.units}, o.kernel_initializer);
  Var bias;
  if (o.use_bias) {
    bias = VariableStore::Read(
        vars.GetOrCreate(name + "/bias", Shape{o.units}, Initializer::Zeros()));
  }
  return ops::FusedMatMul(ctx.backend(), x, VariableStore::Read(kernel), bias,
                          o.activation);
}

Var Conv2D(ModelContext& ctx, const Var& x, const Conv2DOptions& o) {
  const std::string name = NameOf(ctx, o.name, "conv2d");
  if (o.filters <= 0) {
    throw Error(fmt::format("layer {}: filters must be positive", name));
  }
  if (x.shape().rank() != 4) {
    throw Error(fmt::format(
        "layer {}: Conv2D takes NHWC [batch, height, width, channels], got {}",
        name, x.shape().ToString()));
  }
  VariableStore& vars = ctx.variables();
  Variable& kernel = vars.GetOrCreate(
      name + "/kernel", Shape{o.kernel_h, o.kernel_w, x.shape()[3], o.filters},
      o.kernel_initializer);
  Var bias;
  if (o.use_bias) {
    bias = VariableStore::Read(vars.GetOrCreate(
        name + "/bias", Shape{o.filters}, Initializer::Zeros()));
  }
  return ops::FusedConv2D(ctx.backend(), x, VariableStore::Read(kernel), bias,
                          o.activation, o.stride_h, o.stride_w, o.padding);
}

Var MaxPool2D(ModelContext& ctx, const Var& x, const Pool2DOptions& o) {
  return Pool(ctx, Pooling::kMax, x, o);
}

Var AvgPool2D(ModelContext& ctx, const Var& x, const Pool2DOptions& o) {
  return Pool(ctx, Pooling::kAverage, x, o);
}

Var Flatten(ModelContext& ctx, const Var& x) {
  return ops::Flatten(ctx.backend(), x);
}

Var Dropout(ModelContext& ctx, const Var& x, float rate) {
  if (!ctx.training()) return x;
  return ops::Dropout(ctx.backend(), x, rate, ctx.NextSeed());
}

Var BatchNorm(ModelContext& ctx, const Var& x, const BatchNormOptions& o) {
  const std::string name = NameOf(ctx, o.name, "batch_normalization");
  const int64_t channels =
      x.shape().rank() == 0 ? 1 : x.shape()[x.shape().rank() - 1];
  VariableStore& vars = ctx.variables();
  Variable& gamma =
      vars.GetOrCreate(name + "/gamma", Shape{channels}, Initializer::Ones());
  Variable& beta =
      vars.GetOrCreate(name + "/beta", Shape{channels}, Initializer::Zeros());
  Variable& mean = vars.GetOrCreate(name + "/moving_mean", Shape{channels},
                                    Initializer::Zeros(), /*trainable=*/false);
  Variable& variance =
      vars.GetOrCreate(name + "/moving_variance", Shape{channels},
                       Initializer::Ones(), /*trainable=*/false);
  return ops::BatchNorm(ctx.backend(), x, VariableStore::Read(gamma),
                        VariableStore::Read(beta), mean.data(), variance.data(),
                        ctx.training(), o.momentum, o.epsilon);
}

Var Embedding(ModelContext& ctx, const Tensor& ids, const EmbeddingOptions& o) {
  const std::string name = NameOf(ctx, o.name, "embedding");
  if (o.input_dim <= 0 || o.output_dim <= 0) {
    throw Error(fmt::format(
        "layer {}: input_dim and output_dim must be positive", name));
  }
  Variable& table = ctx.variables().GetOrCreate(
      name + "/embeddings", Shape{o.input_dim, o.output_dim}, o.initializer);
  return ops::Gather(ctx.backend(), VariableStore::Read(table), ids);
}

}  // namespace layers
}  // namespace recflow::train
