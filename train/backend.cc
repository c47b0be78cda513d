// What every backend shares: names and shapes of the kernels' arguments,
// device selection, and the default forms of the composite calls.
#include "train/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "train/collective.h"

namespace recflow::train {

Activation ActivationFromName(std::string_view name) {
  if (name == "linear" || name.empty()) return Activation::kLinear;
  if (name == "relu") return Activation::kRelu;
  if (name == "sigmoid") return Activation::kSigmoid;
  if (name == "tanh") return Activation::kTanh;
  throw Error(fmt::format(
      "unknown activation \"{}\" (expected linear, relu, sigmoid or tanh)",
      name));
}

std::string_view ActivationName(Activation a) {
  switch (a) {
    case Activation::kLinear:
      return "linear";
    case Activation::kRelu:
      return "relu";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kTanh:
      return "tanh";
  }
  return "?";
}

void Window2D::Resolve() {
  if (window_h <= 0 || window_w <= 0 || stride_h <= 0 || stride_w <= 0) {
    throw Error(fmt::format("window {}x{} with strides {}x{}: must be positive",
                            window_h, window_w, stride_h, stride_w));
  }
  if (padding == Padding::kSame) {
    out_h = (in_h + stride_h - 1) / stride_h;
    out_w = (in_w + stride_w - 1) / stride_w;
    const int64_t pad_h =
        std::max<int64_t>((out_h - 1) * stride_h + window_h - in_h, 0);
    const int64_t pad_w =
        std::max<int64_t>((out_w - 1) * stride_w + window_w - in_w, 0);
    pad_top = pad_h / 2;
    pad_left = pad_w / 2;
  } else {
    if (window_h > in_h || window_w > in_w) {
      throw Error(fmt::format(
          "a {}x{} window does not fit a {}x{} input with VALID padding",
          window_h, window_w, in_h, in_w));
    }
    out_h = (in_h - window_h) / stride_h + 1;
    out_w = (in_w - window_w) / stride_w + 1;
    pad_top = pad_left = 0;
  }
}

void Backend::Pool2DBackwardWrite(Pooling kind, const Window2D& g,
                                  const float* x, const float* y,
                                  const float* dy, float* dx) {
  Fill(g.batch * g.in_h * g.in_w * g.in_c, 0.0f, dx);
  Pool2DBackward(kind, g, x, y, dy, dx);
}

void Backend::BiasActivation(int64_t rows, int64_t cols, const float* b,
                             Activation f, float* y) {
  if (b != nullptr) BiasAdd(rows, cols, y, b, y);
  if (f != Activation::kLinear) ActivationForward(f, rows * cols, y, y);
}

void Backend::GemmBiasActivation(int64_t m, int64_t n, int64_t k,
                                 const float* a, const float* b,
                                 const float* bias, Activation f, float* c) {
  Gemm(false, false, m, n, k, 1.0f, a, b, 0.0f, c);
  BiasActivation(m, n, bias, f, c);
}

void Backend::CheckEpilogueAliasing(Activation f, const float* dy,
                                    const float* dz) {
  if (dz == dy && f != Activation::kLinear) {
    throw Error("BiasActivationBackward: dz may alias dy only when linear");
  }
}

void Backend::BiasActivationBackward(int64_t rows, int64_t cols, Activation f,
                                     const float* y, const float* dy, float* dz,
                                     float* db) {
  const int64_t n = rows * cols;
  if (f == Activation::kLinear) {
    if (dz != dy) Copy(n, dy, dz);
  } else {
    CheckEpilogueAliasing(f, dy, dz);
    ActivationBackward(f, n, y, dy, 0.0f, dz);
  }
  if (db != nullptr) ColumnSum(rows, cols, dz, 1.0f, db);
}

void Backend::AdamUpdateAll(std::span<const AdamVariable> vars, float lr_t,
                            float beta1, float beta2, float epsilon) {
  for (const AdamVariable& a : vars) {
    AdamUpdate(a.n, lr_t, beta1, beta2, epsilon, a.g, a.m, a.v, a.w);
    Fill(a.n, 0.0f, a.g);
  }
}

// Packing a large gradient into a buffer and back costs more than a
// collective's latency (the DNN's 0.94 MB of gradients took ~0.3 ms to
// pack and unpack, against ~3.5 us a collective and ~0.16 ms for the
// all-reduce itself; docs/PERFORMANCE.md), so those are reduced where they
// are.
void Backend::AllReduceSum(Collective& world,
                           std::span<const std::span<float>> buffers) {
  if (device() != Device::kCpu) {
    throw Error(fmt::format(
        "data-parallel training over {} needs the gradients' all-reduce on "
        "{}, whose memory is not the host's: this build has no device "
        "all-reduce for it (the CUDA backend's needs NCCL; "
        "docs/DISTRIBUTED.md)",
        world.name(), device_name()));
  }
  thread_local std::vector<float> packed;
  packed.clear();
  for (const std::span<float> b : buffers) {
    if (static_cast<int64_t>(b.size()) >= kInPlaceAllReduceValues) {
      world.AllReduce(b, ReduceOp::kSum);
    } else {
      packed.insert(packed.end(), b.begin(), b.end());
    }
  }
  if (packed.empty()) return;
  world.AllReduce(std::span(packed), ReduceOp::kSum);
  const float* at = packed.data();
  for (const std::span<float> b : buffers) {
    if (static_cast<int64_t>(b.size()) >= kInPlaceAllReduceValues) continue;
    std::copy_n(at, b.size(), b.data());
    at += b.size();
  }
}

std::string DeviceSpec::ToString() const {
  return device == Device::kCpu ? "cpu" : fmt::format("cuda:{}", index);
}

DeviceSpec ParseDevice(std::string_view text) {
  DeviceSpec spec;
  if (text == "cpu") return spec;
  if (text == "cuda" || text == "gpu") {
    spec.device = Device::kCuda;
    return spec;
  }
  if (text.starts_with("cuda:")) {
    const std::string_view n = text.substr(5);
    int index = 0;
    bool ok = !n.empty() && n.size() <= 4;
    for (char c : n) {
      if (c < '0' || c > '9') ok = false;
      index = index * 10 + (c - '0');
    }
    if (ok) {
      spec.device = Device::kCuda;
      spec.index = index;
      spec.index_given = true;
      return spec;
    }
  }
  throw Error(fmt::format(
      "unknown device \"{}\" (expected cpu, cuda or cuda:N)", text));
}

std::unique_ptr<Backend> MakeBackend(const DeviceSpec& spec, int threads) {
  if (spec.device == Device::kCpu) return MakeCpuBackend(threads);
  // RECFLOW_CUDA_TF32=0 keeps matrix products and convolutions in full
  // float32 (as NVIDIA_TF32_OVERRIDE=0 does for TensorFlow);
  // RECFLOW_CUDNN_AUTOTUNE=0 takes cuDNN's heuristics' convolution
  // algorithms instead of measuring them (as TF_CUDNN_USE_AUTOTUNE=0).
  auto on = [](const char* name) {
    const char* v = std::getenv(name);
    return v == nullptr || std::string_view(v) != "0";
  };
  return MakeCudaBackend(spec.index, on("RECFLOW_CUDA_TF32"),
                         on("RECFLOW_CUDNN_AUTOTUNE"));
}

}  // namespace recflow::train
