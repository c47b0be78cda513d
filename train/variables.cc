#include "train/variables.h"

#include <fmt/format.h>

#include <cmath>

namespace recflow::train {
namespace {

// Keras' fan computation.
void Fans(const Shape& s, double* fan_in, double* fan_out) {
  if (s.rank() < 1) {
    *fan_in = *fan_out = 1;
  } else if (s.rank() == 1) {
    *fan_in = *fan_out = static_cast<double>(s[0]);
  } else {
    double receptive = 1;
    for (int i = 0; i < s.rank() - 2; ++i)
      receptive *= static_cast<double>(s[i]);
    *fan_in = receptive * static_cast<double>(s[s.rank() - 2]);
    *fan_out = receptive * static_cast<double>(s[s.rank() - 1]);
  }
}

double Uniform01(pipeline::Rng& rng) {
  return static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;
}

double Normal(pipeline::Rng& rng) {
  // Box-Muller; u1 in (0, 1].
  const double u1 = 1.0 - Uniform01(rng);
  const double u2 = Uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

void Initializer::Fill(const Shape& shape, uint64_t seed,
                       std::span<float> out) const {
  pipeline::Rng rng(seed);
  double fan_in, fan_out;
  Fans(shape, &fan_in, &fan_out);
  switch (kind) {
    case Kind::kZeros:
      std::fill(out.begin(), out.end(), 0.0f);
      break;
    case Kind::kOnes:
      std::fill(out.begin(), out.end(), 1.0f);
      break;
    case Kind::kConstant:
      std::fill(out.begin(), out.end(), value);
      break;
    case Kind::kGlorotUniform: {
      const double limit = std::sqrt(6.0 / (fan_in + fan_out));
      for (float& v : out)
        v = static_cast<float>((2 * Uniform01(rng) - 1) * limit);
      break;
    }
    case Kind::kHeNormal: {
      // Truncated at two standard deviations, as Keras (whose stddev is
      // corrected by 0.8796 for the truncation).
      const double stddev = std::sqrt(2.0 / fan_in) / 0.87962566103423978;
      for (float& v : out) {
        double z;
        do z = Normal(rng);
        while (std::abs(z) > 2.0);
        v = static_cast<float>(z * stddev);
      }
      break;
    }
    case Kind::kRandomNormal:
      for (float& v : out) v = static_cast<float>(Normal(rng) * value);
      break;
    case Kind::kRandomUniform:
      for (float& v : out)
        v = static_cast<float>((2 * Uniform01(rng) - 1) * value);
      break;
  }
}

Variable& VariableStore::GetOrCreate(const std::string& name,
                                     const Shape& shape,
                                     const Initializer& init, bool trainable) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    if (!(it->second->value.shape() == shape)) {
      throw Error(fmt::format(
          "variable {} exists with shape {}; asked for shape {} (two layers "
          "with one name?)",
          name, it->second->value.shape().ToString(), shape.ToString()));
    }
    return *it->second;
  }
  auto v = std::make_unique<Variable>();
  v->name = name;
  v->trainable = trainable;
  auto restored = restored_.find(name);
  if (!restored_from_.empty() && restored == restored_.end()) {
    throw Error(fmt::format(
        "checkpoint {} holds no variable {} (shape {}); it was written by "
        "another model",
        restored_from_, name, shape.ToString()));
  }
  if (restored != restored_.end()) {
    const Tensor& t = restored->second;
    if (t.dtype() != DType::kFloat32 || !(t.shape() == shape)) {
      throw Error(fmt::format(
          "checkpoint {} holds variable {} as {} {}; the model wants float32 "
          "{}",
          restored_from_, name, pipeline::DTypeName(t.dtype()),
          t.shape().ToString(), shape.ToString()));
    }
    v->value = Place(t);
    restored_.erase(restored);
  } else {
    Tensor host = Tensor::Allocate(DType::kFloat32, shape);
    init.Fill(
        shape, pipeline::MixSeed(seed_, pipeline::Fingerprint(name)),
        {host.mutable_data<float>(), static_cast<size_t>(host.num_elements())});
    v->value = Place(std::move(host));
  }
  if (trainable) {
    Tensor zeros = Tensor::Allocate(DType::kFloat32, shape);
    std::fill_n(zeros.mutable_data<float>(), zeros.num_elements(), 0.0f);
    v->grad = Place(std::move(zeros));
  }
  Variable& ref = *v;
  order_.push_back(v.get());
  by_name_.emplace(name, std::move(v));
  return ref;
}

Tensor VariableStore::Place(Tensor host) {
  if (backend_ == nullptr) {
    host.CheckHost("a variable without a backend");
    // Own storage: the optimizers update it in place.
    Tensor t = Tensor::Allocate(DType::kFloat32, host.shape());
    std::copy_n(host.data<float>(), host.num_elements(),
                t.mutable_data<float>());
    return t;
  }
  Tensor t = backend_->Allocate(DType::kFloat32, host.shape());
  const Tensor on_device = backend_->ToDevice(host);
  backend_->Copy(host.num_elements(), on_device.data<float>(),
                 t.mutable_data<float>());
  return t;
}

Variable* VariableStore::Find(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.get();
}

Var VariableStore::Read(Variable& v) {
  auto n = std::make_shared<Node>();
  n->value = v.value;
  n->variable = &v;
  if (v.trainable) {
    n->requires_grad = true;
    n->grad = v.grad;
  }
  return Var(std::move(n));
}

std::vector<Variable*> VariableStore::all() { return order_; }

std::vector<Variable*> VariableStore::trainable() {
  std::vector<Variable*> out;
  for (Variable* v : order_) {
    if (v->trainable) out.push_back(v);
  }
  return out;
}

void VariableStore::Restore(std::map<std::string, Tensor> values,
                            std::string source) {
  restored_ = std::move(values);
  restored_from_ = std::move(source);
  for (Variable* v : order_) {
    auto it = restored_.find(v->name);
    if (it == restored_.end()) {
      throw Error(fmt::format("checkpoint {} holds no variable {} (shape {})",
                              restored_from_, v->name,
                              v->value.shape().ToString()));
    }
    if (it->second.dtype() != DType::kFloat32 ||
        !(it->second.shape() == v->value.shape())) {
      throw Error(fmt::format(
          "checkpoint {} holds variable {} as {} {}; the model has float32 {}",
          restored_from_, v->name, pipeline::DTypeName(it->second.dtype()),
          it->second.shape().ToString(), v->value.shape().ToString()));
    }
    v->value = Place(it->second);
    restored_.erase(it);
  }
}

std::vector<std::string> VariableStore::UnusedRestoredNames() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : restored_) out.push_back(name);
  return out;
}

}  // namespace recflow::train
