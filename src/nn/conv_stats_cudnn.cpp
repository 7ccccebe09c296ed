// cuDNN's graph for conv2d_stats: [scale + bias + ReLU] -> conv_fprop ->
// genstats, one graph per problem (Note [cuDNN graph cache]), the shape of
// cudnn-frontend's "SBRCS" sample and of the probe measured in
// docs/design/batchnorm-in-convolutions.md (on ResNet-50's convolutions:
// the sums add ~10 % to the convolutions' time and save BatchNorm a pass
// over each output).

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <tuple>
#include <utility>
#include <vector>

#include "conv_stats.h"
#include "cudnn_graph.h"

namespace lamp::nn::detail {
namespace {

// Everything a graph depends on, and the output's spatial size.
struct Problem {
  int64_t n, c, h, w, k, r, s, out_h, out_w;
  ConvGeometry geometry;
  at::ScalarType type, scale_type;
  bool prologue;
  int device;

  GraphKey key() const {
    GraphKey key{};
    const int64_t words[] = {
        1, // the op: conv2d_stats
        device,
        static_cast<int64_t>(type),
        prologue ? static_cast<int64_t>(scale_type) + 1 : 0,
        n,
        c,
        h,
        w,
        k,
        r,
        s,
        geometry.stride[0],
        geometry.stride[1],
        geometry.padding[0],
        geometry.padding[1],
        geometry.dilation[0],
        geometry.dilation[1]};
    static_assert(
        sizeof(words) / sizeof(words[0]) <= std::tuple_size<GraphKey>::value);
    std::copy(std::begin(words), std::end(words), key.begin());
    return key;
  }
};

// X, W, [S, B,] Y, SUM, SQ_SUM: the order of run()'s pointers.
CudnnGraph build(const Problem& p) {
  CudnnGraph built;
  built.graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *built.graph;
  g.set_io_data_type(graph_type(p.type))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> x_dims{p.n, p.c, p.h, p.w};
  const std::vector<int64_t> w_dims{p.k, p.c, p.r, p.s};
  const std::vector<int64_t> y_dims{p.n, p.k, p.out_h, p.out_w};
  auto X = g.tensor(fe::graph::Tensor_attributes()
                        .set_name("input")
                        .set_dim(x_dims)
                        .set_stride(nhwc_strides(x_dims)));
  auto W = g.tensor(fe::graph::Tensor_attributes()
                        .set_name("weight")
                        .set_dim(w_dims)
                        .set_stride(nhwc_strides(w_dims)));
  // Explicit uids, 1, 2, ... in run()'s order: the frontend assigns its own
  // only when the graph is validated, so reading them here would give
  // placeholders that execute() then cannot find.
  const auto keep = [&built](const auto& tensor) {
    const int64_t uid = static_cast<int64_t>(built.uids.size()) + 1;
    tensor->set_uid(uid);
    built.uids.push_back(uid);
  };
  keep(X);
  keep(W);
  auto conv_input = X;
  if (p.prologue) {
    const std::vector<int64_t> c_dims{1, p.c, 1, 1};
    const std::vector<int64_t> c_strides{p.c, 1, p.c, p.c};
    const auto per_channel = [&](const char* name) {
      return g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_dim(c_dims)
                          .set_stride(c_strides)
                          .set_data_type(graph_type(p.scale_type)));
    };
    auto S = per_channel("scale");
    auto B = per_channel("bias");
    keep(S);
    keep(B);
    const auto op = [](const char* name, fe::PointwiseMode_t mode) {
      return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode);
    };
    auto scaled = g.pointwise(X, S, op("scale", fe::PointwiseMode_t::MUL));
    auto shifted = g.pointwise(scaled, B, op("bias", fe::PointwiseMode_t::ADD));
    conv_input =
        g.pointwise(shifted, op("relu", fe::PointwiseMode_t::RELU_FWD));
  }
  const ConvGeometry& geo = p.geometry;
  auto Y = g.conv_fprop(
      conv_input,
      W,
      fe::graph::Conv_fprop_attributes()
          .set_name("conv")
          .set_stride({geo.stride[0], geo.stride[1]})
          .set_padding({geo.padding[0], geo.padding[1]})
          .set_dilation({geo.dilation[0], geo.dilation[1]}));
  Y->set_output(true).set_dim(y_dims).set_stride(nhwc_strides(y_dims));
  auto [SUM, SQ_SUM] =
      g.genstats(Y, fe::graph::Genstats_attributes().set_name("stats"));
  for (const auto& T : {SUM, SQ_SUM}) {
    T->set_output(true)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({1, p.k, 1, 1})
        .set_stride({p.k, 1, p.k, p.k});
  }
  keep(Y);
  keep(SUM);
  keep(SQ_SUM);
  plan(built);
  return built;
}

} // namespace

std::optional<ConvStats> conv2d_stats_cudnn(
    const at::Tensor& input,
    const at::Tensor& weight,
    const ConvGeometry& geometry,
    const at::Tensor& scale,
    const at::Tensor& bias,
    std::string* why_not) {
  const auto refuse = [why_not](std::string reason) {
    if (why_not != nullptr) {
      *why_not = std::move(reason);
    }
    return std::optional<ConvStats>();
  };
  if (!input.is_cuda()) {
    return refuse("the input is not on a CUDA device");
  }
  const at::ScalarType type = input.scalar_type();
  if (type != at::kHalf && type != at::kBFloat16) {
    return refuse("the input is neither float16 nor bfloat16");
  }
  if (!input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return refuse("the input is not channels-last contiguous");
  }
  // The handle, the plan and the outputs are the input's device's.
  const c10::cuda::CUDAGuard guard(input.device());
  // NOTE: a weight in another layout is copied (weights are small); the
  // model's own are channels-last after model->to(channels_last).
  const at::Tensor w = weight.contiguous(at::MemoryFormat::ChannelsLast);
  // NOTE: cuDNN's kernels load 16 bytes at a time; a view that starts
  // elsewhere would fail at launch, not at planning.
  for (const at::Tensor* t : {&input, &w, &scale, &bias}) {
    if (t->defined() &&
        reinterpret_cast<uintptr_t>(t->const_data_ptr()) % 16 != 0) {
      return refuse("a tensor's data is not 16-byte aligned");
    }
  }
  Problem p{};
  p.n = input.size(0);
  p.c = input.size(1);
  p.h = input.size(2);
  p.w = input.size(3);
  p.k = w.size(0);
  p.r = w.size(2);
  p.s = w.size(3);
  p.geometry = geometry;
  const auto extent = [&geometry](int64_t in, int64_t kernel, int i) {
    return (in + 2 * geometry.padding[i] - geometry.dilation[i] * (kernel - 1) -
            1) /
        geometry.stride[i] +
        1;
  };
  p.out_h = extent(p.h, p.r, 0);
  p.out_w = extent(p.w, p.s, 1);
  if (p.n == 0 || p.out_h <= 0 || p.out_w <= 0) {
    return refuse("an empty input or output");
  }
  p.type = type;
  p.prologue = scale.defined();
  p.scale_type = p.prologue ? scale.scalar_type() : type;
  p.device = input.get_device();

  CudnnGraph& built = cached_graph(p.key(), [&p] { return build(p); });
  if (!built.graph) {
    return refuse("cuDNN has no plan for it (" + built.rejected + ")");
  }
  ConvStats result;
  result.output = at::empty(
      {p.n, p.k, p.out_h, p.out_w},
      input.options().memory_format(at::MemoryFormat::ChannelsLast));
  // NOTE: zeroed, in one kernel for both, whether genstats accumulates
  // into its outputs or writes them; each row starts 64-byte aligned (cuDNN
  // wants its pointers aligned).
  const int64_t row = (p.k + 15) / 16 * 16;
  const at::Tensor sums =
      at::zeros({2, row}, input.options().dtype(at::kFloat));
  result.sum = sums[0].narrow(0, 0, p.k);
  result.sum_of_squares = sums[1].narrow(0, 0, p.k);
  std::vector<void*> pointers{input.data_ptr(), w.data_ptr()};
  if (p.prologue) {
    pointers.push_back(scale.data_ptr());
    pointers.push_back(bias.data_ptr());
  }
  pointers.push_back(result.output.data_ptr());
  pointers.push_back(result.sum.data_ptr());
  pointers.push_back(result.sum_of_squares.data_ptr());
  run(built, pointers, input);
  if (why_not != nullptr) {
    why_not->clear();
  }
  return result;
}

int64_t conv_stats_graphs_built() {
  return graphs_built();
}

} // namespace lamp::nn::detail
