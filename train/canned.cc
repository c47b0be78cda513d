#include "train/canned.h"

#include <fmt/format.h>

#include <unordered_map>

#include "train/layers.h"

namespace recflow::train {

int64_t FeatureColumn::width() const {
  switch (kind) {
    case Kind::kNumeric:
    case Kind::kRawBytes:
      return shape.num_elements();
    case Kind::kIdentity:
      return embedding_dim > 0 ? embedding_dim : num_buckets;
    case Kind::kVocabulary:
      return embedding_dim > 0 ? embedding_dim
                               : static_cast<int64_t>(vocabulary.size()) + 1;
  }
  return 0;
}

FeatureColumn NumericColumn(std::string key, Shape shape, float shift,
                            float scale) {
  FeatureColumn c;
  c.kind = FeatureColumn::Kind::kNumeric;
  c.key = std::move(key);
  c.shape = shape;
  c.shift = shift;
  c.scale = scale;
  return c;
}

FeatureColumn RawBytesColumn(std::string key, Shape shape, float scale) {
  FeatureColumn c = NumericColumn(std::move(key), shape, 0.0f, scale);
  c.kind = FeatureColumn::Kind::kRawBytes;
  return c;
}

FeatureColumn CategoricalColumnWithIdentity(std::string key,
                                            int64_t num_buckets) {
  if (num_buckets <= 0) {
    throw Error(fmt::format("column {}: num_buckets must be positive", key));
  }
  FeatureColumn c;
  c.kind = FeatureColumn::Kind::kIdentity;
  c.key = std::move(key);
  c.num_buckets = num_buckets;
  return c;
}

FeatureColumn CategoricalColumnWithVocabularyList(
    std::string key, std::vector<std::string> vocabulary) {
  if (vocabulary.empty()) {
    throw Error(fmt::format("column {}: the vocabulary is empty", key));
  }
  FeatureColumn c;
  c.kind = FeatureColumn::Kind::kVocabulary;
  c.key = std::move(key);
  c.vocabulary = std::move(vocabulary);
  return c;
}

FeatureColumn IndicatorColumn(FeatureColumn categorical) {
  if (!categorical.categorical()) {
    throw Error(fmt::format("indicator column {}: needs a categorical column",
                            categorical.key));
  }
  categorical.embedding_dim = 0;
  return categorical;
}

FeatureColumn EmbeddingColumn(FeatureColumn categorical, int64_t dimension) {
  if (!categorical.categorical() || dimension <= 0) {
    throw Error(fmt::format(
        "embedding column {}: needs a categorical column and a positive "
        "dimension",
        categorical.key));
  }
  categorical.embedding_dim = dimension;
  return categorical;
}

namespace {

int64_t BatchOf(const Tensor& t) {
  return t.shape().rank() == 0 ? 1 : t.shape()[0];
}

// Numeric or raw-bytes column as float [batch, shape...].
Var NumericInput(ModelContext& ctx, const Tensor& t, const FeatureColumn& c) {
  Var x = c.kind == FeatureColumn::Kind::kRawBytes
              ? ops::DecodeRaw(ctx.backend(), t, c.shape, c.scale)
              : ops::Constant(ctx.backend(), t, c.scale);
  const int64_t batch = BatchOf(t);
  if (x.value().num_elements() != batch * c.shape.num_elements()) {
    throw Error(fmt::format(
        "feature {}: {} values for a batch of {} of shape {} (the column's "
        "shape)",
        c.key, x.value().num_elements(), batch, c.shape.ToString()));
  }
  Shape full = c.shape.Prepend(batch);
  x = ops::Reshape(ctx.backend(), x, full);
  if (c.shift != 0.0f) {
    Tensor shift = NewFloat(ctx.backend(), full);
    ctx.backend().Fill(shift.num_elements(), -c.shift * c.scale,
                       shift.mutable_data<float>());
    x = ops::Add(ctx.backend(), x, ops::Constant(ctx.backend(), shift));
  }
  return x;
}

// Bucket ids of a categorical column, int64 [batch].
Tensor BucketIds(const Tensor& t, const FeatureColumn& c) {
  const int64_t n = t.num_elements();
  Tensor ids = Tensor::Allocate(DType::kInt64, Shape{n});
  int64_t* out = ids.mutable_data<int64_t>();
  if (c.kind == FeatureColumn::Kind::kVocabulary) {
    if (t.dtype() != DType::kBytes) {
      throw Error(
          fmt::format("feature {}: a vocabulary column needs strings, "
                      "got {}",
                      c.key, pipeline::DTypeName(t.dtype())));
    }
    std::unordered_map<std::string_view, int64_t> index;
    for (size_t i = 0; i < c.vocabulary.size(); ++i) {
      index.emplace(c.vocabulary[i], static_cast<int64_t>(i));
    }
    const auto oov = static_cast<int64_t>(c.vocabulary.size());
    for (int64_t i = 0; i < n; ++i) {
      auto it = index.find(t.bytes(i));
      out[i] = it == index.end() ? oov : it->second;
    }
    return ids;
  }
  if (t.dtype() == DType::kBytes) {
    throw Error(fmt::format(
        "feature {}: an identity column needs integer ids, got strings",
        c.key));
  }
  for (int64_t i = 0; i < n; ++i) {
    const double id = t.NumberAt(i);
    if (id < 0 || id >= static_cast<double>(c.num_buckets) ||
        id != static_cast<double>(static_cast<int64_t>(id))) {
      throw Error(fmt::format(
          "feature {}: value {} of example {} is not an id in [0, {})", c.key,
          id, i, c.num_buckets));
    }
    out[i] = static_cast<int64_t>(id);
  }
  return ids;
}

Var CategoricalInput(ModelContext& ctx, const Tensor& t,
                     const FeatureColumn& c) {
  if (t.num_elements() != BatchOf(t)) {
    throw Error(
        fmt::format("feature {}: categorical columns take one value "
                    "per example, got shape {}",
                    c.key, t.shape().ToString()));
  }
  const Tensor ids = BucketIds(t, c);
  const int64_t buckets = c.kind == FeatureColumn::Kind::kVocabulary
                              ? static_cast<int64_t>(c.vocabulary.size()) + 1
                              : c.num_buckets;
  if (c.embedding_dim > 0) {
    return layers::Embedding(ctx, ids,
                             {.input_dim = buckets,
                              .output_dim = c.embedding_dim,
                              .name = "input_layer/" + c.key + "_embedding"});
  }
  const int64_t n = ids.num_elements();
  Tensor onehot = Tensor::Allocate(DType::kFloat32, Shape{n, buckets});
  float* o = onehot.mutable_data<float>();
  std::fill_n(o, n * buckets, 0.0f);
  for (int64_t i = 0; i < n; ++i) o[i * buckets + ids.data<int64_t>()[i]] = 1;
  return ops::Constant(ctx.backend(), onehot);
}

void CheckClasses(int n_classes) {
  if (n_classes < 2) {
    throw Error(fmt::format("n_classes must be at least 2, got {}", n_classes));
  }
}

// The classification head: loss, predictions, metrics, train op.
EstimatorSpec ClassifierHead(ModelContext& ctx, const Var& logits,
                             const Tensor* labels, Mode mode, int n_classes,
                             const std::string& optimizer,
                             const LearningRate& lr) {
  Backend& be = ctx.backend();
  EstimatorSpec spec;
  spec.predictions["logits"] = logits.value();
  const int64_t batch = logits.shape()[0];
  if (n_classes == 2) {
    Var p = ops::Activate(be, logits, Activation::kSigmoid);
    Tensor classes = be.Allocate(DType::kInt64, Shape{batch});
    be.GreaterThan(batch, p.data(), 0.5f, classes.mutable_data<int64_t>());
    spec.predictions["probabilities"] = p.value().Reshape(Shape{batch});
    spec.predictions["classes"] = classes;
    if (mode == Mode::kPredict) return spec;
    // A binary head's labels are 0 and 1 (TensorFlow's BinaryClassHead
    // checks so): a 3 would go into the sigmoid's loss as a target of 3 and
    // train on nonsense without a word.  Host labels are checked here (the
    // CPU backend, and evaluation); on a GPU, as TensorFlow's GPU kernels,
    // training steps do not read their labels back to check them.
    if (labels->device() == pipeline::Device::kCpu && !labels->ragged() &&
        labels->dtype() != DType::kBytes) {
      for (int64_t k = 0; k < labels->num_elements(); ++k) {
        const double v = labels->NumberAt(k);
        if (!(v >= 0 && v <= 1)) {
          throw Error(fmt::format(
              "label {} of row {} is outside [0, 1] (the classifier has 2 "
              "classes)",
              v, k));
        }
      }
    }
    spec.loss = ops::SigmoidCrossEntropy(be, logits, *labels);
    if (mode == Mode::kEval) {
      // Metrics are host values (an evaluation step reads them anyway).
      const Tensor y = be.ToHost(ops::Constant(be, *labels).value());
      const Tensor p_host = be.ToHost(p.value());
      const std::span<const float> ys(y.data<float>(),
                                      static_cast<size_t>(batch));
      const std::span<const float> ps(p_host.data<float>(),
                                      static_cast<size_t>(batch));
      std::vector<int64_t> label_ids(ys.begin(), ys.end());
      ctx.metrics()
          .Get<Accuracy>("accuracy")
          .Update(label_ids, be.ToHost(classes).values<int64_t>());
      ctx.metrics().Get<Precision>("precision").Update(ys, ps);
      ctx.metrics().Get<Recall>("recall").Update(ys, ps);
      ctx.metrics().Get<AUC>("auc").Update(ys, ps);
    }
  } else {
    // In training, only what a hook fetches (a session runs only the
    // fetched ops): two kernels a step, on a GPU two launches.
    const bool all = mode != Mode::kTrain;
    if (all || ctx.Fetched("probabilities")) {
      spec.predictions["probabilities"] = ops::Softmax(be, logits).value();
    }
    if (all || ctx.Fetched("classes")) {
      spec.predictions["classes"] = ArgMax(be, logits.value());
    }
    if (mode == Mode::kPredict) return spec;
    spec.loss = ops::SparseSoftmaxCrossEntropy(be, logits, *labels);
    if (mode == Mode::kEval) {
      const Tensor y = be.ToHost(ops::Constant(be, *labels).value());
      std::vector<int64_t> label_ids(y.data<float>(), y.data<float>() + batch);
      ctx.metrics()
          .Get<Accuracy>("accuracy")
          .Update(label_ids,
                  be.ToHost(spec.predictions["classes"]).values<int64_t>());
    }
  }
  if (mode == Mode::kTrain) {
    spec.train_op = MakeOptimizer(optimizer, lr)->Minimize(ctx, spec.loss);
  }
  return spec;
}

EstimatorSpec RegressionHead(ModelContext& ctx, const Var& out,
                             const Tensor* labels, Mode mode,
                             const std::string& optimizer,
                             const LearningRate& lr) {
  EstimatorSpec spec;
  spec.predictions["predictions"] = out.value().Reshape(Shape{out.shape()[0]});
  if (mode == Mode::kPredict) return spec;
  spec.loss = ops::MeanSquaredError(ctx.backend(), out, *labels);
  if (mode == Mode::kTrain) {
    spec.train_op = MakeOptimizer(optimizer, lr)->Minimize(ctx, spec.loss);
  }
  return spec;
}

Var DNNLogits(ModelContext& ctx, const Features& f, const DNNOptions& o,
              int64_t outputs) {
  Var h = InputLayer(ctx, f, o.columns);
  for (size_t i = 0; i < o.hidden_units.size(); ++i) {
    const std::string name = fmt::format("dnn/hiddenlayer_{}", i);
    h = layers::Dense(
        ctx, h,
        {.units = o.hidden_units[i],
         .activation = o.batch_norm ? Activation::kLinear : o.activation,
         .name = name});
    if (o.batch_norm) {
      h = ops::Activate(
          ctx.backend(),
          layers::BatchNorm(ctx, h, {.name = name + "/batchnorm"}),
          o.activation);
    }
    if (o.dropout > 0) h = layers::Dropout(ctx, h, o.dropout);
  }
  return layers::Dense(ctx, h, {.units = outputs, .name = "dnn/logits"});
}

}  // namespace

Var InputLayer(ModelContext& ctx, const Features& features,
               std::span<const FeatureColumn> columns) {
  if (columns.empty()) throw Error("input_layer: no feature columns");
  std::vector<Var> parts;
  for (const FeatureColumn& c : columns) {
    const Tensor& t = features[c.key];
    Var part =
        c.categorical() ? CategoricalInput(ctx, t, c) : NumericInput(ctx, t, c);
    parts.push_back(ops::Flatten(ctx.backend(), part));
  }
  return parts.size() == 1 ? parts[0] : ops::Concat(ctx.backend(), parts);
}

ModelFn LinearClassifierFn(LinearOptions o) {
  CheckClasses(o.n_classes);
  return [o](const Features& f, const Tensor* labels, Mode mode,
             ModelContext& ctx) {
    Var x = InputLayer(ctx, f, o.columns);
    Var logits = layers::Dense(ctx, x,
                               {.units = o.n_classes == 2 ? 1 : o.n_classes,
                                .kernel_initializer = Initializer::Zeros(),
                                .name = "linear/linear_model"});
    return ClassifierHead(ctx, logits, labels, mode, o.n_classes, o.optimizer,
                          o.learning_rate);
  };
}

ModelFn LinearRegressorFn(LinearOptions o) {
  return [o](const Features& f, const Tensor* labels, Mode mode,
             ModelContext& ctx) {
    Var x = InputLayer(ctx, f, o.columns);
    Var out = layers::Dense(ctx, x,
                            {.units = 1,
                             .kernel_initializer = Initializer::Zeros(),
                             .name = "linear/linear_model"});
    return RegressionHead(ctx, out, labels, mode, o.optimizer, o.learning_rate);
  };
}

ModelFn DNNClassifierFn(DNNOptions o) {
  CheckClasses(o.n_classes);
  if (o.hidden_units.empty()) throw Error("DNN: hidden_units is empty");
  return [o](const Features& f, const Tensor* labels, Mode mode,
             ModelContext& ctx) {
    Var logits = DNNLogits(ctx, f, o, o.n_classes == 2 ? 1 : o.n_classes);
    return ClassifierHead(ctx, logits, labels, mode, o.n_classes, o.optimizer,
                          o.learning_rate);
  };
}

ModelFn DNNRegressorFn(DNNOptions o) {
  if (o.hidden_units.empty()) throw Error("DNN: hidden_units is empty");
  return [o](const Features& f, const Tensor* labels, Mode mode,
             ModelContext& ctx) {
    Var out = DNNLogits(ctx, f, o, 1);
    return RegressionHead(ctx, out, labels, mode, o.optimizer, o.learning_rate);
  };
}

ModelFn CNNClassifierFn(CNNOptions o) {
  CheckClasses(o.n_classes);
  if (o.image.shape.rank() != 3) {
    throw Error(fmt::format(
        "CNN: the image column {} needs a [height, width, channels] shape, "
        "got {}",
        o.image.key, o.image.shape.ToString()));
  }
  return [o](const Features& f, const Tensor* labels, Mode mode,
             ModelContext& ctx) {
    Var x = NumericInput(ctx, f[o.image.key], o.image);
    // Each block is max_pool(relu(conv(x) + b)), computed as
    // relu(max_pool(conv(x) + b)): ReLU is monotonic, so the two are equal
    // value for value, and so are their gradients (the window's maximum is
    // the same element either way, and ReLU passes its gradient exactly
    // when that maximum is positive).  The second order runs the ReLU and
    // its gradient on a quarter of the values, and the convolution's
    // backward pass reads no activation mask.
    for (size_t i = 0; i < o.filters.size(); ++i) {
      x = layers::Conv2D(ctx, x,
                         {.filters = o.filters[i],
                          .kernel_h = o.kernel,
                          .kernel_w = o.kernel,
                          .padding = Padding::kSame,
                          .activation = Activation::kLinear,
                          .name = fmt::format("cnn/conv{}", i)});
      x = ops::Activate(ctx.backend(), layers::MaxPool2D(ctx, x),
                        Activation::kRelu);
    }
    x = layers::Flatten(ctx, x);
    for (size_t i = 0; i < o.dense_units.size(); ++i) {
      x = layers::Dense(ctx, x,
                        {.units = o.dense_units[i],
                         .activation = Activation::kRelu,
                         .name = fmt::format("cnn/dense{}", i)});
      if (o.dropout > 0) x = layers::Dropout(ctx, x, o.dropout);
    }
    Var logits = layers::Dense(
        ctx, x,
        {.units = o.n_classes == 2 ? 1 : o.n_classes, .name = "cnn/logits"});
    return ClassifierHead(ctx, logits, labels, mode, o.n_classes, o.optimizer,
                          o.learning_rate);
  };
}

}  // namespace recflow::train
