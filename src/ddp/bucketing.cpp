#include "bucketing.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace lamp::detail {

BucketAssignment compute_bucket_assignment_by_size(
    const std::vector<at::Tensor>& tensors,
    const std::vector<size_t>& bucket_size_limits,
    const std::vector<int64_t>& tensor_indices) {
  TORCH_CHECK_VALUE(
      !bucket_size_limits.empty(),
      "compute_bucket_assignment_by_size: no bucket size limit given.");
  TORCH_CHECK_VALUE(
      tensor_indices.empty() || tensor_indices.size() == tensors.size(),
      "compute_bucket_assignment_by_size: ",
      tensor_indices.size(),
      " tensor indices for ",
      tensors.size(),
      " tensors.");
  // One open bucket per (dtype, device), in order of first appearance.
  struct Open {
    at::ScalarType dtype;
    c10::Device device;
    std::vector<size_t> indices;
    size_t bytes = 0;
    size_t limit = 0; // index into bucket_size_limits
  };
  std::vector<Open> open;
  std::vector<std::pair<std::vector<size_t>, size_t>> result;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& tensor = tensors[i];
    TORCH_CHECK(!tensor.is_sparse(), "No support for sparse tensors.");
    const size_t index =
        tensor_indices.empty() ? i : static_cast<size_t>(tensor_indices[i]);
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) {
      return o.dtype == tensor.scalar_type() && o.device == tensor.device();
    });
    if (it == open.end()) {
      open.push_back({tensor.scalar_type(), tensor.device(), {}});
      it = open.end() - 1;
    }
    it->indices.push_back(index);
    it->bytes += static_cast<size_t>(tensor.numel()) * tensor.element_size();
    const size_t limit = bucket_size_limits[it->limit];
    if (it->bytes >= limit) {
      result.emplace_back(std::move(it->indices), limit);
      it->indices.clear();
      it->bytes = 0;
      it->limit = std::min(it->limit + 1, bucket_size_limits.size() - 1);
    }
  }
  for (auto& o : open) {
    if (!o.indices.empty()) {
      result.emplace_back(std::move(o.indices), bucket_size_limits[o.limit]);
    }
  }
  if (tensor_indices.empty()) {
    // As PyTorch: the order the tensors are used in (the reverse of the
    // order their gradients become ready).
    std::stable_sort(result.begin(), result.end(), [](auto& a, auto& b) {
      return *std::min_element(a.first.begin(), a.first.end()) <
          *std::min_element(b.first.begin(), b.first.end());
    });
  }
  BucketAssignment assignment;
  for (auto& [indices, limit] : result) {
    assignment.buckets.push_back(std::move(indices));
    assignment.size_limits.push_back(limit);
  }
  return assignment;
}

} // namespace lamp::detail
