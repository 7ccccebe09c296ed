// GraphedStep's memset nodes as kernel nodes (Note [Memset nodes]): a graph
// of memsets of every element size, pitch and alignment, ordered by edges and
// followed by a copy, writes the same bytes after the rewrite as before; a
// GraphedStep whose step issues memsets replays the same results with and
// without the rewrite.
#include <lamp/config.h>
#include <lamp/cuda_graph.h>
#include <lamp/optim.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "support.h"

#if LAMP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include "graph/memset_nodes.h"
#endif

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace memset_nodes_test {

namespace {

#if LAMP_WITH_CUDA

class MemsetNodesGpu : public lamp::test::GpuTest {};

// One memset of the graph: where, and cudaMemsetParams' fields.
struct Memset {
  size_t offset;
  unsigned element_size;
  unsigned value;
  size_t width;
  size_t height = 1;
  size_t pitch = 0;
};

// The bytes a buffer of 0xab holds after `memsets` in order, then the copy of
// its first `copied` bytes to its second half.
std::vector<uint8_t> expected(
    size_t bytes,
    const std::vector<Memset>& memsets,
    size_t copied) {
  std::vector<uint8_t> out(bytes, 0xab);
  for (const auto& m : memsets) {
    for (size_t row = 0; row < m.height; ++row) {
      for (size_t i = 0; i < m.width * m.element_size; ++i) {
        out[m.offset + row * m.pitch + i] =
            static_cast<uint8_t>(m.value >> (8 * (i % m.element_size)));
      }
    }
  }
  std::copy(out.begin(), out.begin() + copied, out.begin() + bytes / 2);
  return out;
}

// Builds the graph (a chain: memsets, then the copy), optionally rewrites
// it, runs it once and returns the buffer's bytes.
std::vector<uint8_t> run(
    bool rewrite,
    size_t bytes,
    const std::vector<Memset>& memsets,
    size_t copied,
    size_t* replaced) {
  auto buffer = torch::full(
      {static_cast<int64_t>(bytes)},
      0xab,
      torch::dtype(torch::kUInt8).device(torch::kCUDA));
  auto* base = static_cast<char*>(buffer.data_ptr());
  cudaGraph_t graph = nullptr;
  C10_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t last = nullptr;
  for (const auto& m : memsets) {
    cudaMemsetParams p{};
    p.dst = base + m.offset;
    p.elementSize = m.element_size;
    p.value = m.value;
    p.width = m.width;
    p.height = m.height;
    p.pitch = m.height > 1 ? m.pitch : 0;
    cudaGraphNode_t node = nullptr;
    C10_CUDA_CHECK(cudaGraphAddMemsetNode(
        &node, graph, last ? &last : nullptr, last ? 1 : 0, &p));
    last = node;
  }
  cudaGraphNode_t copy = nullptr;
  C10_CUDA_CHECK(cudaGraphAddMemcpyNode1D(
      &copy,
      graph,
      &last,
      1,
      base + bytes / 2,
      base,
      copied,
      cudaMemcpyDeviceToDevice));
  *replaced = 0;
  if (rewrite) {
    C10_CUDA_CHECK(lamp::detail::replace_memset_nodes(graph, replaced));
    size_t n = 0;
    C10_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    C10_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
    for (auto node : nodes) {
      cudaGraphNodeType type{};
      C10_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      EXPECT_NE(type, cudaGraphNodeTypeMemset);
    }
    EXPECT_EQ(n, memsets.size() + 1);
  }
  cudaGraphExec_t exec = nullptr;
  C10_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const auto stream = at::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  C10_CUDA_CHECK(cudaGraphExecDestroy(exec));
  C10_CUDA_CHECK(cudaGraphDestroy(graph));
  const auto host = buffer.cpu();
  const auto* p = host.data_ptr<uint8_t>();
  return {p, p + bytes};
}

TEST_F(MemsetNodesGpu, KernelsWriteTheSameBytesInTheSameOrder) {
  const size_t bytes = 1 << 16;
  const std::vector<Memset> memsets = {
      {3, 1, 0x5a, 1000}, // unaligned, odd length
      {512, 1, 0x11, 100}, // these two overlap: order matters
      {562, 1, 0x22, 100},
      {1024, 2, 0x1234, 77}, // 2-byte elements
      {2050, 2, 0xbeef, 5}, // 2-byte, not 16-byte aligned
      {4096, 4, 0xdeadbeef, 300}, // 4-byte elements
      {8192, 4, 0, 8000}, // zeros, many vectors and blocks
      {20000, 1, 0x77, 10, 5, 64}, // 2-D: 5 rows of 10, pitch 64
      {24576, 4, 0x01020304, 3, 4, 48}, // 2-D, 4-byte elements
  };
  const size_t copied = 30000;
  size_t none = 0;
  size_t replaced = 0;
  const auto want = expected(bytes, memsets, copied);
  EXPECT_EQ(run(false, bytes, memsets, copied, &none), want)
      << "the test's own expectation";
  EXPECT_EQ(run(true, bytes, memsets, copied, &replaced), want);
  EXPECT_EQ(replaced, memsets.size());
}

// A step that zeroes a buffer with cudaMemsetAsync before using it, as
// cuDNN does with its workspaces.
struct MemsetTrainer {
  MemsetTrainer() {
    // NOTE: the seed first: members are built before this body runs.
    torch::manual_seed(0);
    linear = torch::nn::Linear(8, 4);
    linear->to(torch::kCUDA);
    optimizer = std::make_unique<lamp::optim::FusedSGD>(
        linear->parameters(), torch::optim::SGDOptions(0.1));
  }
  torch::Tensor step(const std::vector<torch::Tensor>& in) {
    optimizer->zero_grad();
    C10_CUDA_CHECK(cudaMemsetAsync(
        scratch.data_ptr(),
        0,
        scratch.numel() * scratch.element_size(),
        at::cuda::getCurrentCUDAStream()));
    auto loss = (linear(in[0] + scratch) - in[1]).pow(2).mean();
    loss.backward();
    optimizer->step();
    scratch.add_(1); // the next step's memset must zero it again
    return loss;
  }
  torch::nn::Linear linear{nullptr};
  torch::Tensor scratch = torch::full(
      {16, 8},
      7.0,
      torch::dtype(torch::kFloat).device(torch::kCUDA));
  std::unique_ptr<lamp::optim::FusedSGD> optimizer;
};

TEST_F(MemsetNodesGpu, GraphedStepReplaysTheSameWithAndWithoutTheRewrite) {
  torch::manual_seed(1);
  std::vector<std::vector<torch::Tensor>> data;
  for (int i = 0; i < 6; ++i) {
    data.push_back(
        {torch::randn({16, 8}, torch::kCUDA),
         torch::randn({16, 4}, torch::kCUDA)});
  }
  std::vector<torch::Tensor> weights;
  for (bool rewrite : {false, true}) {
    MemsetTrainer t;
    lamp::GraphedStep step(
        [&](const std::vector<torch::Tensor>& in) { return t.step(in); },
        data[0],
        {t.optimizer.get()},
        lamp::GraphedStepOptions().warmup_steps(1).memset_kernels(rewrite));
    for (const auto& batch : data) {
      step(batch);
    }
    ASSERT_TRUE(step.is_captured());
    if (rewrite) {
      EXPECT_GE(step.memset_kernels(), 1u) << "the step's own memset";
    } else {
      EXPECT_EQ(step.memset_kernels(), 0u);
    }
    weights.push_back(t.linear->weight.detach().clone());
  }
  EXPECT_TRUE(torch::equal(weights[0], weights[1]));
}

#endif // LAMP_WITH_CUDA

} // namespace

} // namespace memset_nodes_test
