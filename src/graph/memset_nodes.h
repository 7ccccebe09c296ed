#pragma once

// Internal: turns the memset nodes of a captured CUDA graph into kernel
// nodes. Plain CUDA, no LibTorch types (nvcc compiles it without LibTorch's
// headers); src/graph/cuda_graph.cpp calls it between capture and
// instantiation.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace lamp::detail {

// Replaces every memset node of `graph` (top level; a captured graph has no
// other) with a kernel node that writes the same bytes, with the same
// dependencies and dependents, and sets *replaced to how many there were.
// On an error the graph may be half changed: do not instantiate it.
//
// Note [Memset nodes]: cuDNN's BatchNorm and convolution calls issue a small
// cudaMemsetAsync each, 146 a ResNet-50 step at batch 64, and in a graph each
// memset node costs more than its 0.8 us: traced on an H200 (CUDA 13), the
// GPU idled 1.35 us before and 2.4 us after each one, against 0.5 us
// between two kernel nodes. A kernel node writing the same bytes has the
// kernel-to-kernel gap.
cudaError_t replace_memset_nodes(cudaGraph_t graph, size_t* replaced);

} // namespace lamp::detail
