#include <lamp/activation_checkpoint.h>

#include <lamp/autocast.h>
#include <lamp/fp8.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "../nn/fp8_scope.h"
#include "checkpoint_stash.h"
#include "rng_state.h"

namespace lamp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The autocast state of one device type, as the forward call saw it.
struct AutocastState {
  c10::DeviceType device_type;
  bool enabled;
  c10::ScalarType dtype;

  static AutocastState of(c10::DeviceType type) {
    return {
        type,
        at::autocast::is_autocast_enabled(type),
        at::autocast::get_autocast_dtype(type)};
  }
};

// What the backward pass needs besides the saved inputs: the function, and
// the state the forward call ran in.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointFunction fn;
  CheckpointOptions options;
  // Which of the caller's inputs were defined (undefined ones do not reach
  // the autograd Function; they reach `fn` undefined again).
  std::vector<bool> defined;
  std::optional<autograd::RngState> rng;
  AutocastState cuda_autocast{}, cpu_autocast{};
  bool autocast_cache = true;
  // The FP8 scope (lamp/fp8.h) of the forward call.
  bool fp8 = false;
  Fp8Recipe fp8_recipe;
  // CheckpointOptions::keep_attention's tensors.
  detail::CheckpointStash stash;

  detail::CheckpointStash* stash_if_kept() {
    return options.keep_attention() ? &stash : nullptr;
  }

  // The caller's input list from the defined inputs.
  std::vector<torch::Tensor> full(const variable_list& inputs) const {
    std::vector<torch::Tensor> out;
    out.reserve(defined.size());
    size_t k = 0;
    for (const bool d : defined) {
      out.push_back(d ? inputs[k++] : torch::Tensor());
    }
    return out;
  }
};

// The CUDA devices of `inputs`, each once: the generators to replay.
std::vector<c10::Device> cuda_devices_of(const variable_list& inputs) {
  std::vector<c10::Device> devices;
  for (const auto& x : inputs) {
    if (x.is_cuda() &&
        std::find(devices.begin(), devices.end(), x.device()) ==
            devices.end()) {
      devices.push_back(x.device());
    }
  }
  return devices;
}

struct CheckpointNode : torch::autograd::Function<CheckpointNode> {
  static variable_list forward(
      AutogradContext* ctx,
      c10::intrusive_ptr<CheckpointState> state,
      at::TensorList input_list) {
    const variable_list inputs = input_list.vec();
    if (state->options.preserve_rng_state()) {
      state->rng = autograd::RngState::take(cuda_devices_of(inputs));
    }
    state->cuda_autocast = AutocastState::of(c10::kCUDA);
    state->cpu_autocast = AutocastState::of(c10::kCPU);
    state->autocast_cache = at::autocast::is_autocast_cache_enabled();
    state->fp8 = Fp8AutocastGuard::is_enabled();
    state->fp8_recipe = Fp8AutocastGuard::recipe();
    ctx->save_for_backward(inputs);
    std::vector<torch::Tensor> outputs;
    {
      const detail::StashScope kept(state->stash_if_kept());
      outputs = state->fn(state->full(inputs));
    }
    for (const auto& y : outputs) {
      TORCH_CHECK_VALUE(
          y.defined(),
          "lamp::checkpoint: fn returned an undefined tensor; return only "
          "defined tensors");
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return outputs;
  }

  static variable_list backward(
      AutogradContext* ctx,
      variable_list grad_outputs) {
    TORCH_CHECK(
        torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
        "lamp::checkpoint: the backward pass was started with "
        "torch::autograd::grad() (or backward() with `inputs`), but a "
        "checkpoint's recompute accumulates into .grad(), which that call "
        "does not read; call backward() without `inputs`");
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data["state"].toCapsule());
    // Read before the recompute's own backward pass, a graph task of its own.
    const bool keep_graph =
        torch::autograd::get_current_graph_task_keep_graph();
    const auto saved = ctx->get_saved_variables();
    variable_list inputs;
    inputs.reserve(saved.size());
    for (const auto& x : saved) {
      inputs.push_back(x.detach().requires_grad_(x.requires_grad()));
    }

    variable_list outputs;
    {
      // The forward call's random numbers, autocast state and FP8 scope,
      // for this recompute only (the generators move on from where they were).
      std::optional<autograd::RngState> after;
      if (state->rng) {
        after = state->rng->swap_in();
      }
      try {
        AutocastGuard cuda(
            c10::kCUDA,
            state->cuda_autocast.dtype,
            state->cuda_autocast.enabled,
            state->autocast_cache);
        AutocastGuard cpu(
            c10::kCPU,
            state->cpu_autocast.dtype,
            state->cpu_autocast.enabled,
            state->autocast_cache);
        Fp8AutocastGuard fp8(state->fp8_recipe, state->fp8);
        // NOTE: delayed FP8 scales were updated by the forward call; the
        // recompute uses them as they are (fp8_linear.cpp).
        bool& recomputing = nn::detail::fp8_recomputing();
        const bool was_recomputing = recomputing;
        recomputing = true;
        try {
          torch::AutoGradMode grad(true);
          state->stash.next = 0; // a second backward reads them again
          const detail::StashScope kept(state->stash_if_kept());
          outputs = state->fn(state->full(inputs));
        } catch (...) {
          recomputing = was_recomputing;
          throw;
        }
        recomputing = was_recomputing;
      } catch (...) {
        if (after) {
          after->restore();
        }
        throw;
      }
      if (after) {
        after->restore();
      }
    }

    TORCH_CHECK(
        outputs.size() == grad_outputs.size(),
        "lamp::checkpoint: fn returned ",
        outputs.size(),
        " tensors in the recompute and ",
        grad_outputs.size(),
        " in the forward call; fn must compute the same thing both times");
    variable_list with_grad, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        with_grad.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!with_grad.empty()) {
      torch::autograd::backward(with_grad, grads);
    }
    if (!keep_graph) {
      state->stash.kept.clear(); // as the saved inputs are freed
    }

    variable_list result;
    result.reserve(inputs.size() + 1);
    result.emplace_back(); // the state
    for (const auto& x : inputs) {
      result.push_back(x.requires_grad() ? x.grad() : torch::Tensor());
    }
    return result;
  }
};

} // namespace

std::vector<torch::Tensor> checkpoint(
    const CheckpointFunction& fn,
    const std::vector<torch::Tensor>& inputs,
    CheckpointOptions options) {
  TORCH_CHECK_VALUE(fn, "lamp::checkpoint: fn is empty");
  if (!torch::GradMode::is_enabled()) {
    return fn(inputs); // nothing to recompute
  }
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  variable_list defined;
  bool any_requires_grad = false;
  for (const auto& x : inputs) {
    state->defined.push_back(x.defined());
    if (x.defined()) {
      defined.push_back(x);
      any_requires_grad = any_requires_grad || x.requires_grad();
    }
  }
  TORCH_CHECK_VALUE(
      any_requires_grad,
      "lamp::checkpoint: none of the ",
      inputs.size(),
      " inputs requires grad, so the backward pass would never reach the "
      "checkpoint and the parameters inside fn would get no gradient; pass "
      "an input that requires grad (e.g. the block's input activations), or "
      "call fn without lamp::checkpoint");
  // NOTE: as a TensorList: autograd::Function::apply takes the tensors of an
  // ArrayRef as inputs, but a std::vector as one opaque argument.
  return CheckpointNode::apply(std::move(state), at::TensorList(defined));
}

namespace detail {

CheckpointStash*& checkpoint_stash() {
  thread_local CheckpointStash* stash = nullptr;
  return stash;
}

} // namespace detail

bool is_recomputing() {
  return nn::detail::fp8_recomputing();
}

torch::Tensor checkpoint(
    const std::function<torch::Tensor(const torch::Tensor&)>& fn,
    const torch::Tensor& input,
    CheckpointOptions options) {
  TORCH_CHECK_VALUE(fn, "lamp::checkpoint: fn is empty");
  return checkpoint(
      [fn](const std::vector<torch::Tensor>& in) {
        return std::vector<torch::Tensor>{fn(in[0])};
      },
      {input},
      options)[0];
}

} // namespace lamp
