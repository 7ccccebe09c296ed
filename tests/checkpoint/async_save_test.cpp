// CheckpointManager's background saves (async_save): the file is the one a
// synchronous save of the same state writes, even though training changes
// the state while it is written; a failed write is thrown by the next call
// and loses no checkpoint. (A save killed mid-write: checkpoint_test.cpp.)

#include <lamp/lamp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace async_save_test {

namespace {

using lamp::test::fresh_dir;
using lamp::test::names_in;

// A small model trained with SGD + momentum on the CPU: every tensor of its
// state (weights, momentum buffers) is live, changed in place by each step.
struct TrainingRun {
  TrainingRun() {
    torch::manual_seed(0);
    model = torch::nn::Linear(64, 32);
    optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    state.add("model", *model).add("optimizer", *optimizer).add("step", step);
  }
  void train_step() {
    optimizer->zero_grad();
    model->forward(torch::randn({8, 64})).pow(2).mean().backward();
    optimizer->step();
    ++step;
  }
  torch::nn::Linear model{nullptr};
  std::unique_ptr<torch::optim::SGD> optimizer;
  int64_t step = 0;
  lamp::TrainingState state;
};

std::vector<torch::Tensor> tensors_of(TrainingRun& run) {
  std::vector<torch::Tensor> out;
  for (const auto& p : run.model->parameters()) {
    out.push_back(p.detach().clone());
  }
  for (const auto& p : run.model->parameters()) {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(
        *run.optimizer->state().at(p.unsafeGetTensorImpl()));
    out.push_back(s.momentum_buffer().clone());
  }
  return out;
}

TEST(AsyncSave, WritesWhatASynchronousSaveWritesWhileTrainingGoesOn) {
  const auto dir = fresh_dir("async_same");
  TrainingRun run;
  run.train_step();
  run.train_step();
  const auto saved = tensors_of(run);
  lamp::CheckpointManager sync(dir + "/sync");
  lamp::CheckpointManager async(
      dir + "/async", lamp::CheckpointManagerOptions().async_save(true));
  const auto a = sync.save(run.state, run.step);
  const auto b = async.save(run.state, run.step);
  // Training goes on (in place) while the background thread writes.
  for (int i = 0; i < 3; ++i) {
    run.train_step();
  }
  async.wait();
  // Both files hold the state of step 2, tensor for tensor.
  for (const std::string& path : {a, b}) {
    TrainingRun loaded;
    loaded.train_step(); // optimizer state to load into
    EXPECT_EQ(lamp::load_checkpoint(loaded.state, path), 2) << path;
    EXPECT_EQ(loaded.step, 2);
    const auto got = tensors_of(loaded);
    ASSERT_EQ(got.size(), saved.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i], saved[i])) << path << " tensor " << i;
    }
  }
  // And byte for byte: the same archive.
  EXPECT_EQ(lamp::data::read_file(a), lamp::data::read_file(b));
}

TEST(AsyncSave, AFailedWriteIsThrownByTheNextCallAndLosesNothing) {
  const auto dir = fresh_dir("async_error");
  TrainingRun run;
  run.train_step();
  lamp::CheckpointManager checkpoints(
      dir, lamp::CheckpointManagerOptions().async_save(true));
  checkpoints.save(run.state, 1);
  checkpoints.wait();
  const auto first = tensors_of(run);
  // A folder where checkpoint 2 should go: its rename fails (also as root).
  ASSERT_EQ(mkdir((dir + "/checkpoint-000000002.pt").c_str(), 0755), 0);
  run.train_step();
  checkpoints.save(run.state, 2); // returns: the write fails in the thread
  lamp::test::expect_error(
      [&] { checkpoints.wait(); },
      "the background save failed (the previous checkpoints are intact)");
  checkpoints.save(run.state, 2);
  lamp::test::expect_error(
      [&] { checkpoints.save(run.state, 3); }, "checkpoint-000000002.pt");
  // Nothing half-written, and the previous checkpoint loads.
  for (const auto& name : names_in(dir)) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  }
  TrainingRun resumed;
  resumed.train_step();
  EXPECT_EQ(checkpoints.load_latest(resumed.state), 1);
  const auto got = tensors_of(resumed);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i], first[i])) << i;
  }
}

} // namespace

} // namespace async_save_test
