#pragma once

// ResNet-50 written with torch::nn, identical to torchvision.models.resnet50()
// (v1.5: the stride sits in the 3x3 convolution of each bottleneck; 25,557,032
// parameters). Parameters and buffers have torchvision's names
// ("layer1.0.downsample.1.running_mean", ...), so a state dict written by
// Python loads into it.
//
// With `fused_bn` every BatchNorm that a ReLU follows (the stem's, and bn1,
// bn2, bn3 of each bottleneck, bn3 with the residual add) is one
// lamp::nn::BatchNormAct2d: cuDNN's fused kernels for channels-last fp16/bf16
// training on CUDA, the same unfused ops elsewhere; the stem's max pooling is
// lamp::nn::max_pool2d, each bottleneck's conv1
// lamp::nn::conv1x1_and_shortcut and the head's pooling
// lamp::nn::global_avg_pool2d. Names, parameters and results do not change.
// With `fused_tail` too, each bottleneck's conv3 + bn3 + shortcut + ReLU
// (and the downsampling convolution and its BatchNorm) is
// lamp::nn::conv_bn_add_relu: BatchNorm's statistics from the convolutions'
// epilogues, the rest in one pass.

#include <lamp/nn/avg_pool.h>
#include <lamp/nn/batch_norm_act.h>
#include <lamp/nn/conv_bn_add_relu.h>
#include <lamp/nn/conv_shortcut.h>
#include <lamp/nn/max_pool.h>
#include <lamp/nn/space_to_depth_conv.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

namespace resnet {

inline torch::nn::Conv2d conv(
    int64_t in,
    int64_t out,
    int64_t kernel,
    int64_t stride = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel / 2)
                               .bias(false));
}

// A BatchNorm, an optional residual add and a ReLU, registered in `owner`
// under `name`: lamp's fused BatchNormAct2d, or torch::nn::BatchNorm2d,
// `out += residual` and torch::relu as in torchvision.
class BatchNormRelu {
 public:
  BatchNormRelu(
      torch::nn::Module& owner,
      const std::string& name,
      int64_t features,
      bool fused) {
    if (fused) {
      fused_ = owner.register_module(name, lamp::nn::BatchNormAct2d(features));
    } else {
      plain_ = owner.register_module(name, torch::nn::BatchNorm2d(features));
    }
  }

  torch::Tensor operator()(
      const torch::Tensor& x,
      const torch::Tensor& residual = {}) {
    if (fused_) {
      return fused_(x, residual);
    }
    auto out = plain_(x);
    if (residual.defined()) {
      out += residual;
    }
    return torch::relu(out);
  }

  /// The fused module (empty when not fused).
  const lamp::nn::BatchNormAct2d& fused() const {
    return fused_;
  }

 private:
  torch::nn::BatchNorm2d plain_{nullptr};
  lamp::nn::BatchNormAct2d fused_{nullptr};
};

struct BottleneckImpl : torch::nn::Module {
  static constexpr int64_t kExpansion = 4;

  BottleneckImpl(
      int64_t in,
      int64_t width,
      int64_t stride,
      bool fused_bn,
      bool fused_tail = false)
      : fused_bn_(fused_bn),
        fused_tail_(fused_bn && fused_tail),
        conv1(register_module("conv1", conv(in, width, 1))),
        conv2(register_module("conv2", conv(width, width, 3, stride))),
        conv3(register_module("conv3", conv(width, width * kExpansion, 1))),
        bn1(*this, "bn1", width, fused_bn),
        bn2(*this, "bn2", width, fused_bn),
        bn3(*this, "bn3", width * kExpansion, fused_bn) {
    if (stride != 1 || in != width * kExpansion) {
      ds_conv_ = conv(in, width * kExpansion, 1, stride);
      ds_bn_ = torch::nn::BatchNorm2d(width * kExpansion);
      downsample = register_module(
          "downsample", torch::nn::Sequential(ds_conv_, ds_bn_));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // With fused_bn, conv1's input gradient is summed with the shortcut's
    // in conv1's backward GEMM (lamp/nn/conv_shortcut.h), not in an add.
    auto [out, shortcut] = fused_bn_
        ? lamp::nn::conv1x1_and_shortcut(x, conv1->weight)
        : std::pair{conv1(x), x};
    out = bn1(out); // relu(bn1(conv1(x)))
    out = bn2(conv2(out));
    if (fused_tail_) {
      return downsample
          ? lamp::nn::conv_bn_add_relu(
                out, conv3, bn3.fused(), shortcut, ds_conv_, ds_bn_)
          : lamp::nn::conv_bn_add_relu(out, conv3, bn3.fused(), shortcut);
    }
    return bn3(
        conv3(out), downsample ? downsample->forward(shortcut) : shortcut);
  }

 private:
  bool fused_bn_;
  bool fused_tail_;
  // downsample's modules ("downsample.0", "downsample.1").
  torch::nn::Conv2d ds_conv_{nullptr};
  torch::nn::BatchNorm2d ds_bn_{nullptr};

 public:
  // NOTE: declared (so registered) in the order torchvision's state dict
  // and earlier lamp checkpoints list them: convolutions, then norms.
  torch::nn::Conv2d conv1, conv2, conv3;
  BatchNormRelu bn1, bn2, bn3;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNet50Impl : torch::nn::Module {
  /// `fused_bn`: lamp::nn::BatchNormAct2d for each BatchNorm + ReLU;
  /// `fused_tail` (with `fused_bn`): lamp::nn::conv_bn_add_relu for each
  /// bottleneck's tail; `space_to_depth_stem`: the stem's convolution as
  /// lamp::nn::space_to_depth_conv2d (same result; for bf16, where
  /// cuDNN's 3-channel kernels are slow on an H200).
  explicit ResNet50Impl(
      int64_t num_classes = 1000,
      bool fused_bn = false,
      bool fused_tail = false,
      bool space_to_depth_stem = false)
      : fused_bn_(fused_bn),
        fused_tail_(fused_bn && fused_tail),
        space_to_depth_stem_(space_to_depth_stem),
        conv1(register_module(
            "conv1",
            torch::nn::Conv2d(
                torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(
                    false)))),
        bn1(*this, "bn1", 64, fused_bn),
        layer1(register_module("layer1", make_layer(64, 3, 1))),
        layer2(register_module("layer2", make_layer(128, 4, 2))),
        layer3(register_module("layer3", make_layer(256, 6, 2))),
        layer4(register_module("layer4", make_layer(512, 3, 2))),
        fc(register_module(
            "fc",
            torch::nn::Linear(512 * BottleneckImpl::kExpansion, num_classes))) {
    // torchvision's initialisation.
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* c = module->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(
            c->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
        torch::nn::init::ones_(bn->weight);
        torch::nn::init::zeros_(bn->bias);
      } else if (auto* bn = module->as<lamp::nn::BatchNormAct2d>()) {
        torch::nn::init::ones_(bn->weight);
        torch::nn::init::zeros_(bn->bias);
      }
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = space_to_depth_stem_
        ? lamp::nn::space_to_depth_conv2d(x, conv1->weight, /*padding=*/3)
        : conv1(x);
    x = bn1(x); // relu(bn1(conv1(x)))
    // With fused_bn also lamp's max pooling, which keeps a byte per output
    // element, not an int64 index (lamp/nn/max_pool.h).
    x = fused_bn_ ? lamp::nn::max_pool2d(x, 3, 2, 1)
                  : torch::max_pool2d(x, 3, 2, 1);
    x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
    // With fused_bn lamp's global average pooling, whose backward writes
    // the channels-last gradient in one kernel (lamp/nn/avg_pool.h). NOTE:
    // not avg_pool2d: its channels-last backward kernel took 0.39 ms a step
    // at bs256 on an H200, against 0.17 ms for ATen's mean backward.
    x = fused_bn_ ? lamp::nn::global_avg_pool2d(x)
                  : torch::adaptive_avg_pool2d(x, {1, 1});
    x = x.flatten(1);
    return fc(x);
  }

  /// Whether the BatchNorm + ReLU pairs are lamp::nn::BatchNormAct2d.
  bool fused_bn() const {
    return fused_bn_;
  }

 private:
  bool fused_bn_;
  bool fused_tail_;
  bool space_to_depth_stem_;
  int64_t in_ = 64; // channels entering the next layer (used while building)

 public:
  torch::nn::Conv2d conv1;
  BatchNormRelu bn1;
  torch::nn::Sequential layer1, layer2, layer3, layer4;
  torch::nn::Linear fc;

 private:
  torch::nn::Sequential make_layer(
      int64_t width,
      int64_t blocks,
      int64_t stride) {
    torch::nn::Sequential layer;
    for (int64_t i = 0; i < blocks; ++i) {
      layer->push_back(
          Bottleneck(in_, width, i == 0 ? stride : 1, fused_bn_, fused_tail_));
      in_ = width * BottleneckImpl::kExpansion;
    }
    return layer;
  }
};
TORCH_MODULE(ResNet50);

} // namespace resnet
