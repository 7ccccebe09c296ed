#pragma once

// Internal: how lamp hands tensor lists to ATen's multi-tensor CUDA kernels
// (_fused_adam_, _fused_sgd_, _amp_foreach_non_finite_check_and_unscale_),
// and the scale and found_inf those kernels read, on their device.

#include <lamp/config.h>

#include <ATen/core/Tensor.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

namespace lamp::detail {

/// `t` on `device` for a kernel there (GradScaler's scale, a step's
/// found_inf), copied only when it lives elsewhere: non-blocking, but not
/// into the CPU, whose kernels read the copy at once (a non-blocking copy
/// out of a GPU lands in pinned memory later; under load the CPU unscaled
/// by a stale scale: GradScalerStepGpu, with other tests running).
inline at::Tensor on_device(const at::Tensor& t, c10::Device device) {
  return t.device() == device
      ? t
      : t.to(device, t.scalar_type(), /*non_blocking=*/!device.is_cpu());
}

/// True while the current CUDA stream is capturing a CUDA graph.
inline bool capturing() {
#if LAMP_WITH_CUDA
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() !=
      c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

/// Tensors per launch of ATen's multi-tensor kernels by the number of lists
/// they read (ATen/native/cuda/MultiTensorApply.cuh, depth_to_max_tensors).
inline int64_t max_tensors_per_launch(size_t lists) {
  constexpr int64_t kMax[] = {110, 64, 48, 36, 30};
  return kMax[std::clamp<size_t>(lists, 1, 5) - 1];
}

/// Calls `launch()`, which runs one multi-tensor kernel on the tensors in
/// `lists` (parallel lists: `(*lists[l])[i]` belong together) and, if given,
/// the per-tensor values in `repeat` (Adam's step counts).
///
/// While a CUDA graph is captured it first cuts the large tensors into 1-D
/// slices and calls `launch()` once per group of at most one launch's worth
/// of tensors, each group on its own stream: parallel branches of the graph.
/// The lists then hold the last group's tensors; `repeat` gets each value
/// once per slice.
///
/// NOTE: ATen's multi-tensor kernels give each 65,536-element chunk of a
/// tensor one thread block and take at most 36 tensors per launch (Adam's
/// four lists; 110 for one list). An MLP 784-512-10 has 4 tensors and 0.4 M
/// parameters: its fused Adam ran on 10 of the H200's 132 SMs, 33 us of a
/// 113 us graphed step, the inf check on 10 (13 us). Slices are views (same
/// memory, same arithmetic, same results) but cost host time on every call,
/// so lamp only slices during capture, where that cost is paid once.
/// Tensors whose lists disagree in layout, or that are not dense, stay whole.
template <typename Launch>
void launch_multi_tensor(
    const std::vector<std::vector<at::Tensor>*>& lists,
    std::vector<at::Tensor>* repeat,
    const Launch& launch) {
  // NOTE: is_cuda() first: asking about capture initialises CUDA.
  if (lists.empty() || lists.front()->empty() ||
      !lists.front()->front().is_cuda() || !capturing()) {
    launch();
    return;
  }
#if LAMP_WITH_CUDA
  constexpr int64_t kMinSlice = 4096; // two passes of a 512-thread block
  constexpr int64_t kMaxBranches = 4;
  const auto& first = *lists.front();
  const auto n = static_cast<int64_t>(first.size());
  const int64_t per_launch = max_tensors_per_launch(lists.size());
  const int64_t spare = kMaxBranches * per_launch - n;
  int64_t total = 0;
  for (const auto& t : first) {
    total += t.numel();
  }
  auto sliceable = [&](int64_t i) {
    for (const auto* list : lists) {
      const auto& t = (*list)[i];
      if (!t.defined() || !t.is_non_overlapping_and_dense() ||
          t.sizes() != first[i].sizes() || t.strides() != first[i].strides()) {
        return false;
      }
    }
    return true;
  };
  // NOTE: at most `spare` extra slices in all, shared by size.
  std::vector<int64_t> slice_numel(n, 0); // 0: stays whole
  for (int64_t i = 0; spare > 0 && i < n; ++i) {
    const int64_t numel = first[i].numel();
    const int64_t pieces =
        std::min(1 + spare * numel / total, numel / kMinSlice);
    if (pieces > 1 && sliceable(i)) {
      slice_numel[i] = (numel + pieces - 1) / pieces;
    }
  }
  std::vector<std::vector<at::Tensor>> sliced(lists.size());
  std::vector<at::Tensor> repeated;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t numel = first[i].numel();
    const int64_t size = slice_numel[i] == 0 ? numel : slice_numel[i];
    if (repeat != nullptr) {
      repeated.insert(
          repeated.end(),
          slice_numel[i] == 0 ? 1 : (numel + size - 1) / size,
          (*repeat)[i]);
    }
    for (size_t l = 0; l < lists.size(); ++l) {
      const auto& t = (*lists[l])[i];
      if (slice_numel[i] == 0) {
        sliced[l].push_back(t);
        continue;
      }
      // Same strides in every list: a flat position is the same element.
      const auto flat = t.is_contiguous()
          ? t.view({-1})
          : t.as_strided({t.numel()}, {1}, t.storage_offset());
      for (auto& slice : flat.split(size)) {
        sliced[l].push_back(std::move(slice));
      }
    }
  }
  const auto pieces = static_cast<int64_t>(sliced.front().size());
  const int64_t branches =
      std::min(kMaxBranches, (pieces + per_launch - 1) / per_launch);
  const int64_t per_branch = (pieces + branches - 1) / branches;
  auto run = [&](int64_t b) {
    const int64_t begin = b * per_branch;
    const int64_t end = std::min(pieces, begin + per_branch);
    for (size_t l = 0; l < lists.size(); ++l) {
      lists[l]->assign(sliced[l].begin() + begin, sliced[l].begin() + end);
    }
    if (repeat != nullptr) {
      repeat->assign(repeated.begin() + begin, repeated.begin() + end);
    }
    launch();
  };
  if (branches == 1) {
    run(0);
    return;
  }
  // Fork: branches 1.. on pool streams after the work so far; join after.
  const auto current = c10::cuda::getCurrentCUDAStream();
  c10::cuda::CUDAEvent fork;
  fork.record(current);
  std::vector<c10::cuda::CUDAEvent> joins(branches - 1);
  for (int64_t b = 1; b < branches; ++b) {
    const auto side =
        c10::cuda::getStreamFromPool(false, current.device_index());
    fork.block(side);
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      run(b);
    }
    joins[b - 1].record(side);
  }
  run(0);
  for (auto& join : joins) {
    join.block(current);
  }
#endif
}

} // namespace lamp::detail
