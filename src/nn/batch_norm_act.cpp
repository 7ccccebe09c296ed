#include <lamp/nn/batch_norm_act.h>
#include <lamp/nn/diagnostics.h>

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <atomic>
#include <string>
#include <utility>

#include "../optim/multi_tensor.h"
#include "batch_norm_act_cudnn.h"

namespace lamp::nn {
namespace {

thread_local BatchNormActPath t_last_path = BatchNormActPath::kNone;
thread_local std::string t_last_reason;
std::atomic<int64_t> g_path_counts[3] = {};

void record(BatchNormActPath path, std::string reason) {
  t_last_path = path;
  t_last_reason = std::move(reason);
  g_path_counts[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed);
}

// The checks both the module and the function make, before anything runs.
void check_inputs(
    const char* who,
    const torch::Tensor& input,
    const torch::Tensor& residual,
    int64_t channels,
    bool training) {
  TORCH_CHECK(input.defined(), who, ": the input is undefined");
  TORCH_CHECK(
      input.dim() == 4,
      who,
      ": expected a 4-D (N, C, H, W) input, got a ",
      input.dim(),
      "-D input of sizes ",
      input.sizes());
  TORCH_CHECK(
      input.size(1) == channels,
      who,
      ": expected an input with ",
      channels,
      " channels (dim 1), got one of sizes ",
      input.sizes());
  TORCH_CHECK(
      !residual.defined() || residual.sizes() == input.sizes(),
      who,
      ": the residual must have the input's sizes ",
      input.sizes(),
      ", got ",
      residual.sizes());
  TORCH_CHECK(
      !residual.defined() || residual.device() == input.device(),
      who,
      ": the residual is on ",
      residual.device(),
      ", the input on ",
      input.device());
  // NOTE: torch::nn::functional::batch_norm's check, word for word.
  TORCH_CHECK(
      !training || input.size(0) * input.size(2) * input.size(3) != 1,
      "Expected more than 1 value per channel when training, got input "
      "size ",
      input.sizes());
}

// The unfused ops: what torch::nn::BatchNorm2d, `out += residual` and
// torch::relu compute. NOTE: the add and the ReLU run in place on the batch
// norm's fresh output (its backward does not read it), as ResNet's
// `out += identity` does.
torch::Tensor composite(
    const torch::Tensor& input,
    const torch::Tensor& residual,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    const torch::Tensor& running_mean,
    const torch::Tensor& running_var,
    bool training,
    double momentum,
    double eps,
    bool relu) {
  auto out = torch::batch_norm(
      input,
      weight,
      bias,
      running_mean,
      running_var,
      training,
      momentum,
      eps,
      at::globalContext().userEnabledCuDNN());
  if (residual.defined()) {
    out.add_(residual);
  }
  if (relu) {
    out.relu_();
  }
  return out;
}

} // namespace

namespace detail {

BatchNormActPath batch_norm_act_last_path() {
  return t_last_path;
}

std::string batch_norm_act_fallback_reason() {
  return t_last_reason;
}

int64_t batch_norm_act_path_count(BatchNormActPath path) {
  return g_path_counts[static_cast<int>(path)].load(std::memory_order_relaxed);
}

} // namespace detail

torch::Tensor batch_norm_act(
    const torch::Tensor& input,
    const torch::Tensor& residual,
    const torch::Tensor& weight,
    const torch::Tensor& bias,
    const torch::Tensor& running_mean,
    const torch::Tensor& running_var,
    bool training,
    double momentum,
    double eps,
    bool relu) {
  const char* who = "lamp::nn::batch_norm_act";
  TORCH_CHECK(input.defined(), who, ": the input is undefined");
  check_inputs(
      who, input, residual, input.dim() > 1 ? input.size(1) : -1, training);
  const int64_t channels = input.size(1);
  const std::pair<const char*, const torch::Tensor*> per_channel[] = {
      {"weight", &weight},
      {"bias", &bias},
      {"running_mean", &running_mean},
      {"running_var", &running_var}};
  for (const auto& [name, t] : per_channel) {
    TORCH_CHECK(
        !t->defined() || t->numel() == channels,
        who,
        ": ",
        name,
        " has ",
        t->numel(),
        " elements but the input has ",
        channels,
        " channels (sizes ",
        input.sizes(),
        ")");
  }
  TORCH_CHECK(
      training || (running_mean.defined() && running_var.defined()),
      who,
      ": running_mean and running_var must be defined in evaluation mode "
      "(training = false)");
  TORCH_CHECK(
      running_mean.defined() == running_var.defined(),
      who,
      ": give both running_mean and running_var, or neither");
  if (training) {
    std::string why;
    if (auto out = detail::cudnn_batch_norm_act(
            input,
            residual,
            weight,
            bias,
            running_mean,
            running_var,
            momentum,
            eps,
            relu,
            why)) {
      record(BatchNormActPath::kCudnnFused, "");
      return *out;
    }
    record(BatchNormActPath::kComposite, std::move(why));
  } else {
    // NOTE: cuDNN's inference kernel has no fused add and ReLU; ATen's
    // batch norm (cuDNN's for fp16 NHWC) with the add and the ReLU in place
    // is three passes, as a fused kernel from lamp would be.
    record(
        BatchNormActPath::kComposite,
        "evaluation mode: normalizes with the running statistics (unfused)");
  }
  return composite(
      input,
      residual,
      weight,
      bias,
      running_mean,
      running_var,
      training,
      momentum,
      eps,
      relu);
}

BatchNormAct2dOptions::BatchNormAct2dOptions(int64_t num_features)
    : num_features_(num_features) {}

BatchNormAct2dImpl::BatchNormAct2dImpl(BatchNormAct2dOptions options)
    : options(std::move(options)) {
  BatchNormAct2dImpl::reset();
}

void BatchNormAct2dImpl::reset() {
  TORCH_CHECK_VALUE(
      options.num_features() > 0,
      "lamp::nn::BatchNormAct2d: num_features must be positive, got ",
      options.num_features());
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({c}));
    bias = register_parameter("bias", torch::empty({c}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), false);
    bias = register_parameter("bias", torch::Tensor(), false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer(
        "num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked =
        register_buffer("num_batches_tracked", torch::Tensor());
  }
  reset_parameters();
}

void BatchNormAct2dImpl::reset_running_stats() {
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
}

void BatchNormAct2dImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::nn::init::ones_(weight);
    torch::nn::init::zeros_(bias);
  }
}

double BatchNormAct2dImpl::count_call(const char* who) {
  // As torch::nn::BatchNorm2d: count the call, and with momentum = None
  // weigh this batch by 1 / num_batches_tracked.
  double momentum = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() &&
      num_batches_tracked.defined()) {
    TORCH_CHECK(
        options.momentum().has_value() || !num_batches_tracked.is_cuda() ||
            !lamp::detail::capturing(),
        who,
        ": momentum = None (a cumulative average) reads num_batches_tracked "
        "on the host every training step, which a CUDA graph cannot "
        "capture; give a momentum (BatchNormAct2dOptions::momentum)");
    if (deferred_count_.calls != nullptr && options.momentum().has_value()) {
      ++*deferred_count_.calls; // lamp::nn::BatchCountGuard adds it later
    } else {
      torch::NoGradGuard no_grad;
      num_batches_tracked.add_(1);
    }
    if (!options.momentum().has_value()) {
      momentum = 1.0 / num_batches_tracked.item<double>();
    }
  }
  return momentum;
}

torch::Tensor BatchNormAct2dImpl::forward(
    const torch::Tensor& input,
    const torch::Tensor& residual) {
  const std::string who =
      c10::str("lamp::nn::BatchNormAct2d(", options.num_features(), ")");
  const bool training = is_training() || !options.track_running_stats();
  check_inputs(who.c_str(), input, residual, options.num_features(), training);
  const double momentum = count_call(who.c_str());
  return batch_norm_act(
      input,
      residual,
      weight,
      bias,
      running_mean,
      running_var,
      training,
      momentum,
      options.eps(),
      options.relu());
}

void BatchNormAct2dImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "lamp::nn::BatchNormAct2d("
         << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats()
         << ", relu=" << options.relu() << ")";
}

} // namespace lamp::nn
