#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "resnet50_amp/resnet50.h"
#include "support.h"

namespace {

TEST(ResNet50, HasTorchvisionsParameterCount) {
  resnet::ResNet50 model;
  int64_t count = 0;
  for (const auto& p : model->parameters()) {
    count += p.numel();
  }
  EXPECT_EQ(count, 25557032);
}

// Loads the weights torchvision produced into the C++ model and compares
// outputs in eval and train mode.
TEST(ResNet50, MatchesTorchvision) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const std::string path = testing::TempDir() + "resnet50_oracle.pt";
  if (!lamp::test::python_can_import("torchvision")) {
    GTEST_SKIP() << "the Python oracle has no torchvision (pip install "
                    "torchvision==0.26.0)";
  }
  lamp::test::run_python_oracle("resnet50_oracle.py", "\"" + path + "\"");
  std::ifstream file(path, std::ios::binary);
  std::vector<char> bytes(
      (std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  const auto oracle = torch::pickle_load(bytes).toGenericDict();
  const auto state = oracle.at("state").toGenericDict();

  torch::manual_seed(1); // different from Python's: every value must load
  resnet::ResNet50 model;
  EXPECT_EQ(oracle.at("parameters").toInt(), 25557032);
  size_t loaded = 0;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    ASSERT_TRUE(state.contains(item.key())) << item.key();
    item.value().copy_(state.at(item.key()).toTensor());
    ++loaded;
  }
  for (auto& item : model->named_buffers()) {
    ASSERT_TRUE(state.contains(item.key())) << item.key();
    item.value().copy_(state.at(item.key()).toTensor());
    ++loaded;
  }
  EXPECT_EQ(loaded, state.size()) << "torchvision has entries we lack";

  const auto x = oracle.at("input").toTensor();
  for (const char* mode : {"eval", "train"}) {
    model->train(std::string(mode) == "train");
    const auto expected = oracle.at(mode).toTensor();
    const auto out = model->forward(x);
    ASSERT_EQ(out.sizes(), expected.sizes());
    const double rel =
        ((out - expected).abs().max() / expected.abs().max()).item<double>();
    EXPECT_LT(rel, 1e-5) << mode << " mode";
  }
}

} // namespace
