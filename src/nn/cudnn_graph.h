#pragma once

// Internal: cuDNN graphs through the header-only cudnn-frontend, built once
// per problem on this thread and run on the current stream. Only with
// LAMP_WITH_CUDNN_FRONTEND (src/nn/conv_stats_cudnn.cpp and
// attention_cudnn.cpp use it).

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <cudnn_frontend.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lamp::nn::detail {

namespace fe = cudnn_frontend;

// A graph built for one problem: its tensors' uids in the order its op
// passes their pointers to run(), and its workspace; or, when cuDNN has no
// plan for it, why (`rejected`, and a null graph).
struct CudnnGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<int64_t> uids;
  int64_t workspace_size = 0;
  std::string rejected;
};

// Validates, lowers and plans `built.graph` on ATen's cuDNN handle:
// heuristics A then FALLBACK, and the first plan that builds (cuDNN's own
// order, as ATen's convolutions without benchmark mode). On failure the
// graph is dropped and `built.rejected` says which step failed and what
// cuDNN said.
void plan(CudnnGraph& built);

// Runs `built` (not rejected) on the current stream, `pointers` in the
// order of `built.uids`, with a workspace from the caching allocator on
// `like`'s device. Nothing waits for the host, so it can be captured in a
// CUDA graph. Throws c10::Error with cuDNN's message on failure.
void run(
    const CudnnGraph& built,
    const std::vector<void*>& pointers,
    const at::Tensor& like);

// cuDNN's type for a float16, bfloat16 or float32 tensor.
fe::DataType_t graph_type(at::ScalarType type);

// The strides of an (n, c, h, w) channels-last tensor, as cuDNN's graphs
// take them (dimensions in NCHW order).
std::vector<int64_t> nhwc_strides(const std::vector<int64_t>& dims);

// What identifies a problem: the op, the device, dtypes, sizes, options.
using GraphKey = std::array<int64_t, 24>;

// Note [cuDNN graph cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A graph and its plan are built at the first call with a new key on a
// thread (cuDNN's heuristics, then compiling the plan: milliseconds to a
// second) and kept for the thread's life: each thread has its own map, as
// ATen keeps its cuDNN plans per thread, because a plan is built with the
// calling thread's handle. Later calls only look the key up (no lock), so
// the training step pays nothing once every shape has run. The first call
// with a shape must not be inside a CUDA graph capture (GraphedStep's
// warm-up steps make those calls). `build` runs only on a miss; a rejected
// graph is cached too, so a problem cuDNN cannot take is asked about once.
CudnnGraph& cached_graph(
    const GraphKey& key,
    const std::function<CudnnGraph()>& build);

// Graphs built (or rejected) by cached_graph in this process (tests: a plan
// is built once per problem).
int64_t graphs_built();

} // namespace lamp::nn::detail
