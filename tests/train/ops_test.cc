// Every differentiable op's backward pass against central finite
// differences, and forward values against plain reference loops.
#include "train/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "train/variables.h"
#include "train_test_util.h"

namespace recflow::train {
namespace {

using testing::HostBackend;
using testing::HostFloat;

std::unique_ptr<Backend> TestBackend() { return MakeCpuBackend(2); }

Tensor RandomTensor(const Shape& s, uint64_t seed, float lo = -1,
                    float hi = 1) {
  Tensor t = HostFloat(s);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.num_elements(); ++i)
    t.mutable_data<float>()[i] = u(rng);
  return t;
}

// A Var that wants its gradient.
Var Param(const Tensor& t) {
  auto n = std::make_shared<Node>();
  n->value = t;
  n->requires_grad = true;
  return Var(std::move(n));
}

Tensor Copy(const Tensor& t) {
  Tensor c = HostFloat(t.shape());
  std::copy_n(t.data<float>(), t.num_elements(), c.mutable_data<float>());
  return c;
}

Var Constant(const Tensor& t) { return ops::Constant(HostBackend(), t); }

// Checks d(sum(f(inputs) * w))/d(inputs) for a fixed random w against
// central differences on float64 sums.
void CheckGradients(
    const std::function<Var(Backend&, const std::vector<Var>&)>& f,
    const std::vector<Tensor>& inputs, double tolerance = 2e-2,
    float eps = 1e-2f) {
  auto be = TestBackend();
  std::vector<Var> params;
  for (const Tensor& t : inputs) params.push_back(Param(Copy(t)));
  Var out = f(*be, params);
  const Tensor weights = RandomTensor(out.shape(), 99);
  Var loss = ops::ReduceSum(*be, ops::Multiply(*be, out, Constant(weights)));
  ops::Backward(*be, loss);

  auto eval = [&](const std::vector<Tensor>& values) {
    std::vector<Var> ps;
    for (const Tensor& t : values)
      ps.push_back(ops::Constant(HostBackend(), t));
    Var o = f(*be, ps);
    double s = 0;
    for (int64_t i = 0; i < o.value().num_elements(); ++i) {
      s += double(o.data()[i]) * weights.data<float>()[i];
    }
    return s;
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& grad = params[k].grad();
    ASSERT_TRUE(grad.valid()) << "no gradient reached input " << k;
    for (int64_t i = 0; i < inputs[k].num_elements(); ++i) {
      std::vector<Tensor> plus, minus;
      for (const Tensor& t : inputs) {
        plus.push_back(Copy(t));
        minus.push_back(Copy(t));
      }
      plus[k].mutable_data<float>()[i] += eps;
      minus[k].mutable_data<float>()[i] -= eps;
      const double numeric = (eval(plus) - eval(minus)) / (2 * eps);
      const double analytic = grad.data<float>()[i];
      EXPECT_NEAR(analytic, numeric,
                  tolerance * std::max(1.0, std::abs(numeric)))
          << "input " << k << " value " << i;
    }
  }
}

TEST(OpsGradientTest, MatMulInEveryTransposition) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      const Shape a = ta ? Shape{4, 3} : Shape{3, 4};
      const Shape b = tb ? Shape{5, 4} : Shape{4, 5};
      CheckGradients(
          [&](Backend& be, const std::vector<Var>& v) {
            return ops::MatMul(be, v[0], v[1], ta, tb);
          },
          {RandomTensor(a, 1), RandomTensor(b, 2)});
    }
  }
}

TEST(OpsGradientTest, ElementwiseAndBias) {
  CheckGradients(
      [](Backend& be, const std::vector<Var>& v) {
        return ops::Multiply(be, ops::BiasAdd(be, v[0], v[1]),
                             ops::Scale(be, ops::Add(be, v[0], v[2]), 0.5f));
      },
      {RandomTensor({3, 4}, 3), RandomTensor({4}, 4), RandomTensor({3, 4}, 5)});
}

// A value several ops use gets the sum of their gradients, whichever
// comes first: the first contribution writes its fresh gradient (no
// zeroing pass), the others add to it; one op may use it twice.
TEST(OpsGradientTest, GradientsOfAValueUsedManyTimesAddUp) {
  CheckGradients(
      [](Backend& be, const std::vector<Var>& v) {
        const Var twice = ops::MatMul(be, v[0], v[0], false, true);
        const Var product = ops::Multiply(be, v[0], v[1]);
        const Var dense =
            ops::FusedMatMul(be, v[0], v[2], v[3], Activation::kTanh);
        const Var linear =
            ops::FusedMatMul(be, v[0], v[2], v[3], Activation::kLinear);
        return ops::Add(
            be, ops::Add(be, twice, product),
            ops::Scale(be,
                       ops::Add(be, dense, ops::Dropout(be, linear, 0.3f, 5)),
                       0.5f));
      },
      {RandomTensor({3, 3}, 30), RandomTensor({3, 3}, 31),
       RandomTensor({3, 3}, 32), RandomTensor({3}, 33)});
}

TEST(OpsGradientTest, Activations) {
  for (Activation f : {Activation::kRelu, Activation::kSigmoid,
                       Activation::kTanh, Activation::kLinear}) {
    SCOPED_TRACE(std::string(ActivationName(f)));
    // Values away from relu's kink at 0.
    Tensor x = RandomTensor({2, 6}, 6, 0.1f, 2.0f);
    for (int i = 0; i < 12; i += 2) x.mutable_data<float>()[i] *= -1;
    CheckGradients(
        [f](Backend& be, const std::vector<Var>& v) {
          return ops::Activate(be, v[0], f);
        },
        {x});
  }
}

TEST(OpsGradientTest, SoftmaxReshapeConcatMean) {
  CheckGradients(
      [](Backend& be, const std::vector<Var>& v) {
        Var s = ops::Softmax(be, v[0]);
        Var parts[] = {ops::Reshape(be, s, Shape{3, 4}), v[1]};
        return ops::Concat(be, parts);
      },
      {RandomTensor({2, 6}, 7), RandomTensor({3, 2}, 8)});
  CheckGradients(
      [](Backend& be, const std::vector<Var>& v) {
        return ops::ReduceMean(be, v[0]);
      },
      {RandomTensor({5, 3}, 9)});
}

TEST(OpsGradientTest, Conv2DSameAndValidWithStrides) {
  for (Padding p : {Padding::kSame, Padding::kValid}) {
    for (int stride : {1, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << "same=" << (p == Padding::kSame) << " stride=" << stride);
      CheckGradients(
          [&](Backend& be, const std::vector<Var>& v) {
            return ops::Conv2D(be, v[0], v[1], stride, stride, p);
          },
          {RandomTensor({2, 5, 6, 2}, 10), RandomTensor({3, 2, 2, 3}, 11)});
    }
  }
}

TEST(OpsGradientTest, FusedMatMulAndConv2DWithEveryActivation) {
  for (Activation f : {Activation::kLinear, Activation::kRelu,
                       Activation::kSigmoid, Activation::kTanh}) {
    SCOPED_TRACE(std::string(ActivationName(f)));
    CheckGradients(
        [f](Backend& be, const std::vector<Var>& v) {
          return ops::FusedMatMul(be, v[0], v[1], v[2], f);
        },
        {RandomTensor(Shape{3, 4}, 1), RandomTensor(Shape{4, 5}, 2),
         RandomTensor(Shape{5}, 3)});
    CheckGradients(
        [f](Backend& be, const std::vector<Var>& v) {
          return ops::FusedConv2D(be, v[0], v[1], v[2], f, 1, 1,
                                  Padding::kSame);
        },
        {RandomTensor(Shape{2, 4, 4, 2}, 4), RandomTensor(Shape{3, 3, 2, 3}, 5),
         RandomTensor(Shape{3}, 6)});
  }
  // Without a bias.
  CheckGradients(
      [](Backend& be, const std::vector<Var>& v) {
        return ops::FusedMatMul(be, v[0], v[1], Var(), Activation::kRelu);
      },
      {RandomTensor(Shape{3, 4}, 7), RandomTensor(Shape{4, 2}, 8)});
}

// The fused ops give exactly what their parts give in turn.
TEST(OpsTest, FusedOpsEqualMatMulOrConvThenBiasAddThenActivate) {
  auto be = TestBackend();
  const Tensor x = RandomTensor(Shape{4, 6, 6, 3}, 11);
  const Tensor w = RandomTensor(Shape{3, 3, 3, 5}, 12);
  const Tensor b = RandomTensor(Shape{5}, 13);
  for (Activation f : {Activation::kRelu, Activation::kTanh}) {
    Var px = Param(Copy(x)), pw = Param(Copy(w)), pb = Param(Copy(b));
    Var fused = ops::FusedConv2D(*be, px, pw, pb, f, 2, 2, Padding::kSame);
    Var qx = Param(Copy(x)), qw = Param(Copy(w)), qb = Param(Copy(b));
    Var parts = ops::Activate(
        *be,
        ops::BiasAdd(*be, ops::Conv2D(*be, qx, qw, 2, 2, Padding::kSame), qb),
        f);
    ASSERT_EQ(fused.shape(), parts.shape());
    for (int64_t i = 0; i < fused.value().num_elements(); ++i) {
      ASSERT_FLOAT_EQ(fused.data()[i], parts.data()[i]) << i;
    }
    ops::Backward(*be, ops::ReduceSum(*be, fused));
    ops::Backward(*be, ops::ReduceSum(*be, parts));
    for (auto [a, c] : {std::pair{px, qx}, {pw, qw}, {pb, qb}}) {
      for (int64_t i = 0; i < a.value().num_elements(); ++i) {
        ASSERT_NEAR(a.grad().data<float>()[i], c.grad().data<float>()[i], 1e-5f)
            << i;
      }
    }
  }
}

TEST(OpsGradientTest, MaxAndAveragePooling) {
  for (Pooling kind : {Pooling::kMax, Pooling::kAverage}) {
    for (Padding p : {Padding::kSame, Padding::kValid}) {
      CheckGradients(
          [&](Backend& be, const std::vector<Var>& v) {
            return ops::Pool2D(be, kind, v[0], 2, 2, 2, 2, p);
          },
          {RandomTensor({2, 5, 5, 3}, 12)});
    }
  }
}

// The canned CNN computes max_pool(relu(z)) as relu(max_pool(z)); both
// orders must agree exactly, values and gradients, including windows that
// are all negative, hold zeros or tie.
TEST(OpsTest, ReluThenMaxPoolEqualsMaxPoolThenRelu) {
  auto be = TestBackend();
  Tensor z = RandomTensor(Shape{3, 7, 7, 4}, 21);
  float* v = z.mutable_data<float>();
  for (int64_t i = 0; i < z.num_elements(); i += 5) v[i] = 0.0f;
  for (int64_t i = 1; i < z.num_elements(); i += 11) v[i] = v[i - 1];
  for (int64_t i = 0; i < 16; ++i) v[i] = -std::abs(v[i]) - 0.1f;
  for (Padding p : {Padding::kSame, Padding::kValid}) {
    Var a = Param(Copy(z)), b = Param(Copy(z));
    Var relu_pool =
        ops::Pool2D(*be, Pooling::kMax,
                    ops::Activate(*be, a, Activation::kRelu), 2, 2, 2, 2, p);
    Var pool_relu =
        ops::Activate(*be, ops::Pool2D(*be, Pooling::kMax, b, 2, 2, 2, 2, p),
                      Activation::kRelu);
    ASSERT_EQ(relu_pool.shape(), pool_relu.shape());
    for (int64_t i = 0; i < relu_pool.value().num_elements(); ++i) {
      ASSERT_EQ(relu_pool.data()[i], pool_relu.data()[i]) << i;
    }
    const Tensor w = RandomTensor(relu_pool.shape(), 22);
    ops::Backward(
        *be, ops::ReduceSum(*be, ops::Multiply(*be, relu_pool, Constant(w))));
    ops::Backward(
        *be, ops::ReduceSum(*be, ops::Multiply(*be, pool_relu, Constant(w))));
    int64_t passed = 0;
    for (int64_t i = 0; i < z.num_elements(); ++i) {
      ASSERT_EQ(a.grad().data<float>()[i], b.grad().data<float>()[i]) << i;
      passed += a.grad().data<float>()[i] != 0.0f;
    }
    EXPECT_GT(passed, 0);  // the gradients compared are not all zero
  }
}

TEST(OpsGradientTest, DropoutBatchNormGather) {
  CheckGradients(
      [](Backend& be, const std::vector<Var>& v) {
        return ops::Dropout(be, v[0], 0.5f, /*seed=*/42);
      },
      {RandomTensor({4, 8}, 13)});
  CheckGradients(
      [](Backend& be, const std::vector<Var>& v) {
        std::vector<float> mean(3, 0.0f), var(3, 1.0f);
        return ops::BatchNorm(be, v[0], v[1], v[2], mean.data(), var.data(),
                              /*training=*/true, 0.99f, 1e-3f);
      },
      {RandomTensor({6, 3}, 14), RandomTensor({3}, 15, 0.5f, 1.5f),
       RandomTensor({3}, 16)},
      5e-2);
  const int64_t ids[] = {2, 0, 2, 1};
  const Tensor id_tensor = Tensor::FromValues<int64_t>(ids, Shape{4});
  CheckGradients(
      [&](Backend& be, const std::vector<Var>& v) {
        return ops::Gather(be, v[0], id_tensor);
      },
      {RandomTensor({3, 5}, 17)});
}

TEST(OpsGradientTest, Losses) {
  const int64_t labels[] = {0, 3, 2};
  const Tensor l = Tensor::FromValues<int64_t>(labels, Shape{3});
  CheckGradients(
      [&](Backend& be, const std::vector<Var>& v) {
        return ops::SparseSoftmaxCrossEntropy(be, v[0], l);
      },
      {RandomTensor({3, 4}, 18, -3, 3)});
  const float targets[] = {0, 1, 1, 0, 0.5f, 1};
  const Tensor t = Tensor::FromValues<float>(targets, Shape{6});
  CheckGradients(
      [&](Backend& be, const std::vector<Var>& v) {
        return ops::SigmoidCrossEntropy(be, v[0], t);
      },
      {RandomTensor({6}, 19, -3, 3)});
  CheckGradients(
      [&](Backend& be, const std::vector<Var>& v) {
        return ops::MeanSquaredError(be, v[0], t);
      },
      {RandomTensor({6}, 20)});
}

TEST(OpsTest, Conv2DMatchesAPlainLoopAndTensorFlowsSameShape) {
  auto be = TestBackend();
  const Tensor x = RandomTensor({1, 7, 7, 2}, 21);
  const Tensor w = RandomTensor({3, 3, 2, 4}, 22);
  Var y = ops::Conv2D(*be, Constant(x), Constant(w), 2, 2, Padding::kSame);
  // TF: SAME with stride 2 on 7 -> 4; pad total 2, top/left 1.
  ASSERT_EQ(y.shape(), (Shape{1, 4, 4, 4}));
  for (int oh = 0; oh < 4; ++oh) {
    for (int ow = 0; ow < 4; ++ow) {
      for (int o = 0; o < 4; ++o) {
        double want = 0;
        for (int ky = 0; ky < 3; ++ky) {
          for (int kx = 0; kx < 3; ++kx) {
            const int iy = oh * 2 - 1 + ky, ix = ow * 2 - 1 + kx;
            if (iy < 0 || iy >= 7 || ix < 0 || ix >= 7) continue;
            for (int c = 0; c < 2; ++c) {
              want += x.data<float>()[(iy * 7 + ix) * 2 + c] *
                      w.data<float>()[((ky * 3 + kx) * 2 + c) * 4 + o];
            }
          }
        }
        EXPECT_NEAR(y.data()[(oh * 4 + ow) * 4 + o], want, 1e-4);
      }
    }
  }
}

TEST(OpsTest, ErrorsSayWhatDoesNotFit) {
  auto be = TestBackend();
  try {
    ops::MatMul(*be, Constant(RandomTensor({2, 3}, 1)),
                Constant(RandomTensor({4, 2}, 2)));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] and [4, 2]"),
              std::string::npos)
        << e.what();
  }
  const int64_t bad[] = {0, 7};
  try {
    ops::SparseSoftmaxCrossEntropy(*be, Constant(RandomTensor({2, 3}, 1)),
                                   Tensor::FromValues<int64_t>(bad, Shape{2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 7 of row 1"), std::string::npos)
        << e.what();
  }
}

TEST(OpsTest, DecodeRawTurnsBytesIntoScaledFloats) {
  const std::string values[] = {std::string("\x00\x80\xff\x01", 4),
                                std::string("\x02\x03\x04\x05", 4)};
  const Tensor bytes = Tensor::FromStrings(values, Shape{2});
  Var v = ops::DecodeRaw(HostBackend(), bytes, Shape{2, 2, 1}, 1.0f / 255);
  ASSERT_EQ(v.shape(), (Shape{2, 2, 2, 1}));
  EXPECT_FLOAT_EQ(v.data()[1], 128.0f / 255);
  EXPECT_FLOAT_EQ(v.data()[2], 1.0f);
  EXPECT_THROW(ops::DecodeRaw(HostBackend(), bytes, Shape{3}, 1.0f), Error);
  // A value past the first of another length is named by its index.
  const std::string uneven[] = {values[0], std::string("\x02\x03\x04", 3)};
  try {
    ops::DecodeRaw(HostBackend(), Tensor::FromStrings(uneven, Shape{2}),
                   Shape{2, 2, 1}, 1.0f);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "decode_raw: value 1 holds 3 bytes, expected 4 for shape [2, 2, "
              "1]");
  }
  // A row of a batch views the batch's buffer past its first value.
  Var row = ops::DecodeRaw(HostBackend(), bytes.Slice(1), Shape{4}, 1.0f);
  ASSERT_EQ(row.shape(), (Shape{4}));
  EXPECT_FLOAT_EQ(row.data()[0], 2.0f);
  EXPECT_FLOAT_EQ(row.data()[3], 5.0f);
}

}  // namespace
}  // namespace recflow::train
