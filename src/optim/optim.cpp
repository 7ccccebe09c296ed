#include <lamp/optim.h>

#include <lamp/config.h>

#include "bump_versions.h"
#if LAMP_WITH_CUDA
#include "fused_adam_cuda.h"
#endif
#include "multi_tensor.h"
#include "unique_params.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>
#include <torch/utils.h>

#include <algorithm>
#include <type_traits>

namespace lamp::optim {
namespace {

using torch::optim::OptimizerParamGroup;

void check_fused_param(const torch::Tensor& param, const char* name) {
  TORCH_CHECK(
      param.is_floating_point() && (param.is_cuda() || param.is_cpu()),
      name,
      ": parameters must be floating point on CPU or CUDA, got ",
      param.scalar_type(),
      " on ",
      param.device(),
      ".");
}

// NOTE: a parameter first seen inside a CUDA graph capture gets its state
// from captured kernels (zeros), which every replay would run again: its
// moments would restart from zero at every step. Refuse instead of training
// wrong (also for stateless SGD, whose first step in a capture was seen to
// go wrong too: every parameter must have stepped before the capture).
void check_not_capturing(const torch::Tensor& param, const char* name) {
  TORCH_CHECK(
      !param.is_cuda() || !lamp::detail::capturing(),
      name,
      ": a parameter of shape ",
      param.sizes(),
      " got its first gradient inside a CUDA graph capture, so its "
      "optimizer state would be created by the graph and reset at every "
      "replay. Give every parameter a gradient during the warm-up steps "
      "(GraphedStepOptions::warmup_steps), or leave it out of the "
      "optimizer.");
}

void check_grad(const torch::Tensor& grad, const char* name) {
  TORCH_CHECK(
      !grad.is_sparse(),
      name,
      " does not support sparse gradients; use torch::optim::SparseAdam or "
      "dense gradients.");
}

// Tensors of one parameter group that share a device and a dtype: one fused
// kernel each, as Python's Optimizer._group_tensors_by_device_and_dtype.
struct Bucket {
  c10::Device device;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<torch::Tensor> params{}, grads{}, a{}, b{}, c{}, steps{};
};

Bucket& bucket_for(std::vector<Bucket>& buckets, const torch::Tensor& param) {
  auto it = std::find_if(buckets.begin(), buckets.end(), [&](auto& b) {
    return b.device == param.device() && b.dtype == param.scalar_type();
  });
  if (it != buckets.end()) {
    return *it;
  }
  buckets.push_back({param.device(), param.scalar_type()});
  return buckets.back();
}

std::optional<torch::Tensor> on(
    const std::optional<torch::Tensor>& t,
    c10::Device device) {
  if (!t) {
    return t;
  }
  return lamp::detail::on_device(*t, device);
}

// One Adam/AdamW step over every group, as Python's _fused_adam.
template <typename Options>
void fused_adam_step(
    FusedOptimizer& self,
    bool decoupled_weight_decay,
    const char* name,
    const std::optional<torch::Tensor>& grad_scale,
    const std::optional<torch::Tensor>& found_inf) {
  torch::NoGradGuard no_grad;
  const auto params = lamp::detail::unique_group_params(self, name);
  for (size_t g = 0; g < self.param_groups().size(); ++g) {
    auto& group = self.param_groups()[g];
    auto& options = static_cast<Options&>(group.options());
    std::vector<Bucket> buckets;
    for (const auto& param : params[g]) {
      const auto& grad = param.grad();
      if (!grad.defined()) {
        continue;
      }
      check_grad(grad, name);
      auto& slot = self.state()[param.unsafeGetTensorImpl()];
      if (!slot) {
        check_fused_param(param, name);
        check_not_capturing(param, name);
        auto state = std::make_unique<FusedAdamParamState>();
        state->step(at::zeros({}, param.options().dtype(at::kFloat)));
        state->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
        if (options.amsgrad()) {
          state->max_exp_avg_sq(
              at::zeros_like(param, at::MemoryFormat::Preserve));
        }
        slot = std::move(state);
      }
      auto& state = static_cast<FusedAdamParamState&>(*slot);
      auto& bucket = bucket_for(buckets, param);
      bucket.params.push_back(param);
      bucket.grads.push_back(grad);
      bucket.a.push_back(state.exp_avg());
      bucket.b.push_back(state.exp_avg_sq());
      if (options.amsgrad()) {
        bucket.c.push_back(state.max_exp_avg_sq());
      }
      bucket.steps.push_back(state.step());
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& bucket : buckets) {
      const auto scale = on(grad_scale, bucket.device);
      const auto inf = on(found_inf, bucket.device);
      at::_foreach_add_(bucket.steps, 1);
      // launch_multi_tensor may slice the lists; bucket.steps stays whole.
      auto steps = bucket.steps;
      std::vector<std::vector<torch::Tensor>*> lists{
          &bucket.params, &bucket.grads, &bucket.a, &bucket.b};
      if (options.amsgrad()) {
        lists.push_back(&bucket.c);
      }
      // NOTE: a double lr selects the plain overloads, a tensor the
      // tensor-lr ones (read on the device: graph replays see changes).
      auto run = [&](const auto& lr) {
        if (decoupled_weight_decay) {
          at::_fused_adamw_(
              bucket.params,
              bucket.grads,
              bucket.a,
              bucket.b,
              bucket.c,
              steps,
              lr,
              beta1,
              beta2,
              options.weight_decay(),
              options.eps(),
              options.amsgrad(),
              /*maximize=*/false,
              scale,
              inf);
        } else {
          at::_fused_adam_(
              bucket.params,
              bucket.grads,
              bucket.a,
              bucket.b,
              bucket.c,
              steps,
              lr,
              beta1,
              beta2,
              options.weight_decay(),
              options.eps(),
              options.amsgrad(),
              /*maximize=*/false,
              scale,
              inf);
        }
      };
      const auto lr = self.device_lr(g, bucket.device);
      // NOTE: before launch_multi_tensor, which may slice bucket.params.
      const auto params = bucket.params;
      const auto copies = self.kept_copies(params);
      bool copies_written = false;
#if LAMP_WITH_CUDA
      // fp32 on a GPU: lamp's kernel, ATen's values in one grid (Note [One
      // grid for Adam]), writing the kept weight casts as it goes. NOTE: not
      // Adam (L2 decay) with a device learning rate, the one case where its
      // bits once differed from ATen's (4e-9 in one element, H100, cause not
      // found): ATen's kernel, then the casts.
      if ((decoupled_weight_decay || !lr) &&
          lamp::detail::adam_cuda_applies(
              bucket.params,
              bucket.grads,
              bucket.a,
              bucket.b,
              bucket.steps,
              options.amsgrad(),
              lr,
              scale,
              inf)) {
        lamp::detail::adam_cuda(
            bucket.params,
            copies,
            bucket.grads,
            bucket.a,
            bucket.b,
            bucket.steps,
            lr,
            options.lr(),
            beta1,
            beta2,
            options.weight_decay(),
            options.eps(),
            decoupled_weight_decay,
            scale,
            inf,
            /*store_grads=*/!self.zeroes_grad_in_step());
        copies_written = true;
      } else
#endif
      {
        lamp::detail::launch_multi_tensor(lists, &steps, [&] {
          if (lr) {
            run(*lr);
          } else {
            run(options.lr());
          }
        });
      }
      lamp::detail::bump_versions(params);
      self.finish_kept_copies(params, copies, copies_written);
      if (inf) {
        // A skipped step does not count (Python does the same).
        // NOTE: the one-tensor overload reads a single list: 2 launches
        // for ResNet-50's 161 steps, where a list of found_inf took 3.
        at::_foreach_add_(bucket.steps, *inf, /*alpha=*/-1);
      }
    }
    self.finish_grads(params[g]);
  }
}

template <typename Options>
void check_adam_options(const Options& defaults) {
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(defaults.eps() >= 0, "Invalid epsilon value: ", defaults.eps());
  const auto [beta1, beta2] = defaults.betas();
  TORCH_CHECK(
      0 <= beta1 && beta1 < 1.0, "Invalid beta parameter at index 0: ", beta1);
  TORCH_CHECK(
      0 <= beta2 && beta2 < 1.0, "Invalid beta parameter at index 1: ", beta2);
  TORCH_CHECK(
      defaults.weight_decay() >= 0,
      "Invalid weight_decay value: ",
      defaults.weight_decay());
}

} // namespace

FusedOptimizer::FusedOptimizer(
    const std::vector<OptimizerParamGroup>& param_groups,
    std::unique_ptr<torch::optim::OptimizerOptions> defaults)
    : torch::optim::Optimizer(
          lamp::detail::unique_param_groups(
              param_groups,
              "lamp::optim::FusedOptimizer"),
          std::move(defaults)) {}

void FusedOptimizer::add_param_group(const OptimizerParamGroup& param_group) {
  std::vector<OptimizerParamGroup> all(
      param_groups().begin(), param_groups().end());
  all.push_back(param_group);
  auto unique = lamp::detail::unique_param_groups(
      all, "lamp::optim::FusedOptimizer::add_param_group");
  torch::optim::Optimizer::add_param_group(unique.back());
  update_kept_casts();
}

void FusedOptimizer::sync_device_lr() {
  torch::NoGradGuard no_grad;
  if (device_lr_) {
    // NOTE: a tensor for every group and CUDA device now, before a capture:
    // one made during a capture (a group whose parameters had no gradient
    // in the warm-up) would be filled by a captured kernel, and every
    // replay would reset it to the capture's learning rate.
    const auto& groups = param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      std::optional<c10::Device> last;
      for (const auto& param : groups[g].params()) {
        const auto device = param.device();
        if (device.is_cuda() && device != last) {
          last = device;
          (void)device_lr(g, device);
        }
      }
    }
  }
  for (auto& entry : device_lrs_) {
    const double lr = param_groups()[entry.group].options().get_lr();
    if (lr != entry.value) {
      entry.lr.fill_(lr);
      entry.value = lr;
    }
  }
}

std::optional<torch::Tensor> FusedOptimizer::device_lr(
    size_t group,
    c10::Device device) {
  if (!device_lr_ || !device.is_cuda()) {
    return std::nullopt;
  }
  const double lr = param_groups()[group].options().get_lr();
  for (auto& entry : device_lrs_) {
    if (entry.group == group && entry.device == device) {
      // NOTE: not during capture: the fill would be replayed with the
      // value of the capture. GraphedStep syncs before each replay.
      if (entry.value != lr && !lamp::detail::capturing()) {
        entry.lr.fill_(lr);
        entry.value = lr;
      }
      return entry.lr;
    }
  }
  TORCH_CHECK(
      !lamp::detail::capturing(),
      "lamp::optim::FusedOptimizer: param group ",
      group,
      " needs a device learning rate on ",
      device,
      " for the first time during a CUDA graph capture, where creating it "
      "would bake in the current value. Call sync_device_lr() before the "
      "capture (lamp::GraphedStep does), after adding param groups.");
  device_lrs_.push_back(
      {group,
       device,
       at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(device)),
       lr});
  return device_lrs_.back().lr;
}

void FusedOptimizer::finish_grads(
    const std::vector<torch::Tensor>& params) const {
  if (zero_grad_in_step_) {
    for (const auto& param : params) {
      // NOTE: as zero_grad() would right after the step: the caching
      // allocator hands the memory out again only to work queued behind
      // the step's kernels on the stream (the one backward ran on).
      param.mutable_grad().reset();
    }
  }
}

torch::Tensor FusedOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_scaled(std::nullopt, std::nullopt);
  return loss;
}

void FusedAdamParamState::serialize(
    torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_exp_avg_sq);
}

void FusedAdamParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, max_exp_avg_sq);
}

namespace detail {

template <typename Options>
FusedAdamBase<Options>::FusedAdamBase(
    const std::vector<OptimizerParamGroup>& param_groups,
    Options defaults)
    : FusedOptimizer(param_groups, std::make_unique<Options>(defaults)) {
  check_adam_options(defaults);
}

template <typename Options>
void FusedAdamBase<Options>::step_scaled(
    const std::optional<torch::Tensor>& grad_scale,
    const std::optional<torch::Tensor>& found_inf) {
  constexpr bool kDecoupled =
      std::is_same_v<Options, torch::optim::AdamWOptions>;
  fused_adam_step<Options>(
      *this,
      kDecoupled,
      kDecoupled ? "lamp::optim::FusedAdamW" : "lamp::optim::FusedAdam",
      grad_scale,
      found_inf);
}

template <typename Options>
void FusedAdamBase<Options>::save(
    torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamParamState, Options>(archive, *this);
}

template <typename Options>
void FusedAdamBase<Options>::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedAdamParamState, Options>(archive, *this);
}

template class LAMP_API FusedAdamBase<torch::optim::AdamOptions>;
template class LAMP_API FusedAdamBase<torch::optim::AdamWOptions>;

} // namespace detail

FusedSGD::FusedSGD(
    const std::vector<OptimizerParamGroup>& param_groups,
    torch::optim::SGDOptions defaults)
    : FusedOptimizer(
          param_groups,
          std::make_unique<torch::optim::SGDOptions>(defaults)) {
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(
      defaults.momentum() >= 0,
      "Invalid momentum value: ",
      defaults.momentum());
  TORCH_CHECK(
      defaults.weight_decay() >= 0,
      "Invalid weight_decay value: ",
      defaults.weight_decay());
  TORCH_CHECK(
      !defaults.nesterov() ||
          (defaults.momentum() > 0 && defaults.dampening() == 0),
      "Nesterov momentum requires a momentum and zero dampening");
}

void FusedSGD::step_scaled(
    const std::optional<torch::Tensor>& grad_scale,
    const std::optional<torch::Tensor>& found_inf) {
  const char* name = "lamp::optim::FusedSGD";
  torch::NoGradGuard no_grad;
  const auto params = lamp::detail::unique_group_params(*this, name);
  for (size_t g = 0; g < param_groups().size(); ++g) {
    auto& group = param_groups()[g];
    auto& options = static_cast<torch::optim::SGDOptions&>(group.options());
    const bool momentum = options.momentum() != 0;
    std::vector<Bucket> buckets;
    bool is_first_step = momentum;
    for (const auto& param : params[g]) {
      const auto& grad = param.grad();
      if (!grad.defined()) {
        continue;
      }
      check_grad(grad, name);
      auto& slot = state()[param.unsafeGetTensorImpl()];
      if (!slot) {
        check_fused_param(param, name);
        check_not_capturing(param, name);
        slot = std::make_unique<torch::optim::SGDParamState>();
      }
      auto& state = static_cast<torch::optim::SGDParamState&>(*slot);
      auto& bucket = bucket_for(buckets, param);
      bucket.params.push_back(param);
      bucket.grads.push_back(grad);
      if (momentum) {
        if (state.momentum_buffer().defined()) {
          is_first_step = false;
        } else {
          state.momentum_buffer(at::zeros_like(grad));
        }
        bucket.a.push_back(state.momentum_buffer());
      }
    }
    for (auto& bucket : buckets) {
      std::vector<std::vector<torch::Tensor>*> lists{
          &bucket.params, &bucket.grads};
      if (momentum) {
        lists.push_back(&bucket.a);
      }
      auto run = [&](const auto& lr) {
        at::_fused_sgd_(
            bucket.params,
            bucket.grads,
            bucket.a,
            options.weight_decay(),
            options.momentum(),
            lr,
            options.dampening(),
            options.nesterov(),
            /*maximize=*/false,
            is_first_step,
            on(grad_scale, bucket.device),
            on(found_inf, bucket.device));
      };
      const auto lr = device_lr(g, bucket.device);
      // NOTE: before launch_multi_tensor, which may slice bucket.params.
      const auto copies = kept_copies(bucket.params);
      const auto params = bucket.params;
      lamp::detail::launch_multi_tensor(lists, nullptr, [&] {
        if (lr) {
          run(*lr);
        } else {
          run(options.lr());
        }
      });
      lamp::detail::bump_versions(params);
      finish_kept_copies(params, copies, /*written=*/false);
    }
    finish_grads(params[g]);
  }
}

void FusedSGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::
      serialize<torch::optim::SGDParamState, torch::optim::SGDOptions>(
          archive, *this);
}

void FusedSGD::load(torch::serialize::InputArchive& archive) {
  torch::optim::
      serialize<torch::optim::SGDParamState, torch::optim::SGDOptions>(
          archive, *this);
}

} // namespace lamp::optim
