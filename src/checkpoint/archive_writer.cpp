#include "archive.h"
#include "zip_writer.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/hash.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <cstdio>
#include <string>

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
    const std::function<void(const void*, size_t)>& write,
    bool force_zip64) {
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
  // The records LibTorch's PyTorchStreamWriter writes for
  // writeArchiveAndTensors, in its order: the tensors' storages (on the
  // CPU: lamp's saves copy device tensors to host memory first), the
  // pickle, then its end-of-file records.
  std::vector<torch::jit::WriteableTensorData> storages;
  std::vector<ZipRecord> records;
  for (const auto& tensor : pickler.tensorData()) {
    storages.push_back(torch::jit::getWriteableTensorData(tensor));
  }
  for (size_t i = 0; i < storages.size(); ++i) {
    records.push_back(
        {"data/" + std::to_string(i),
         storages[i].data(),
         storages[i].sizeInBytes()});
  }
  records.push_back({"data.pkl", pickle.data(), pickle.size()});
  static const std::string kVersion = "3\n"; // kMinProducedFileFormatVersion
  static const std::string kByteOrder = "little";
  records.push_back({"version", kVersion.data(), kVersion.size()});
  records.push_back({"byteorder", kByteOrder.data(), kByteOrder.size()});
  // 40 digits, as LibTorch's: a function of what the file holds (so that
  // the same state makes the same file).
  uint64_t hash = 0;
  uint64_t bytes = 0;
  for (const auto& r : records) {
    hash = c10::hash_combine(hash, c10::get_hash(r.name, r.size));
    bytes += r.size;
  }
  char id[48];
  std::snprintf(
      id,
      sizeof id,
      "%020llu%020llu",
      static_cast<unsigned long long>(hash),
      static_cast<unsigned long long>(bytes));
  const std::string serialization_id(id, 40);
  records.push_back(
      {".data/serialization_id",
       serialization_id.data(),
       serialization_id.size()});
  write_zip(records, write, force_zip64);
}

} // namespace lamp::detail
