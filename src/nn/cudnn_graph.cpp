#include "cudnn_graph.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <atomic>
#include <unordered_map>
#include <utility>

#include "cudnn_utils.h"

namespace lamp::nn::detail {
namespace {

struct KeyHash {
  size_t operator()(const GraphKey& key) const {
    // FNV-1a over the words: keys differ in a few small numbers.
    uint64_t h = 1469598103934665603ULL;
    for (const int64_t word : key) {
      h = (h ^ static_cast<uint64_t>(word)) * 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};

std::atomic<int64_t> built_count{0};

} // namespace

void plan(CudnnGraph& built) {
  fe::graph::Graph& g = *built.graph;
  const cudnnHandle_t h = handle();
  // Each step returns cuDNN's verdict; the first bad one is the reason.
  const auto ok = [&built](const char* step, fe::error_t status) {
    if (status.is_good()) {
      return true;
    }
    built.rejected = c10::str(step, ": ", status.get_message());
    return false;
  };
  const bool planned = ok("validate", g.validate()) &&
      ok("build_operation_graph", g.build_operation_graph(h)) &&
      ok("create_execution_plans",
         g.create_execution_plans(
             {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK})) &&
      ok("check_support", g.check_support()) &&
      ok("build_plans",
         g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)) &&
      ok("get_workspace_size", g.get_workspace_size(built.workspace_size));
  if (!planned) {
    built.graph.reset();
  }
}

void run(
    const CudnnGraph& built,
    const std::vector<void*>& pointers,
    const at::Tensor& like) {
  TORCH_INTERNAL_ASSERT(
      built.graph && pointers.size() == built.uids.size(),
      "lamp: a rejected cuDNN graph, or ",
      pointers.size(),
      " pointers for ",
      built.uids.size(),
      " tensors");
  std::unordered_map<int64_t, void*> pack;
  pack.reserve(pointers.size());
  for (size_t i = 0; i < pointers.size(); ++i) {
    pack.emplace(built.uids[i], pointers[i]);
  }
  const at::Tensor workspace =
      buffer(static_cast<size_t>(built.workspace_size), like);
  fe::error_t status =
      built.graph->execute(handle(), pack, workspace.data_ptr());
  TORCH_CHECK(
      status.is_good(),
      "lamp: running a cuDNN graph failed: ",
      status.get_message());
}

fe::DataType_t graph_type(at::ScalarType type) {
  switch (type) {
    case at::kHalf:
      return fe::DataType_t::HALF;
    case at::kBFloat16:
      return fe::DataType_t::BFLOAT16;
    case at::kFloat:
      return fe::DataType_t::FLOAT;
    default:
      TORCH_INTERNAL_ASSERT(false, "lamp: no cuDNN graph type for ", type);
  }
}

std::vector<int64_t> nhwc_strides(const std::vector<int64_t>& dims) {
  TORCH_INTERNAL_ASSERT(dims.size() == 4);
  const int64_t c = dims[1], h = dims[2], w = dims[3];
  return {c * h * w, 1, w * c, c};
}

CudnnGraph& cached_graph(
    const GraphKey& key,
    const std::function<CudnnGraph()>& build) {
  // See Note [cuDNN graph cache].
  thread_local std::unordered_map<GraphKey, CudnnGraph, KeyHash> graphs;
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    it = graphs.emplace(key, build()).first;
    built_count.fetch_add(1, std::memory_order_relaxed);
  }
  return it->second;
}

int64_t graphs_built() {
  return built_count.load(std::memory_order_relaxed);
}

} // namespace lamp::nn::detail
