#include <lamp/state_dict.h>

#include <c10/util/Exception.h>

namespace lamp {

StateDict new_state_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

StateDict to_state_dict(const c10::impl::GenericDict& dict) {
  auto out = new_state_dict();
  for (const auto& entry : dict) {
    TORCH_CHECK(
        entry.key().isString(),
        "a state dict key is not a string: ",
        entry.key());
    out.insert(entry.key().toStringRef(), entry.value());
  }
  return out;
}

} // namespace lamp
