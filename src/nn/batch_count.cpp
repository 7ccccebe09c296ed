#include <lamp/nn/batch_count.h>

#include <lamp/nn/batch_norm_act.h>

#include <ATen/ops/_foreach_add.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <vector>

namespace lamp::nn {

struct BatchCountGuard::Impl {
  std::vector<BatchNormAct2dImpl*> modules;
  // calls[i]: training forwards of modules[i] while the guard lives. The
  // modules point into it, so it never grows after they do.
  std::vector<int64_t> calls;
};

BatchCountGuard::BatchCountGuard(torch::nn::Module& model)
    : impl_(std::make_unique<Impl>()) {
  for (const auto& module : model.modules(/*include_self=*/true)) {
    auto* bn = dynamic_cast<BatchNormAct2dImpl*>(module.get());
    // NOTE: a module registered twice is visited twice; one held by
    // another guard stays with it; momentum = None reads the count in its
    // forward, so it keeps adding there.
    if (bn == nullptr || bn->deferred_count_.calls != nullptr ||
        !bn->num_batches_tracked.defined() ||
        !bn->options.momentum().has_value() ||
        std::find(impl_->modules.begin(), impl_->modules.end(), bn) !=
            impl_->modules.end()) {
      continue;
    }
    impl_->modules.push_back(bn);
  }
  impl_->calls.assign(impl_->modules.size(), 0);
  for (size_t i = 0; i < impl_->modules.size(); ++i) {
    impl_->modules[i]->deferred_count_.calls = &impl_->calls[i];
  }
}

BatchCountGuard::~BatchCountGuard() {
  // Tensors by how many forwards they missed: one _foreach_add_ each
  // (usually a single group, every module having run once).
  std::map<int64_t, std::vector<at::Tensor>> by_calls;
  for (size_t i = 0; i < impl_->modules.size(); ++i) {
    auto* bn = impl_->modules[i];
    bn->deferred_count_.calls = nullptr;
    if (impl_->calls[i] > 0) {
      by_calls[impl_->calls[i]].push_back(bn->num_batches_tracked);
    }
  }
  try {
    torch::NoGradGuard no_grad;
    for (auto& [calls, tensors] : by_calls) {
      at::_foreach_add_(tensors, calls);
    }
  } catch (const std::exception& e) {
    // A destructor must not throw; an add that fails here means the device
    // itself failed, which the next operation reports again.
    TORCH_WARN(
        "lamp::nn::BatchCountGuard: num_batches_tracked not updated: ",
        e.what());
  }
}

size_t BatchCountGuard::size() const {
  return impl_->modules.size();
}

} // namespace lamp::nn
