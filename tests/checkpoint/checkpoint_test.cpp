#include <lamp/lamp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "resnet50_amp/resnet50.h"
#include "support.h"

extern char** environ;

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace checkpoint_test {

namespace {

using lamp::test::expect_error;

#ifndef LAMP_CHECKPOINT_WORKER
#define LAMP_CHECKPOINT_WORKER ""
#endif

// NOTE: no std::filesystem: libtorch.so exports a broken copy of it (see
// src/checkpoint/files.h).

using lamp::test::fresh_dir;
using lamp::test::names_in;

int64_t size_of(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

std::string base_name(const std::string& path) {
  return path.substr(path.rfind('/') + 1);
}

std::string run(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(
      popen(command.c_str(), "r"), pclose);
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe.get())) > 0) {
    out.append(buffer, n);
  }
  EXPECT_EQ(pclose(pipe.release()), 0) << command << "\n" << out;
  return out;
}

std::string worker(const std::string& args) {
  return run(std::string("\"") + LAMP_CHECKPOINT_WORKER + "\" " + args);
}

// Lines of `text` that start with `prefix`.
std::vector<std::string> lines(
    const std::string& text,
    const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      out.push_back(line);
    }
  }
  return out;
}

torch::nn::Sequential small_mlp() {
  return torch::nn::Sequential(
      torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

// One AMP step on the CPU so that optimizer and scaler have state.
void train_step(
    torch::nn::Sequential& model,
    torch::optim::Optimizer& optimizer,
    lamp::GradScaler& scaler) {
  optimizer.zero_grad();
  auto loss = model->forward(torch::randn({5, 4})).pow(2).mean();
  scaler.scale(loss).backward();
  scaler.step(optimizer);
  scaler.update();
}

std::vector<torch::Tensor> snapshot(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) {
    out.push_back(p.detach().clone());
  }
  return out;
}

void expect_equal(
    const std::vector<torch::Tensor>& a,
    const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
  }
}

TEST(Checkpoint, SaveThenLoadRestoresEveryObject) {
  torch::manual_seed(0);
  auto model = small_mlp();
  lamp::optim::FusedAdam adam(model->parameters());
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(128));
  int64_t step = 7;
  double best = 0.25;
  bool flag = true;
  std::string name = "run-a";
  torch::Tensor ema = torch::arange(6.0).reshape({2, 3});
  for (int i = 0; i < 3; ++i) {
    train_step(model, adam, scaler);
  }
  lamp::TrainingState state;
  state.add("model", *model)
      .add("optimizer", adam)
      .add("scaler", scaler)
      .add("step", step)
      .add("best", best)
      .add("flag", flag)
      .add("name", name)
      .add("ema", ema);
  const auto path = fresh_dir("ckpt_roundtrip") + "/c.pt";
  lamp::save_checkpoint(state, path, 7);
  const auto params = snapshot(*model);
  const auto next_x = torch::randn({3}); // RNG draws after the save
  const auto scale = scaler.get_scale();
  const auto& s0 = static_cast<const lamp::optim::FusedAdamParamState&>(
      *adam.state().at(model->parameters()[0].unsafeGetTensorImpl()));
  const auto exp_avg = s0.exp_avg().clone();
  const auto adam_step = s0.step().clone();

  for (int i = 0; i < 3; ++i) {
    train_step(model, adam, scaler);
  }
  step = 99;
  best = 1;
  flag = false;
  name = "changed";
  ema.fill_(-1);
  adam.param_groups()[0].options().set_lr(0.5);

  EXPECT_EQ(lamp::load_checkpoint(state, path), 7);
  expect_equal(snapshot(*model), params);
  EXPECT_TRUE(torch::equal(s0.exp_avg(), exp_avg));
  EXPECT_TRUE(torch::equal(s0.step(), adam_step));
  EXPECT_EQ(scaler.get_scale(), scale);
  EXPECT_EQ(step, 7);
  EXPECT_EQ(best, 0.25);
  EXPECT_TRUE(flag);
  EXPECT_EQ(name, "run-a");
  EXPECT_TRUE(torch::equal(ema, torch::arange(6.0).reshape({2, 3})));
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 1e-3);
  EXPECT_TRUE(torch::equal(torch::randn({3}), next_x)); // RNG restored
}

TEST(Checkpoint, TorchOptimAndOtherOptimizersRoundTrip) {
  torch::manual_seed(1);
  auto model = small_mlp();
  torch::optim::Adam adam(model->parameters());
  torch::optim::SGD sgd(
      model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::RMSprop rms(model->parameters());
  lamp::GradScaler off(lamp::GradScalerOptions().enabled(false));
  for (auto* o : std::vector<torch::optim::Optimizer*>{&adam, &sgd, &rms}) {
    train_step(model, *o, off);
  }
  lamp::TrainingState state;
  state.add("model", *model).add("adam", adam).add("sgd", sgd).add("rms", rms);
  const auto path = fresh_dir("ckpt_optims") + "/c.pt";
  lamp::save_checkpoint(state, path);
  auto key = model->parameters()[0].unsafeGetTensorImpl();
  const auto adam_step =
      static_cast<torch::optim::AdamParamState&>(*adam.state().at(key)).step();
  const auto buf =
      static_cast<torch::optim::SGDParamState&>(*sgd.state().at(key))
          .momentum_buffer()
          .clone();
  const auto sq =
      static_cast<torch::optim::RMSpropParamState&>(*rms.state().at(key))
          .square_avg()
          .clone();
  for (auto* o : std::vector<torch::optim::Optimizer*>{&adam, &sgd, &rms}) {
    train_step(model, *o, off);
  }
  lamp::load_checkpoint(state, path);
  EXPECT_EQ(
      static_cast<torch::optim::AdamParamState&>(*adam.state().at(key)).step(),
      adam_step);
  EXPECT_TRUE(torch::equal(
      static_cast<torch::optim::SGDParamState&>(*sgd.state().at(key))
          .momentum_buffer(),
      buf));
  EXPECT_TRUE(torch::equal(
      static_cast<torch::optim::RMSpropParamState&>(*rms.state().at(key))
          .square_avg(),
      sq));
}

// Another model's checkpoint, a truncated file, ...: a clear error naming
// the file and the key, and nothing of the live state changes.
TEST(Checkpoint, BadInputIsAnErrorAndChangesNothing) {
  torch::manual_seed(2);
  auto model = small_mlp();
  lamp::optim::FusedAdam adam(model->parameters());
  lamp::GradScaler scaler;
  train_step(model, adam, scaler);
  int64_t step = 3;
  lamp::TrainingState state;
  state.add("model", *model)
      .add("optimizer", adam)
      .add("scaler", scaler)
      .add("step", step);
  const auto dir = fresh_dir("ckpt_bad");
  const auto good = dir + "/good.pt";
  lamp::save_checkpoint(state, good);

  // Another model: Linear(4, 8) -> Linear(4, 6).
  auto other = torch::nn::Sequential(
      torch::nn::Linear(4, 6), torch::nn::ReLU(), torch::nn::Linear(6, 3));
  lamp::optim::FusedAdam other_adam(other->parameters());
  int64_t other_step = 0;
  lamp::TrainingState other_state;
  other_state.add("model", *other)
      .add("optimizer", other_adam)
      .add("step", other_step);
  const auto other_path = dir + "/other.pt";
  lamp::save_checkpoint(other_state, other_path);

  const auto params = snapshot(*model);
  const auto scale = scaler.get_scale();
  auto unchanged = [&] {
    expect_equal(snapshot(*model), params);
    EXPECT_EQ(scaler.get_scale(), scale);
    EXPECT_EQ(step, 3);
  };
  step = 3;
  expect_error(
      [&] { lamp::load_checkpoint(state, other_path); },
      "other.pt: key 'model': key '0.weight' has shape [6, 4] in the "
      "checkpoint and [8, 4] in the model");
  unchanged();
  expect_error(
      [&] { lamp::load_checkpoint(state, dir + "/missing.pt"); },
      "missing.pt: no such file");
  // Truncated: the first half of a good file.
  {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir + "/truncated.pt", std::ios::binary)
        .write(bytes.data(), bytes.size() / 2);
    // Corrupt: a tensor's bytes flipped (the zip CRC catches it).
    auto corrupt = bytes;
    const auto at = corrupt.find("data/0");
    ASSERT_NE(at, std::string::npos);
    for (size_t i = corrupt.size() / 2; i < corrupt.size() / 2 + 16; ++i) {
      corrupt[i] = static_cast<char>(~corrupt[i]);
    }
    std::ofstream(dir + "/corrupt.pt", std::ios::binary)
        .write(corrupt.data(), corrupt.size());
  }
  expect_error(
      [&] { lamp::load_checkpoint(state, dir + "/truncated.pt"); },
      "truncated.pt");
  unchanged();
  expect_error(
      [&] { lamp::load_checkpoint(state, dir + "/corrupt.pt"); }, "corrupt.pt");
  unchanged();
  // An unexpected key: a checkpoint of the model with one more layer.
  auto longer = small_mlp();
  longer->push_back(torch::nn::Linear(3, 3));
  lamp::TrainingState longer_state;
  longer_state.add("model", *longer)
      .add("optimizer", adam)
      .add("scaler", scaler)
      .add("step", step);
  lamp::save_checkpoint(longer_state, dir + "/longer.pt");
  expect_error(
      [&] { lamp::load_checkpoint(state, dir + "/longer.pt"); },
      "longer.pt: key 'model': unexpected key '3.weight'");
  unchanged();
  // Another dtype: the same model in double precision.
  auto doubled = small_mlp();
  doubled->to(torch::kDouble);
  lamp::TrainingState doubled_state;
  doubled_state.add("model", *doubled)
      .add("optimizer", adam)
      .add("scaler", scaler)
      .add("step", step);
  lamp::save_checkpoint(doubled_state, dir + "/double.pt");
  expect_error(
      [&] { lamp::load_checkpoint(state, dir + "/double.pt"); },
      "double.pt: key 'model': key '0.weight' has dtype Double in the "
      "checkpoint and Float in the model");
  unchanged();
  // A missing key: the checkpoint of a state without a scaler.
  lamp::TrainingState no_scaler;
  no_scaler.add("model", *model).add("optimizer", adam).add("step", step);
  const auto partial = dir + "/partial.pt";
  lamp::save_checkpoint(no_scaler, partial);
  expect_error(
      [&] { lamp::load_checkpoint(state, partial); },
      "partial.pt: missing key 'scaler'");
  unchanged();
}

TEST(Checkpoint, FailedLoadRollsBackObjectsAlreadyRestored) {
  // A user type whose load_state_dict throws after a scaler was restored.
  struct Picky {
    lamp::StateDict state_dict() const {
      auto d = lamp::new_state_dict();
      d.insert("x", x);
      return d;
    }
    void load_state_dict(const lamp::StateDict& d) {
      TORCH_CHECK(d.at("x").toInt() >= 0, "x must be >= 0");
      x = d.at("x").toInt();
    }
    int64_t x = 0;
  };
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(8));
  Picky picky;
  picky.x = -1;
  lamp::TrainingState state;
  state.add("scaler", scaler).add("picky", picky).rng(false);
  const auto path = fresh_dir("ckpt_rollback") + "/c.pt";
  lamp::save_checkpoint(state, path);
  scaler.set_growth_interval(5);
  picky.x = 3;
  expect_error(
      [&] { lamp::load_checkpoint(state, path); },
      "key 'picky': x must be >= 0");
  EXPECT_EQ(scaler.get_growth_interval(), 5); // restored, then put back
  EXPECT_EQ(picky.x, 3);
}

TEST(Checkpoint, NewerFormatIsRefused) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  const auto path = fresh_dir("ckpt_newer") + "/newer.pt";
  lamp::test::run_python_oracle(
      "checkpoint/checkpoint_oracle.py", "newer \"" + path + "\"");
  lamp::TrainingState state;
  expect_error(
      [&] { lamp::load_checkpoint(state, path); },
      "newer.pt: written by a newer lamp (checkpoint format 99; this lamp "
      "reads up to 1): upgrade lamp");
}

// torchvision's resnet50 loads the example's model from lamp's checkpoint
// (torch.load(weights_only=True), strict=True) and computes the same
// output.
TEST(Checkpoint, PythonLoadsTheResNet50IntoTorchvision) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  if (!lamp::test::python_can_import("torchvision")) {
    GTEST_SKIP() << "the Python oracle has no torchvision";
  }
  torch::manual_seed(3);
  resnet::ResNet50 model;
  model->eval();
  auto input = torch::randn({2, 3, 64, 64});
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;
    output = model->forward(input);
  }
  lamp::TrainingState state;
  state.add("model", *model).add("input", input).add("output", output);
  const auto path = fresh_dir("ckpt_resnet50") + "/resnet50.pt";
  lamp::save_checkpoint(state, path);
  const auto out = lamp::test::run_python_oracle(
      "checkpoint/checkpoint_oracle.py", "resnet50 \"" + path + "\"");
  const auto fields = lamp::test::split_lines(out).at(0);
  ASSERT_EQ(fields.at(0), "max_abs_diff");
  EXPECT_LT(std::stod(fields.at(1)), 1e-4);
  std::remove(path.c_str());
}

// lamp → Python: Python resumes lamp's MLP + FusedAdam + GradScaler and
// takes one step; Python → lamp: lamp loads Python's checkpoint of the
// result. Both equal lamp's own step, bitwise (fused Adam on the CPU).
TEST(Checkpoint, PythonResumesLampAndLampResumesPython) {
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
  torch::manual_seed(4);
  auto model = small_mlp();
  lamp::optim::FusedAdam adam(model->parameters());
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1024));
  for (int i = 0; i < 3; ++i) {
    train_step(model, adam, scaler);
  }
  int64_t step = 3;
  auto x = torch::randn({5, 4});
  lamp::TrainingState state;
  state.add("model", *model)
      .add("optimizer", adam)
      .add("scaler", scaler)
      .add("step", step)
      .add("x", x)
      .rng(false);
  const auto dir = fresh_dir("ckpt_interop");
  lamp::save_checkpoint(state, dir + "/lamp.pt", step);
  lamp::test::run_python_oracle(
      "checkpoint/checkpoint_oracle.py",
      "mlp \"" + dir + "/lamp.pt\" \"" + dir + "/python.pt\"");
  // lamp's own step from the same state.
  adam.zero_grad();
  auto loss = model->forward(x).pow(2).mean();
  scaler.scale(loss).backward();
  scaler.step(adam);
  scaler.update();
  const auto expected = snapshot(*model);
  const auto scale = scaler.get_scale();
  const auto key = model->parameters()[2].unsafeGetTensorImpl();
  const auto exp_avg_sq =
      static_cast<lamp::optim::FusedAdamParamState&>(*adam.state().at(key))
          .exp_avg_sq()
          .clone();
  // Python's checkpoint into fresh objects.
  torch::manual_seed(5);
  auto fresh = small_mlp();
  lamp::optim::FusedAdam fresh_adam(fresh->parameters());
  lamp::GradScaler fresh_scaler;
  int64_t fresh_step = 0;
  torch::Tensor fresh_x;
  lamp::TrainingState python;
  python.add("model", *fresh)
      .add("optimizer", fresh_adam)
      .add("scaler", fresh_scaler)
      .add("step", fresh_step)
      .add("x", fresh_x);
  EXPECT_EQ(lamp::load_checkpoint(python, dir + "/python.pt"), 0);
  expect_equal(snapshot(*fresh), expected);
  EXPECT_EQ(fresh_step, 4);
  EXPECT_EQ(fresh_scaler.get_scale(), scale);
  const auto fresh_key = fresh->parameters()[2].unsafeGetTensorImpl();
  EXPECT_TRUE(torch::equal(
      static_cast<lamp::optim::FusedAdamParamState&>(
          *fresh_adam.state().at(fresh_key))
          .exp_avg_sq(),
      exp_avg_sq));
}

TEST(Checkpoint, ManagerKeepsTheNewestAndResumesFromIt) {
  auto model = small_mlp();
  int64_t step = 0;
  lamp::TrainingState state;
  state.add("model", *model).add("step", step);
  const auto dir = fresh_dir("ckpt_manager");
  lamp::CheckpointManager checkpoints(
      dir, lamp::CheckpointManagerOptions().keep_last(2));
  EXPECT_FALSE(checkpoints.latest());
  EXPECT_FALSE(checkpoints.load_latest(state));
  for (step = 100; step <= 400; step += 100) {
    checkpoints.save(state, step);
  }
  const auto all = checkpoints.list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, 300);
  EXPECT_EQ(base_name(all[1].second), "checkpoint-000000400.pt");
  step = 0;
  EXPECT_EQ(checkpoints.load_latest(state), 400);
  EXPECT_EQ(step, 400);
  expect_error(
      [&] {
        lamp::CheckpointManager(
            dir, lamp::CheckpointManagerOptions().keep_last(-1));
      },
      "keep_last must be >= 0");
}

// Resuming in a new process continues exactly as the uninterrupted run:
// same losses, scales, parameters, buffers and optimizer state, bitwise.
void expect_bitwise_resume(
    const std::string& model,
    const std::string& device) {
  const auto dir = fresh_dir("ckpt_resume_" + model + "_" + device);
  auto train = [&](const std::string& args) {
    return worker("train " + model + " 20 " + args + " " + device);
  };
  const auto full = train("20 \"" + dir + "/full\" fresh");
  const auto first = train("10 \"" + dir + "/split\" fresh");
  const auto second = train("20 \"" + dir + "/split\" resume");
  auto split = lines(first, "step ");
  const auto rest = lines(second, "step ");
  split.insert(split.end(), rest.begin(), rest.end());
  EXPECT_EQ(lines(full, "step "), split);
  EXPECT_EQ(lines(full, "tensor "), lines(second, "tensor "));
  EXPECT_EQ(lines(full, "step ").size(), 20u);
  EXPECT_GT(lines(full, "tensor ").size(), 3u);
}

TEST(Checkpoint, ResumeInANewProcessIsBitwiseMlp) {
  expect_bitwise_resume("mlp", "cpu");
}

TEST(Checkpoint, ResumeInANewProcessIsBitwiseConvNet) {
  expect_bitwise_resume("conv", "cpu");
}

class CheckpointGpu : public lamp::test::GpuTest {};

// fp16 autocast + GradScaler on CUDA (deterministic cuDNN), dropout from
// the CUDA generator: resumed = uninterrupted, bitwise.
TEST_F(CheckpointGpu, ResumeInANewProcessIsBitwiseMlp) {
  expect_bitwise_resume("mlp", "cuda");
}

TEST_F(CheckpointGpu, ResumeInANewProcessIsBitwiseConvNet) {
  expect_bitwise_resume("conv", "cuda");
}

// A checkpoint holds CPU tensors: one written from CUDA loads on the CPU
// and one written on the CPU loads onto CUDA, values equal.
TEST_F(CheckpointGpu, LoadsOntoTheCurrentDeviceWhateverDeviceWroteIt) {
  torch::manual_seed(6);
  auto cuda_model = small_mlp();
  cuda_model->to(torch::kCUDA);
  lamp::optim::FusedAdam cuda_adam(cuda_model->parameters());
  lamp::GradScaler cuda_scaler;
  {
    cuda_adam.zero_grad();
    auto loss = cuda_model->forward(torch::randn({5, 4}, torch::kCUDA)).sum();
    cuda_scaler.scale(loss).backward();
    cuda_scaler.step(cuda_adam);
    cuda_scaler.update();
  }
  lamp::TrainingState cuda_state;
  cuda_state.add("model", *cuda_model)
      .add("optimizer", cuda_adam)
      .add("scaler", cuda_scaler);
  const auto dir = fresh_dir("ckpt_devices");
  lamp::save_checkpoint(cuda_state, dir + "/cuda.pt");

  auto cpu_model = small_mlp();
  lamp::optim::FusedAdam cpu_adam(cpu_model->parameters());
  lamp::GradScaler cpu_scaler;
  lamp::TrainingState cpu_state;
  cpu_state.add("model", *cpu_model)
      .add("optimizer", cpu_adam)
      .add("scaler", cpu_scaler);
  lamp::load_checkpoint(cpu_state, dir + "/cuda.pt");
  const auto a = snapshot(*cuda_model);
  const auto b = snapshot(*cpu_model);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].cpu(), b[i])) << i;
  }
  const auto key = cpu_model->parameters()[0].unsafeGetTensorImpl();
  const auto& s =
      static_cast<lamp::optim::FusedAdamParamState&>(*cpu_adam.state().at(key));
  EXPECT_TRUE(s.step().is_cpu());
  EXPECT_EQ(s.step().item<float>(), 1.0f);
  EXPECT_EQ(cpu_scaler.get_scale(), cuda_scaler.get_scale());

  // And back: CPU-written into the CUDA run (after changing it).
  lamp::save_checkpoint(cpu_state, dir + "/cpu.pt");
  {
    torch::NoGradGuard no_grad;
    for (auto& p : cuda_model->parameters()) {
      p.zero_();
    }
  }
  lamp::load_checkpoint(cuda_state, dir + "/cpu.pt");
  const auto c = snapshot(*cuda_model);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_TRUE(c[i].is_cuda());
    EXPECT_TRUE(torch::equal(c[i].cpu(), b[i])) << i;
  }
  const auto cuda_key = cuda_model->parameters()[0].unsafeGetTensorImpl();
  EXPECT_TRUE(static_cast<lamp::optim::FusedAdamParamState&>(
                  *cuda_adam.state().at(cuda_key))
                  .step()
                  .is_cuda());
}

// SIGKILL while a checkpoint is being written (by save(), or by the
// background thread of an async_save manager while the model changes): the
// previous one stays loadable and the next save removes the dead save's
// temporary file.
void expect_killed_save_leaves_the_previous_checkpoint(bool async) {
  const auto dir = fresh_dir(async ? "kill_async" : "kill");
  const auto log = dir + "/log.txt";
  bool killed_mid_write = false;
  for (int attempt = 0; attempt < 10 && !killed_mid_write; ++attempt) {
    std::system(("rm -rf '" + dir + "/ckpt'").c_str());
    pid_t pid = 0;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(
        &actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const std::string ckpt = dir + "/ckpt";
    std::vector<std::string> args = {
        LAMP_CHECKPOINT_WORKER, "save-loop", ckpt, "48"};
    if (async) {
      args.emplace_back("async");
    }
    std::vector<char*> argv;
    for (auto& a : args) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    ASSERT_EQ(
        posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    // Wait for a first complete checkpoint, then for a temporary file with
    // data in it: the kill lands mid-write.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      if (text.find("saved 1") != std::string::npos) {
        bool mid = false;
        for (const auto& name : names_in(ckpt)) {
          if (name.find(".tmp.") != std::string::npos &&
              size_of(ckpt + "/" + name) > 0) {
            mid = true;
          }
        }
        if (mid) {
          kill(pid, SIGKILL);
          killed_mid_write = true;
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!killed_mid_write) {
      kill(pid, SIGKILL);
    }
    int status = 0;
    waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(killed_mid_write) << "never caught a save mid-write";
  const std::string ckpt = dir + "/ckpt";
  torch::nn::Linear model(1024, 48 * 256);
  int64_t step = 0;
  lamp::TrainingState state;
  state.add("model", *model).add("step", step);
  lamp::CheckpointManager checkpoints(ckpt);
  const auto loaded = checkpoints.load_latest(state);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(step, *loaded);
  EXPECT_TRUE(
      torch::all(model->weight == static_cast<double>(step)).item<bool>());
  bool tmp_left = false;
  for (const auto& name : names_in(ckpt)) {
    tmp_left |= name.find(".tmp.") != std::string::npos;
  }
  EXPECT_TRUE(tmp_left);
  checkpoints.save(state, step + 1);
  for (const auto& name : names_in(ckpt)) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  }
}

TEST(Checkpoint, KilledSaveLeavesThePreviousCheckpointLoadable) {
  expect_killed_save_leaves_the_previous_checkpoint(/*async=*/false);
}

TEST(Checkpoint, KilledBackgroundSaveLeavesThePreviousCheckpointLoadable) {
  expect_killed_save_leaves_the_previous_checkpoint(/*async=*/true);
}

} // namespace

} // namespace checkpoint_test
