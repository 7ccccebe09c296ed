#include "archive.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <utility>
#include <vector>

namespace lamp::detail {

// NOTE: plain lists and dicts of Any: LibTorch's pickler writes typed
// containers (List[float], List[Tensor], Dict[str, Tensor], ...) through
// `torch.jit._pickle` helpers, which Python's weights-only loader refuses.
c10::IValue plain_copy(
    const c10::IValue& value,
    const std::function<c10::IValue(const at::Tensor&)>& tensor) {
  if (value.isTensor()) {
    return tensor ? tensor(value.toTensor()) : value;
  }
  if (value.isList()) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const auto& item : value.toListRef()) {
      list.push_back(plain_copy(item, tensor));
    }
    return list;
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), c10::AnyType::get());
    for (const auto& entry : dict) {
      out.insert(entry.key(), plain_copy(entry.value(), tensor));
    }
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.toTupleRef().elements()) {
      items.push_back(plain_copy(item, tensor));
    }
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

void write_torch_archive(
    const c10::IValue& value,
    const std::function<void(const void*, size_t)>& write) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) {
        pickle.insert(pickle.end(), data, data + size);
      },
      /*tensor_table=*/nullptr,
      /*type_renamer=*/nullptr,
      /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr,
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(plain_copy(value, nullptr));
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer(
      [&](const void* data, size_t size) -> size_t {
        write(data, size);
        return size;
      });
  torch::jit::writeArchiveAndTensors(
      "data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
}

} // namespace lamp::detail
