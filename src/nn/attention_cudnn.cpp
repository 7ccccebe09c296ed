// cuDNN's SDPA graphs over packed q/k/v (lamp::nn::qkv_attention): the
// forward reads Q, K and V where c_attn wrote them ([B, T, 3, H, D]) and
// writes O with the heads side by side ([B, T, H, D], c_proj's input
// without a copy); the backward writes dQ, dK and dV into their places in
// one [B, T, 3C] buffer. ATen's cuDNN attention runs the same kernels but
// allocates dQ, dK and dV apart, and the split's backward then concatenates
// them: on GPT-2 124M at batch 16 x 1,024 that copy was 0.6 ms of a 33 ms
// step (H100), ~2 % of the step at every GPT-2 size.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <tuple>
#include <vector>

#include "attention_cudnn.h"
#include "cudnn_graph.h"

namespace lamp::nn::detail {
namespace {

enum class Pass : int64_t { kForward = 2, kBackward = 3 };

GraphKey key_of(
    const AttentionProblem& p,
    at::ScalarType type,
    int device,
    Pass pass) {
  GraphKey key{};
  const int64_t words[] = {
      static_cast<int64_t>(pass), // the op (conv2d_stats is 1)
      device,
      static_cast<int64_t>(type),
      p.batch,
      p.seq,
      p.heads,
      p.head_dim,
      p.causal ? 1 : 0};
  static_assert(
      sizeof(words) / sizeof(words[0]) <= std::tuple_size<GraphKey>::value);
  std::copy(std::begin(words), std::end(words), key.begin());
  return key;
}

// Dims and strides (elements) of the graph's [B, H, T, D] views.
struct Layout {
  std::vector<int64_t> dims, packed, plain, stats_dims, stats;
};

Layout layout_of(const AttentionProblem& p) {
  const int64_t c = p.heads * p.head_dim;
  Layout l;
  l.dims = {p.batch, p.heads, p.seq, p.head_dim};
  // Q, K, V and their gradients inside [B, T, 3C]; O and dO in [B, T, C].
  l.packed = {p.seq * 3 * c, p.head_dim, 3 * c, 1};
  l.plain = {p.seq * c, p.head_dim, c, 1};
  l.stats_dims = {p.batch, p.heads, p.seq, 1};
  l.stats = {p.heads * p.seq, p.seq, 1, 1};
  return l;
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// A graph with bf16/fp16 I/O and fp32 math, and a `keep` that gives each
// tensor the next uid in run()'s pointer order.
struct Builder {
  CudnnGraph built;
  fe::graph::Graph* g;

  explicit Builder(at::ScalarType type) {
    built.graph = std::make_shared<fe::graph::Graph>();
    g = built.graph.get();
    g->set_io_data_type(graph_type(type))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  }
  // NOTE: explicit uids (see conv_stats_cudnn.cpp: the frontend assigns its
  // own only when validating).
  void keep(const TensorPtr& tensor) {
    const int64_t uid = static_cast<int64_t>(built.uids.size()) + 1;
    tensor->set_uid(uid);
    built.uids.push_back(uid);
  }
  TensorPtr input(
      const char* name,
      const std::vector<int64_t>& dims,
      const std::vector<int64_t>& strides) {
    auto t = g->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim(dims).set_stride(
            strides));
    keep(t);
    return t;
  }
  // The softmax scale, passed by value at each run (one graph per shape,
  // whatever the scale).
  TensorPtr scale() {
    auto t = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("attn_scale")
                           .set_dim({1, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_is_pass_by_value(true)
                           .set_data_type(fe::DataType_t::FLOAT));
    keep(t);
    return t;
  }
};

// Q, K and V where they lie in [B, T, 3C], given uids in that order.
std::array<TensorPtr, 3> qkv_inputs(Builder& b, const Layout& l) {
  // NOTE: a braced list is evaluated left to right: the uids' order.
  return {
      b.input("q", l.dims, l.packed),
      b.input("k", l.dims, l.packed),
      b.input("v", l.dims, l.packed)};
}

// PyTorch's is_causal: the diagonal from the top left corner (forward and
// backward attributes have the same setters).
template <typename Attributes>
void set_mask(Attributes& options, bool causal) {
  if (causal) {
    options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
        .set_diagonal_band_right_bound(0);
  }
}

// Q, K, V, scale, O, stats: the order of run()'s pointers.
CudnnGraph build_forward(const AttentionProblem& p, at::ScalarType type) {
  const Layout l = layout_of(p);
  Builder b(type);
  const auto [Q, K, V] = qkv_inputs(b, l);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("sdpa")
                     .set_generate_stats(true)
                     .set_attn_scale(b.scale());
  set_mask(options, p.causal);
  auto [O, stats] = b.g->sdpa(Q, K, V, options);
  O->set_output(true).set_dim(l.dims).set_stride(l.plain);
  stats->set_output(true)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(l.stats_dims)
      .set_stride(l.stats);
  b.keep(O);
  b.keep(stats);
  plan(b.built);
  return std::move(b.built);
}

// Q, K, V, O, dO, stats, scale, dQ, dK, dV: the order of run()'s pointers.
CudnnGraph build_backward(const AttentionProblem& p, at::ScalarType type) {
  const Layout l = layout_of(p);
  Builder b(type);
  const auto [Q, K, V] = qkv_inputs(b, l);
  auto O = b.input("o", l.dims, l.plain);
  auto dO = b.input("do", l.dims, l.plain);
  auto stats = b.g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_dim(l.stats_dims)
                               .set_stride(l.stats)
                               .set_data_type(fe::DataType_t::FLOAT));
  b.keep(stats);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(b.scale());
  set_mask(options, p.causal);
  auto [dQ, dK, dV] = b.g->sdpa_backward(Q, K, V, O, dO, stats, options);
  for (const auto& t : {dQ, dK, dV}) {
    t->set_output(true).set_dim(l.dims).set_stride(l.packed);
    b.keep(t);
  }
  plan(b.built);
  return std::move(b.built);
}

CudnnGraph& graph_for(
    const at::Tensor& qkv,
    const AttentionProblem& p,
    Pass pass) {
  const auto type = qkv.scalar_type();
  return cached_graph(
      key_of(p, type, qkv.get_device(), pass), [&p, type, pass] {
        return pass == Pass::kForward ? build_forward(p, type)
                                      : build_backward(p, type);
      });
}

// The element at (0, 0, part * C) of [B, T, 3C]: Q, K or V's start.
void* part(const at::Tensor& packed, int64_t index, int64_t c) {
  return static_cast<char*>(packed.data_ptr()) +
      index * c * static_cast<int64_t>(packed.element_size());
}

} // namespace

std::string cudnn_attention_unsupported(
    const at::Tensor& qkv,
    const AttentionProblem& p,
    bool backward) {
  if (!qkv.is_cuda()) {
    return "qkv is not on a CUDA device";
  }
  const auto type = qkv.scalar_type();
  if (type != at::kHalf && type != at::kBFloat16) {
    return "qkv is neither float16 nor bfloat16";
  }
  if (!qkv.is_contiguous()) {
    return "qkv is not contiguous";
  }
  // NOTE: cuDNN's kernels load 16 bytes at a time from each of Q, K and V,
  // which start C elements apart.
  if (p.head_dim % 8 != 0 ||
      reinterpret_cast<uintptr_t>(qkv.const_data_ptr()) % 16 != 0) {
    return "the head size is not a multiple of 8, or qkv is not 16-byte "
           "aligned";
  }
  if (qkv.numel() == 0) {
    return "qkv is empty";
  }
  const c10::cuda::CUDAGuard guard(qkv.device());
  for (const Pass pass : {Pass::kForward, Pass::kBackward}) {
    if (pass == Pass::kBackward && !backward) {
      break;
    }
    const CudnnGraph& built = graph_for(qkv, p, pass);
    if (!built.graph) {
      return std::string("cuDNN has no plan for its ") +
          (pass == Pass::kForward ? "forward" : "backward") + " (" +
          built.rejected + ")";
    }
  }
  return "";
}

AttentionForward cudnn_attention_forward(
    const at::Tensor& qkv,
    const AttentionProblem& p) {
  const c10::cuda::CUDAGuard guard(qkv.device());
  const int64_t c = p.heads * p.head_dim;
  AttentionForward out;
  out.out = at::empty({p.batch, p.seq, c}, qkv.options());
  out.stats =
      at::empty({p.batch, p.heads, p.seq, 1}, qkv.options().dtype(at::kFloat));
  float scale = p.scale;
  run(graph_for(qkv, p, Pass::kForward),
      {part(qkv, 0, c),
       part(qkv, 1, c),
       part(qkv, 2, c),
       &scale,
       out.out.data_ptr(),
       out.stats.data_ptr()},
      qkv);
  return out;
}

at::Tensor cudnn_attention_backward(
    const at::Tensor& qkv,
    const AttentionForward& saved,
    const at::Tensor& grad_out,
    const AttentionProblem& p) {
  const c10::cuda::CUDAGuard guard(qkv.device());
  const int64_t c = p.heads * p.head_dim;
  // NOTE: dO must have O's layout; a gradient from a GEMM already has it.
  const at::Tensor dout = grad_out.to(qkv.scalar_type()).contiguous();
  TORCH_INTERNAL_ASSERT(dout.sizes() == saved.out.sizes());
  at::Tensor dqkv = at::empty_like(qkv);
  float scale = p.scale;
  run(graph_for(qkv, p, Pass::kBackward),
      {part(qkv, 0, c),
       part(qkv, 1, c),
       part(qkv, 2, c),
       saved.out.data_ptr(),
       dout.data_ptr(),
       saved.stats.data_ptr(),
       &scale,
       part(dqkv, 0, c),
       part(dqkv, 1, c),
       part(dqkv, 2, c)},
      qkv);
  return dqkv;
}

} // namespace lamp::nn::detail
