#include "memset_nodes.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace lamp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// cudaMemsetParams as a kernel: `height` rows of `width` elements of
// `element_size` (1, 2 or 4) bytes, `pitch` bytes apart, each set to the low
// bytes of `value`. Each thread owns a 16-byte slot of a row: one vector
// store where the slot is whole and aligned, bytes otherwise (row ends,
// unaligned rows). `pattern` is the value repeated over 4 bytes, and as
// every row starts on an element, byte b of a row is pattern byte b % 4.
__global__ void __launch_bounds__(kThreads) memset_kernel(
    char* dst,
    size_t pitch,
    uint32_t pattern,
    size_t row_bytes,
    size_t height) {
  const size_t slots_per_row = (row_bytes + 15) / 16;
  const size_t slots = slots_per_row * height;
  for (size_t s = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x;
       s < slots;
       s += static_cast<size_t>(gridDim.x) * kThreads) {
    const size_t row = s / slots_per_row;
    const size_t begin = (s - row * slots_per_row) * 16;
    char* p = dst + row * pitch + begin;
    const size_t bytes = min(row_bytes - begin, size_t{16});
    if (bytes == 16 && reinterpret_cast<uintptr_t>(p) % 16 == 0) {
      *reinterpret_cast<uint4*>(p) =
          make_uint4(pattern, pattern, pattern, pattern);
      continue;
    }
    for (size_t b = 0; b < bytes; ++b) {
      p[b] = static_cast<char>(pattern >> (8 * ((begin + b) % 4)));
    }
  }
}

// The graph API's edge lists: CUDA 13 has edge data on every call (12.3+
// as the _v2 functions); a captured graph's edges are the default ones.
// `query`: cudaGraphNodeGetDependencies or cudaGraphNodeGetDependentNodes.
#if CUDART_VERSION >= 13000
using Edge = cudaGraphEdgeData;
template <typename Query>
cudaError_t neighbours(
    Query query,
    cudaGraphNode_t node,
    std::vector<cudaGraphNode_t>& nodes,
    std::vector<Edge>& edges) {
  size_t n = 0;
  cudaError_t e = query(node, nullptr, nullptr, &n);
  if (e != cudaSuccess) {
    return e;
  }
  nodes.resize(n);
  edges.resize(n);
  return query(node, nodes.data(), edges.data(), &n);
}
cudaError_t add_edges(
    cudaGraph_t graph,
    const std::vector<cudaGraphNode_t>& from,
    const std::vector<cudaGraphNode_t>& to,
    const std::vector<Edge>& edges) {
  return from.empty()
      ? cudaSuccess
      : cudaGraphAddDependencies(
            graph, from.data(), to.data(), edges.data(), from.size());
}
#else
using Edge = int; // no edge data before CUDA 13 (without the _v2 calls)
template <typename Query>
cudaError_t neighbours(
    Query query,
    cudaGraphNode_t node,
    std::vector<cudaGraphNode_t>& nodes,
    std::vector<Edge>& /*edges*/) {
  size_t n = 0;
  cudaError_t e = query(node, nullptr, &n);
  if (e != cudaSuccess) {
    return e;
  }
  nodes.resize(n);
  return query(node, nodes.data(), &n);
}
cudaError_t add_edges(
    cudaGraph_t graph,
    const std::vector<cudaGraphNode_t>& from,
    const std::vector<cudaGraphNode_t>& to,
    const std::vector<Edge>& /*edges*/) {
  return from.empty()
      ? cudaSuccess
      : cudaGraphAddDependencies(graph, from.data(), to.data(), from.size());
}
#endif

} // namespace

cudaError_t replace_memset_nodes(cudaGraph_t graph, size_t* replaced) {
  *replaced = 0;
  size_t n = 0;
  cudaError_t e = cudaGraphGetNodes(graph, nullptr, &n);
  if (e != cudaSuccess) {
    return e;
  }
  std::vector<cudaGraphNode_t> nodes(n);
  e = cudaGraphGetNodes(graph, nodes.data(), &n);
  if (e != cudaSuccess) {
    return e;
  }
  std::vector<cudaGraphNode_t> before;
  std::vector<cudaGraphNode_t> after;
  std::vector<Edge> before_edges;
  std::vector<Edge> after_edges;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if ((e = cudaGraphNodeGetType(node, &type)) != cudaSuccess) {
      return e;
    }
    if (type != cudaGraphNodeTypeMemset) {
      continue;
    }
    cudaMemsetParams m{};
    if ((e = cudaGraphMemsetNodeGetParams(node, &m)) != cudaSuccess) {
      return e;
    }
    uint32_t pattern = m.value;
    if (m.elementSize == 1) {
      pattern = (m.value & 0xffu) * 0x01010101u;
    } else if (m.elementSize == 2) {
      pattern = (m.value & 0xffffu) * 0x00010001u;
    }
    char* dst = static_cast<char*>(m.dst);
    size_t pitch = m.pitch;
    size_t row_bytes = m.width * m.elementSize;
    size_t height = m.height;
    const size_t slots = (row_bytes + 15) / 16 * height;
    const auto blocks = static_cast<unsigned>(std::max<int64_t>(
        1,
        std::min<int64_t>(
            kMaxBlocks,
            static_cast<int64_t>((slots + kThreads - 1) / kThreads))));
    void* args[] = {&dst, &pitch, &pattern, &row_bytes, &height};
    cudaKernelNodeParams k{};
    k.func = reinterpret_cast<void*>(memset_kernel);
    k.gridDim = dim3(blocks);
    k.blockDim = dim3(kThreads);
    k.kernelParams = args;
    if ((e = neighbours(
             cudaGraphNodeGetDependencies, node, before, before_edges)) !=
            cudaSuccess ||
        (e = neighbours(
             cudaGraphNodeGetDependentNodes, node, after, after_edges)) !=
            cudaSuccess) {
      return e;
    }
    cudaGraphNode_t kernel = nullptr;
    e = cudaGraphAddKernelNode(
        &kernel, graph, before.data(), before.size(), &k);
    if (e != cudaSuccess) {
      return e;
    }
    // The memset's outgoing edges, now from the kernel; then the memset
    // goes, and its edges with it.
    std::vector<cudaGraphNode_t> from(after.size(), kernel);
    if ((e = add_edges(graph, from, after, after_edges)) != cudaSuccess ||
        (e = cudaGraphDestroyNode(node)) != cudaSuccess) {
      return e;
    }
    ++*replaced;
  }
  return cudaSuccess;
}

} // namespace lamp::detail
