#include "module_check.h"

#include <lamp/dist/process_group.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace lamp::detail {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
  }
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) {
    text += line + "\n";
  }
  return text;
}

} // namespace

void check_on_device(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& tensors,
    const char* kind,
    c10::Device device) {
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = tensors[k];
    TORCH_CHECK(
        t.device() == device && t.layout() == at::kStrided,
        "lamp::DistributedDataParallel: ",
        kind,
        " '",
        names[k],
        "' is a ",
        t.layout(),
        " tensor on ",
        t.device(),
        " but this rank's device is ",
        device,
        "; call module->to(pg->device()) before wrapping it (dense tensors "
        "only).");
  }
}

std::vector<std::string> describe_tensors(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& tensors,
    const char* kind) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::ostringstream line;
    line << kind << " '" << names[i] << "' "
         << c10::toString(tensors[i].scalar_type()) << tensors[i].sizes()
         << " strides " << tensors[i].strides();
    lines.push_back(line.str());
  }
  return lines;
}

void check_same_module(
    const std::vector<std::string>& mine,
    dist::ProcessGroup& pg) {
  const auto all = pg.allgather(join(mine));
  const auto reference = split(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const auto other = split(all[r]);
    for (size_t i = 0; i < std::max(other.size(), reference.size()); ++i) {
      const std::string theirs =
          i < other.size() ? other[i] : std::string("nothing");
      const std::string ours =
          i < reference.size() ? reference[i] : std::string("nothing");
      TORCH_CHECK(
          theirs == ours,
          "lamp::DistributedDataParallel: the ranks' modules differ: at "
          "parameter/buffer #",
          i,
          " rank ",
          r,
          " has ",
          theirs,
          " but rank 0 has ",
          ours,
          ". Every rank must build the same model (same layers, shapes, "
          "dtypes and memory format) and move it to its device before "
          "wrapping it.");
    }
  }
}

} // namespace lamp::detail
