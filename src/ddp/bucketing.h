#pragma once

// Internal: the reducer's pure part, which parameters share a bucket.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <lamp/export.h>

namespace lamp::detail {

/// Buckets of tensor indices, and the size limit (bytes) each was filled
/// against.
struct BucketAssignment {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> size_limits;
};

/// PyTorch's reducer bucketing, `compute_bucket_assignment_by_size` of
/// torch/csrc/distributed/c10d/reducer.cpp (in Python
/// `torch.distributed._compute_bucket_assignment_by_size`), for dense
/// tensors. It walks `tensors` in order keeping one open bucket per (dtype,
/// device); a tensor joins its bucket, which closes once its bytes reach
/// the limit: a (dtype, device)'s first bucket is held to
/// `bucket_size_limits[0]`, its second to `[1]` and so on, the last limit
/// repeating. Buckets still open at the end follow the closed ones.
///
/// With `tensor_indices` empty, bucket entries are positions in `tensors`
/// and the buckets are sorted by their smallest entry. Otherwise
/// `tensors[i]` is named `tensor_indices[i]` (PyTorch's rebuild in
/// gradient-ready order) and the buckets stay in closing order, the open
/// ones in the order their dtype/device first appeared (PyTorch leaves
/// their order to an unordered_map). Reads only dtype, device and size:
/// meta tensors will do. Throws `c10::ValueError` on empty limits or
/// mismatched indices, `c10::Error` on a sparse tensor.
LAMP_API BucketAssignment compute_bucket_assignment_by_size(
    const std::vector<at::Tensor>& tensors,
    const std::vector<size_t>& bucket_size_limits,
    const std::vector<int64_t>& tensor_indices = {});

} // namespace lamp::detail
