#include <lamp/clip_grad.h>

#include "fused_clip_grad.h"
#include "multi_tensor.h"
#include "python_repr.h"
#include "unique_params.h"

#include <ATen/native/ForeachUtils.h>
#include <ATen/ops/_foreach_clamp_max.h>
#include <ATen/ops/_foreach_clamp_min.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

// Note [Clipping as Python clips]
// Every function here issues the ATen ops that torch/nn/utils/clip_grad.py
// issues, in the same order and on the same tensors, so that CPU results
// are bitwise Python's and CUDA results are those of Python on CUDA:
// - the tensors are grouped by device and dtype by the very function
//   Python calls (at::native::_group_tensors_by_first_tensors_device_and_
//   dtype). Its groups come out in std::unordered_map order, not in the
//   order first seen, and that order decides the order of the norms that
//   are stacked and reduced again, hence the last bit of the total norm;
// - Python's `max_norm / (total_norm + 1e-6)` is Tensor.__rtruediv__,
//   which is `reciprocal() * max_norm`, not a division;
// - scalars are passed as doubles, as Python passes its floats.
// Departures:
// - a tensor listed more than once (a weight shared by two modules, which
//   LibTorch's parameters() lists once per name) counts and is scaled once,
//   as it is in Python, whose parameters() lists it once;
// - during CUDA graph capture, the in-place foreach ops (the clip's
//   multiplication and clamps) get their tensors in slices through
//   detail::launch_multi_tensor. Same elements, same arithmetic, same
//   results; never the norms, whose sums slicing would reorder;
// - clip_grad_norm_ with foreach left to lamp (nullopt), norm_type 2 and no
//   error_if_nonfinite, on CUDA gradients that detail::fused_clip_grad_norm_
//   takes, runs in two kernels instead of seven or eight (the norm's sums
//   of squares in another order: Python's result within fp32 rounding, not
//   bitwise). In a graphed step each kernel costs its launch; Python picks
//   its fastest implementation for foreach=None too. foreach=true gives
//   Python's kernels, bit for bit. Right after GradScaler's unscale of the
//   same gradients the first kernel's sums are already there (Note [Sums
//   kept from the unscale] in fused_clip_grad.cpp): one kernel.

namespace lamp {
namespace {

struct Group {
  c10::Device device;
  std::vector<torch::Tensor> tensors;
};

// Python's _group_tensors_by_device_and_dtype([tensors]).items(), in its
// order. See Note [Clipping as Python clips]. `tensors` must not be empty.
std::vector<Group> group_by_device_and_dtype(
    const std::vector<torch::Tensor>& tensors) {
  const at::native::nested_optional_tensorvec_t nested{
      {tensors.begin(), tensors.end()}};
  auto grouped = at::native::_group_tensors_by_first_tensors_device_and_dtype(
      nested, /*with_indices=*/false);
  std::vector<Group> groups;
  groups.reserve(grouped.size());
  for (auto& [key, value] : grouped) {
    Group group{key.first, {}};
    group.tensors.reserve(value.first[0].size());
    for (auto& t : value.first[0]) {
      group.tensors.push_back(std::move(*t));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

// Python's `(foreach is None and _has_foreach_support(tensors, device)) or
// (foreach and _device_has_foreach_support(device))`, throwing where Python
// throws. C++ has no tensor subclasses, so only the device decides.
bool use_foreach(std::optional<bool> foreach, c10::Device device) {
  const auto type = device.type();
  const bool supported = type == c10::DeviceType::CUDA ||
      type == c10::DeviceType::XPU || type == c10::DeviceType::MTIA ||
      type == c10::DeviceType::PrivateUse1 || type == c10::DeviceType::CPU;
  TORCH_CHECK(
      supported || !foreach.value_or(false),
      "foreach=True was passed, but can't use the foreach API on ",
      c10::DeviceTypeName(type, /*lower_case=*/true),
      " tensors");
  return supported && foreach.value_or(true);
}

// Python's torch.stack(norms). NOTE: CUDA's _foreach_norm returns the
// elements of one 1-D buffer; when `norms` are exactly those, in order,
// that buffer holds what stack() would copy: it is reduced directly (same
// values in the same order, so the same result) and a kernel is saved,
// which counts in a graphed step of a few dozen kernels.
torch::Tensor stacked(const std::vector<torch::Tensor>& norms) {
  const auto& first = norms.front();
  bool one_buffer = first.dim() == 0;
  for (size_t i = 0; one_buffer && i < norms.size(); ++i) {
    one_buffer = norms[i].dim() == 0 && norms[i].is_alias_of(first) &&
        norms[i].scalar_type() == first.scalar_type() &&
        norms[i].storage_offset() ==
            first.storage_offset() + static_cast<int64_t>(i);
  }
  if (!one_buffer) {
    return at::stack(norms);
  }
  return first.as_strided(
      {static_cast<int64_t>(norms.size())}, {1}, first.storage_offset());
}

// The gradients of `parameters`, each tensor once: a weight shared by two
// modules, which LibTorch's parameters() lists twice, is counted and scaled
// once (Python's parameters() lists it once).
std::vector<torch::Tensor> grads_of(
    const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  grads.reserve(parameters.size());
  for (const auto& p : detail::unique_tensors(parameters)) {
    if (p.grad().defined()) {
      grads.push_back(p.grad());
    }
  }
  return grads;
}

} // namespace

torch::Tensor get_total_norm(
    const std::vector<torch::Tensor>& tensors,
    double norm_type,
    bool error_if_nonfinite,
    std::optional<bool> foreach) {
  torch::NoGradGuard no_grad;
  if (tensors.empty()) {
    // Python's torch.tensor(0.0).
    return at::scalar_tensor(
        0.0, at::TensorOptions().dtype(c10::get_default_dtype()));
  }
  const auto first_device = tensors[0].device();
  const c10::Scalar ord(norm_type);
  std::vector<torch::Tensor> norms;
  norms.reserve(tensors.size());
  // A tensor listed twice is counted once.
  for (auto& [device, group] :
       group_by_device_and_dtype(detail::unique_tensors(tensors))) {
    if (use_foreach(foreach, device)) {
      for (auto& norm : at::_foreach_norm(group, ord)) {
        norms.push_back(std::move(norm));
      }
    } else {
      for (const auto& t : group) {
        norms.push_back(at::linalg_vector_norm(t, ord));
      }
    }
  }
  for (auto& norm : norms) {
    norm = norm.to(first_device);
  }
  auto total_norm = at::linalg_vector_norm(stacked(norms), ord);

  // NOTE: Python's `if error_if_nonfinite and torch.logical_or(...)`: the
  // bool() of a tensor, a host sync, only when asked for.
  TORCH_CHECK(
      !error_if_nonfinite ||
          !at::logical_or(total_norm.isnan(), total_norm.isinf()).item<bool>(),
      "The total norm of order ",
      detail::python_repr(norm_type),
      " for gradients from `parameters` is non-finite, so it cannot be "
      "clipped. To disable this error and scale the gradients by the "
      "non-finite norm anyway, set `error_if_nonfinite=False`");
  return total_norm;
}

torch::Tensor get_total_norm(
    const torch::Tensor& tensor,
    double norm_type,
    bool error_if_nonfinite,
    std::optional<bool> foreach) {
  return get_total_norm(
      std::vector<torch::Tensor>{tensor},
      norm_type,
      error_if_nonfinite,
      foreach);
}

void clip_grads_with_norm_(
    const std::vector<torch::Tensor>& parameters,
    double max_norm,
    const torch::Tensor& total_norm,
    std::optional<bool> foreach) {
  torch::NoGradGuard no_grad;
  const auto grads = grads_of(parameters);
  if (grads.empty()) {
    return;
  }
  // Python's max_norm / (total_norm + 1e-6), i.e. Tensor.__rtruediv__.
  // NOTE: always multiplied, also by 1: `if clip_coef < 1` would need the
  // coefficient on the host.
  const auto clip_coef = (total_norm + 1e-6).reciprocal() * max_norm;
  const auto clip_coef_clamped = at::clamp(clip_coef, std::nullopt, 1.0);
  for (auto& [device, group] : group_by_device_and_dtype(grads)) {
    const auto coef = clip_coef_clamped.to(device);
    if (use_foreach(foreach, device)) {
      detail::launch_multi_tensor(
          {&group}, nullptr, [&] { at::_foreach_mul_(group, coef); });
    } else {
      for (auto& g : group) {
        g.mul_(coef);
      }
    }
  }
}

void clip_grads_with_norm_(
    const torch::Tensor& parameter,
    double max_norm,
    const torch::Tensor& total_norm,
    std::optional<bool> foreach) {
  clip_grads_with_norm_(
      std::vector<torch::Tensor>{parameter}, max_norm, total_norm, foreach);
}

torch::Tensor clip_grad_norm_(
    const std::vector<torch::Tensor>& parameters,
    double max_norm,
    double norm_type,
    bool error_if_nonfinite,
    std::optional<bool> foreach) {
  // See Note [Clipping as Python clips] for this departure.
  if (!foreach.has_value() && norm_type == 2.0 && !error_if_nonfinite) {
    torch::NoGradGuard no_grad;
    if (auto norm =
            detail::fused_clip_grad_norm_(grads_of(parameters), max_norm)) {
      return *norm;
    }
  }
  auto total_norm = get_total_norm(
      grads_of(parameters), norm_type, error_if_nonfinite, foreach);
  clip_grads_with_norm_(parameters, max_norm, total_norm, foreach);
  return total_norm;
}

torch::Tensor clip_grad_norm_(
    const torch::Tensor& parameter,
    double max_norm,
    double norm_type,
    bool error_if_nonfinite,
    std::optional<bool> foreach) {
  return clip_grad_norm_(
      std::vector<torch::Tensor>{parameter},
      max_norm,
      norm_type,
      error_if_nonfinite,
      foreach);
}

void clip_grad_value_(
    const std::vector<torch::Tensor>& parameters,
    double clip_value,
    std::optional<bool> foreach) {
  torch::NoGradGuard no_grad;
  const auto grads = grads_of(parameters);
  if (grads.empty()) {
    return; // NOTE: Python fails here in its grouping function.
  }
  for (auto& [device, group] : group_by_device_and_dtype(grads)) {
    if (use_foreach(foreach, device)) {
      detail::launch_multi_tensor({&group}, nullptr, [&] {
        at::_foreach_clamp_min_(group, -clip_value);
        at::_foreach_clamp_max_(group, clip_value);
      });
    } else {
      for (auto& g : group) {
        g.clamp_(-clip_value, clip_value);
      }
    }
  }
}

void clip_grad_value_(
    const torch::Tensor& parameter,
    double clip_value,
    std::optional<bool> foreach) {
  clip_grad_value_(std::vector<torch::Tensor>{parameter}, clip_value, foreach);
}

} // namespace lamp
