#include <lamp/ddp.h>

#include "module_check.h"
#include "reducer.h"

#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <unordered_set>

namespace lamp {

struct DistributedDataParallel::Impl {
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<dist::ProcessGroup> pg;
  DDPOptions options;
  std::vector<torch::Tensor> buffers;
  std::unique_ptr<detail::Reducer> reducer; // null in a world of one
  bool require_sync = true;

  void set_require_sync(bool value) {
    require_sync = value;
    if (reducer) {
      reducer->set_require_sync(value);
    }
  }
};

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<torch::nn::Module> module,
    std::shared_ptr<dist::ProcessGroup> process_group,
    DDPOptions options) {
  TORCH_CHECK_VALUE(
      module, "lamp::DistributedDataParallel: the module is null.");
  TORCH_CHECK_VALUE(
      process_group,
      "lamp::DistributedDataParallel: the process group is null; pass "
      "lamp::dist::init_process_group().");
  TORCH_CHECK_VALUE(
      options.bucket_cap_mb() > 0 && options.first_bucket_cap_mb() > 0,
      "lamp::DDPOptions: bucket_cap_mb and first_bucket_cap_mb must be > 0, "
      "got ",
      options.bucket_cap_mb(),
      " and ",
      options.first_bucket_cap_mb(),
      ".");
  const auto comm_dtype = options.comm_dtype();
  TORCH_CHECK_VALUE(
      !comm_dtype || at::isFloatingType(*comm_dtype),
      "lamp::DDPOptions::comm_dtype must be a floating-point dtype (e.g. "
      "torch::kHalf or torch::kBFloat16), got ",
      *comm_dtype,
      ".");
  impl_ = std::make_shared<Impl>();
  auto& impl = *impl_;
  impl.module = std::move(module);
  impl.pg = std::move(process_group);
  impl.options = std::move(options);
  // NOTE: each tensor once, under its first name, as Python's
  // named_parameters() (remove_duplicate=True): LibTorch lists a weight
  // shared by two modules once per name, and the reducer would wait for a
  // second gradient of it that never comes.
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& item : impl.module->named_parameters()) {
    if (item.value().requires_grad() &&
        seen.insert(item.value().unsafeGetTensorImpl()).second) {
      names.push_back(item.key());
      params.push_back(item.value());
    }
  }
  std::vector<std::string> buffer_names;
  for (const auto& item : impl.module->named_buffers()) {
    if (item.value().defined() &&
        seen.insert(item.value().unsafeGetTensorImpl()).second) {
      buffer_names.push_back(item.key());
      impl.buffers.push_back(item.value());
    }
  }
  auto& pg = *impl.pg;
  if (pg.world_size() == 1) {
    return; // nothing to average, nothing to broadcast
  }
  TORCH_CHECK(
      pg.has_communicator(),
      "lamp::DistributedDataParallel: the process group of ",
      pg.world_size(),
      " ranks has no communicator (ProcessGroupOptions::nccl(false)); DDP "
      "needs one.");
  pg.check(); // an aborted group throws its error
  detail::check_on_device(names, params, "parameter", pg.device());
  detail::check_on_device(buffer_names, impl.buffers, "buffer", pg.device());
  auto lines = detail::describe_tensors(names, params, "parameter");
  const auto buffer_lines =
      detail::describe_tensors(buffer_names, impl.buffers, "buffer");
  lines.insert(lines.end(), buffer_lines.begin(), buffer_lines.end());
  detail::check_same_module(lines, pg);
  impl.reducer = std::make_unique<detail::Reducer>(
      std::move(names), std::move(params), impl.buffers, impl.pg, impl.options);
}

DistributedDataParallel::~DistributedDataParallel() = default;
DistributedDataParallel::DistributedDataParallel(
    DistributedDataParallel&&) noexcept = default;
DistributedDataParallel& DistributedDataParallel::operator=(
    DistributedDataParallel&&) noexcept = default;

DistributedDataParallel::Impl& DistributedDataParallel::impl() const {
  TORCH_CHECK(
      impl_,
      "lamp::DistributedDataParallel: this object was moved from; use the "
      "one it was moved to.");
  return *impl_;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : impl_(ddp.impl_) {
  auto& impl = ddp.impl();
  TORCH_CHECK(
      impl.require_sync,
      "lamp::DistributedDataParallel::no_sync(): already inside no_sync(); "
      "it does not nest.");
  impl.set_require_sync(false);
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  if (const auto impl = impl_.lock()) {
    impl->set_require_sync(true);
  }
}

void DistributedDataParallel::sync_buffers() {
  auto& impl = this->impl();
  if (impl.pg->world_size() == 1 || impl.buffers.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  impl.pg->broadcast(impl.buffers, 0);
}

const std::shared_ptr<torch::nn::Module>& DistributedDataParallel::module()
    const {
  return impl().module;
}

const std::shared_ptr<dist::ProcessGroup>& DistributedDataParallel::
    process_group() const {
  return impl().pg;
}

const DDPOptions& DistributedDataParallel::options() const {
  return impl().options;
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_indices()
    const {
  const auto& impl = this->impl();
  return impl.reducer ? impl.reducer->bucket_indices()
                      : std::vector<std::vector<size_t>>{};
}

} // namespace lamp
