// lamp::nn::linear and lamp::nn::Linear: Python's F.linear op for op
// (bitwise on the CPU in fp32, bf16 and fp16, inputs of rank 2 to 4, with
// and without bias, under autocast), Python's parameter names, shapes and
// initialisation, and torch::nn::Linear's state dict.

#include <lamp/autocast.h>
#include <lamp/nn/linear.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD).
namespace linear_test {

namespace {

using lamp::test::hex_bits;
torch::Dtype dtype_of(const std::string& name) {
  return name == "f32" ? torch::kFloat
      : name == "bf16" ? torch::kBFloat16
                       : torch::kHalf;
}

std::vector<int64_t> shape_of(int rank) {
  if (rank == 2) {
    return {3, 5};
  }
  return rank == 3 ? std::vector<int64_t>{2, 3, 5}
                   : std::vector<int64_t>{2, 2, 3, 5};
}

// linear_oracle.py's case, computed by lamp: {"y": bits, "gx": ...}.
std::map<std::string, std::string> lamp_case(const std::string& c) {
  std::vector<std::string> parts;
  std::stringstream in(c);
  for (std::string part; std::getline(in, part, ':');) {
    parts.push_back(part);
  }
  const auto dtype = dtype_of(parts[0]);
  const int rank = std::stoi(parts[1]);
  const bool bias = parts[2] == "1";
  const bool autocast = parts.size() > 3 && parts[3] == "autocast";
  torch::manual_seed(0);
  auto x = torch::randn(shape_of(rank));
  auto w = torch::randn({7, 5});
  auto b = torch::randn({7});
  auto out_shape = shape_of(rank);
  out_shape.back() = 7;
  auto g = torch::randn(out_shape);
  if (!autocast) {
    x = x.to(dtype);
    w = w.to(dtype);
    b = b.to(dtype);
    g = g.to(dtype);
  }
  x.requires_grad_();
  w.requires_grad_();
  b.requires_grad_();
  torch::Tensor y;
  {
    lamp::AutocastGuard guard(torch::kCPU, torch::kBFloat16, autocast);
    y = lamp::nn::linear(x, w, bias ? b : torch::Tensor());
  }
  y.backward(g.to(y.scalar_type()));
  std::map<std::string, std::string> out{
      {"y", hex_bits(y)},
      {"gx", hex_bits(x.grad())},
      {"gw", hex_bits(w.grad())}};
  if (bias) {
    out["gb"] = hex_bits(b.grad());
  }
  return out;
}

TEST(Linear, EqualsPythonsOpForOpInEveryDtypeAndRank) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  std::vector<std::string> cases;
  for (const std::string dtype : {"f32", "bf16", "f16"}) {
    for (const std::string rank : {"2", "3", "4"}) {
      for (const std::string bias : {"0", "1"}) {
        cases.push_back(dtype + ":" + rank + ":" + bias);
      }
    }
  }
  cases.push_back("f32:3:1:autocast");
  cases.push_back("f32:2:1:autocast");
  std::string args;
  for (const auto& c : cases) {
    args += " " + c;
  }
  std::map<std::string, std::map<std::string, std::string>> expected;
  std::string current;
  for (const auto& line : lamp::test::split_lines(
           lamp::test::run_python_oracle("nn/linear_oracle.py", args))) {
    if (line.at(0) == "case") {
      current = line.at(1);
      continue;
    }
    std::string bits;
    for (size_t i = 1; i < line.size(); ++i) {
      bits += (i == 1 ? "" : " ") + line[i];
    }
    expected[current][line.at(0)] = bits;
  }
  ASSERT_EQ(expected.size(), cases.size());
  for (const auto& c : cases) {
    EXPECT_EQ(lamp_case(c), expected[c]) << c;
  }
}

TEST(Linear, ModuleHasLibTorchsNamesShapesAndInitialisation) {
  torch::manual_seed(1);
  torch::nn::Linear theirs(torch::nn::LinearOptions(6, 4));
  torch::manual_seed(1);
  lamp::nn::Linear ours(6, 4);
  const auto a = theirs->named_parameters();
  const auto b = ours->named_parameters();
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& key : a.keys()) {
    EXPECT_TRUE(torch::equal(a[key], b[key])) << key; // same draws
  }
  lamp::nn::Linear no_bias(torch::nn::LinearOptions(6, 4).bias(false));
  EXPECT_EQ(no_bias->parameters().size(), 1u);
  EXPECT_FALSE(no_bias->bias.defined());
  std::ostringstream printed;
  printed << *ours;
  EXPECT_EQ(
      printed.str(),
      "lamp::nn::Linear(in_features=6, out_features=4, bias=true)");
  // forward is linear(); a clone is a deep copy of the same kind.
  const auto x = torch::randn({2, 3, 6});
  EXPECT_TRUE(
      torch::equal(ours(x), lamp::nn::linear(x, ours->weight, ours->bias)));
  const auto copy =
      std::dynamic_pointer_cast<lamp::nn::LinearImpl>(ours->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(torch::equal(copy->weight, ours->weight));
  EXPECT_FALSE(copy->weight.is_same(ours->weight));
}

} // namespace

} // namespace linear_test
