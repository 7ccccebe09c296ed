// Trains the MLP 784-512-10 on the real Fashion-MNIST with automatic mixed
// precision (lamp): fp16 + lamp::GradScaler on CUDA, bf16 on the CPU, fp32 to
// compare. Reports the train loss per epoch and the test accuracy.
//
// With --ddp, data-parallel over the processes torchrun starts (one GPU
// each): every rank trains on its own shard of the training set, batch
// --batch-size each, and evaluates the whole test set.
//
// The data are the gzip IDX files of the Debian package dataset-fashion-mnist
// (/usr/share/datasets/fashion-mnist), read with zlib.
//
// clang-format off
//   mlp_amp                                  # 10 epochs, fp16 on CUDA, bf16 on the CPU
//   mlp_amp --precision all                  # fp32, fp16, bf16 side by side
//   mlp_amp --data DIR --epochs 3 --lr 1e-3
//   mlp_amp --lr-schedule cosine --warmup-steps 500 --clip-grad-norm 1
//   mlp_amp --checkpoint-dir ckpt --checkpoint-every 1000 [--resume]
//   torchrun --no-python --nproc_per_node=2 mlp_amp --ddp
// clang-format on

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "progress.h"
#include "training.h"

namespace {

const char* kDefaultData = "/usr/share/datasets/fashion-mnist";

struct Options {
  std::string data = kDefaultData;
  std::string precision;
  std::string device = "auto";
  int64_t epochs = 10;
  int64_t batch_size = 64;
  double lr = 1e-3;
  int64_t seed = 0;
  int64_t log_every = 100;
  examples::DistFlags dist;
  bool cuda_graph = false;
  std::string metrics;
  double min_accuracy = 0;
  double max_accuracy_gap = 1;
  examples::RunOptions run;
};

[[noreturn]] void data_error(const std::string& path, const std::string& why) {
  throw std::runtime_error(
      path + ": " + why +
      ". Fashion-MNIST comes from the Debian package dataset-fashion-mnist "
      "(apt-get install dataset-fashion-mnist), or pass --data DIR with "
      "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
      "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz");
}

std::vector<uint8_t> read_gzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    data_error(path, "cannot open");
  }
  std::vector<uint8_t> bytes;
  std::vector<char> buffer(1 << 20);
  int n = 0;
  while ((n = gzread(file, buffer.data(), buffer.size())) > 0) {
    bytes.insert(bytes.end(), buffer.begin(), buffer.begin() + n);
  }
  if (n < 0) {
    int code = 0;
    const std::string message = gzerror(file, &code);
    gzclose(file);
    data_error(path, "corrupt gzip (" + message + ")");
  }
  gzclose(file);
  return bytes;
}

uint32_t big_endian(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 |
      uint32_t(p[3]);
}

// IDX images (magic 2051) as float [n, 784], normalised.
torch::Tensor read_images(const std::string& path) {
  const auto bytes = read_gzip(path);
  if (bytes.size() < 16 || big_endian(bytes.data()) != 2051) {
    data_error(path, "not an IDX image file");
  }
  const int64_t n = big_endian(&bytes[4]);
  const int64_t rows = big_endian(&bytes[8]), cols = big_endian(&bytes[12]);
  if (rows != 28 || cols != 28 ||
      int64_t(bytes.size()) != 16 + n * rows * cols) {
    data_error(path, "unexpected image size or truncated file");
  }
  auto images = torch::from_blob(
                    const_cast<uint8_t*>(&bytes[16]), {n, 784}, torch::kUInt8)
                    .to(torch::kFloat)
                    .div_(255);
  return images.sub_(0.2860).div_(0.3530); // Fashion-MNIST mean and std
}

// IDX labels (magic 2049) as int64 [n].
torch::Tensor read_labels(const std::string& path, int64_t expected) {
  const auto bytes = read_gzip(path);
  if (bytes.size() < 8 || big_endian(bytes.data()) != 2049) {
    data_error(path, "not an IDX label file");
  }
  const int64_t n = big_endian(&bytes[4]);
  if (n != expected || int64_t(bytes.size()) != 8 + n) {
    data_error(path, "label count does not match the images");
  }
  auto labels =
      torch::from_blob(const_cast<uint8_t*>(&bytes[8]), {n}, torch::kUInt8)
          .to(torch::kLong);
  if (labels.max().item<int64_t>() > 9) {
    data_error(path, "labels outside 0..9");
  }
  return labels;
}

struct Data {
  torch::Tensor train_x, train_y, test_x, test_y;
};

Data load(const std::string& dir, const torch::Device& device) {
  Data d;
  d.train_x = read_images(dir + "/train-images-idx3-ubyte.gz");
  d.train_y =
      read_labels(dir + "/train-labels-idx1-ubyte.gz", d.train_x.size(0));
  d.test_x = read_images(dir + "/t10k-images-idx3-ubyte.gz");
  d.test_y = read_labels(dir + "/t10k-labels-idx1-ubyte.gz", d.test_x.size(0));
  d.train_x = d.train_x.to(device);
  d.train_y = d.train_y.to(device);
  d.test_x = d.test_x.to(device);
  d.test_y = d.test_y.to(device);
  return d;
}

struct Result {
  std::string precision;
  double accuracy = 0;
  double final_loss = 0;
  double ms_per_step = 0;
  double images_per_s = 0;
  double final_scale = 1;
};

Result train(
    const Options& opt,
    const torch::Device& device,
    const std::shared_ptr<lamp::dist::ProcessGroup>& pg,
    const examples::Precision& precision,
    const Data& data,
    examples::JsonLines& metrics) {
  const bool print = examples::rank(pg) == 0;
  const int64_t world_size = examples::world_size(pg);
  examples::reset_peak_memory(device);
  torch::manual_seed(opt.seed);
  torch::nn::Sequential model(
      torch::nn::Linear(784, 512),
      torch::nn::ReLU(),
      torch::nn::Linear(512, 10));
  model->to(device);
  // NOTE: declared after the model, so destroyed (hooks removed) before it.
  std::optional<lamp::DistributedDataParallel> ddp;
  if (pg) {
    ddp.emplace(model.ptr(), pg);
  }
  lamp::optim::FusedAdam optimizer(
      model->parameters(), torch::optim::AdamOptions(opt.lr));
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().enabled(precision.name == "fp16"));

  const int64_t n = data.train_x.size(0) / world_size; // samples per rank
  // NOTE: a graph replays one shape: it drops each epoch's last partial batch.
  const int64_t steps_per_epoch = opt.cuda_graph
      ? n / opt.batch_size
      : (n + opt.batch_size - 1) / opt.batch_size;
  const int64_t total_steps = opt.epochs * steps_per_epoch;
  const auto schedule =
      examples::make_schedule(optimizer, opt.run, total_steps, opt.cuda_graph);

  // Everything a resumed run needs: the step fixes the epoch and the batch
  // (the data order is a function of the epoch), the loss summed so far
  // continues the epoch's average.
  int64_t step = 0;
  auto loss_sum = torch::zeros({}, torch::TensorOptions(device));
  auto state = examples::run_state(*model, optimizer, scaler, step, schedule);
  state.add("epoch_loss_sum", loss_sum);
  examples::RunCheckpoints checkpoints(opt.run, pg, "mlp_amp");
  step = checkpoints.resume(state, print, total_steps);

  auto accuracy = [&] {
    torch::NoGradGuard no_grad;
    model->eval();
    int64_t correct = 0;
    for (int64_t i = 0; i < data.test_x.size(0); i += 1000) {
      lamp::AutocastGuard autocast(
          device.type(), precision.dtype, precision.amp);
      auto logits = model->forward(data.test_x.slice(0, i, i + 1000));
      correct += logits.argmax(1)
                     .eq(data.test_y.slice(0, i, i + 1000))
                     .sum()
                     .item<int64_t>();
    }
    model->train();
    return double(correct) / data.test_x.size(0);
  };

  auto train_step = [&](const std::vector<torch::Tensor>& in) {
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      lamp::AutocastGuard autocast(
          device.type(), precision.dtype, precision.amp);
      loss = torch::cross_entropy_loss(model->forward(in[0]), in[1]);
    }
    scaler.scale(loss).backward();
    examples::step_optimizer(scaler, optimizer, opt.run.clip_grad_norm);
    return loss;
  };
  auto graphed = examples::graphed_step(
      opt.cuda_graph,
      train_step,
      {data.train_x.slice(0, 0, opt.batch_size),
       data.train_y.slice(0, 0, opt.batch_size)},
      optimizer);

  Result result{precision.name};
  examples::Progress progress(
      precision.name, total_steps, step, opt.log_every, print);
  const auto throughput =
      examples::per_second(double(world_size * opt.batch_size), "images");
  int64_t done = 0; // steps run by this process
  examples::SkippedSteps skipped_steps;
  double total_ms = 0;
  // The metrics' throughput: images a second since the previous record (the
  // record's loss.item() waits for the device, so the interval is real).
  std::chrono::steady_clock::time_point logged_at;
  int64_t logged_step = step;
  for (int64_t epoch = step / steps_per_epoch + 1; epoch <= opt.epochs;
       ++epoch) {
    // NOTE: as torch.utils.data.DistributedSampler(drop_last=True): every
    // rank draws the same permutation, from a generator seeded with the
    // seed and the epoch (so a resumed run draws it again), and takes every
    // world_size-th index from its rank on: disjoint shards of equal size.
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        static_cast<uint64_t>(opt.seed + epoch));
    const auto order =
        torch::randperm(
            data.train_x.size(0), generator, torch::TensorOptions(torch::kLong))
            .slice(0, examples::rank(pg), n * world_size, world_size)
            .to(device);
    const int64_t first = step - (epoch - 1) * steps_per_epoch;
    if (first == 0) {
      loss_sum.zero_();
    }
    examples::synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    logged_at = start; // the evaluation between epochs is not training time
    logged_step = step;
    bool stop = false;
    for (int64_t b = first; b < steps_per_epoch && !stop; ++b) {
      const auto index =
          order.slice(0, b * opt.batch_size, (b + 1) * opt.batch_size);
      const auto x = data.train_x.index_select(0, index);
      const auto y = data.train_y.index_select(0, index);
      const auto loss =
          graphed ? (*graphed)({x, y}) : train_step({x, y}).detach();
      loss_sum += loss;
      ++step;
      ++done;
      skipped_steps.add(scaler);
      if (schedule) {
        schedule->step();
      }
      progress.update(
          step,
          [&] {
            return std::make_pair(loss.item<double>(), scaler.get_scale());
          },
          throughput);
      if (step % opt.log_every == 0) {
        const double loss_value = loss.item<double>();
        const auto now = std::chrono::steady_clock::now();
        const double seconds =
            std::chrono::duration<double>(now - logged_at).count();
        const double images =
            double(step - logged_step) * world_size * opt.batch_size;
        logged_at = now;
        logged_step = step;
        metrics.write(
            {{"kind", std::string("step")},
             {"model", std::string("mlp")},
             {"precision", precision.name},
             {"step", step},
             {"loss", loss_value},
             {"scale", scaler.get_scale()},
             {"lr", optimizer.param_groups()[0].options().get_lr()},
             {"images_per_s", seconds > 0 ? images / seconds : 0.0}});
      }
      stop = !checkpoints.after_step(state, step, total_steps, done);
    }
    examples::synchronize(device);
    total_ms += std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - start)
                    .count();
    if (stop) {
      progress.finish();
      if (print) {
        std::printf(
            "mlp_amp: stopped after %lld steps (--stop-after)\n",
            static_cast<long long>(done));
      }
      std::exit(0);
    }
    auto epoch_loss = loss_sum.clone();
    if (world_size > 1) {
      pg->allreduce(epoch_loss, lamp::dist::ReduceOp::kAvg); // all shards
    }
    result.final_loss = epoch_loss.item<double>() / steps_per_epoch;
    // NOTE: every rank evaluates the whole test set: the replicas are equal.
    result.accuracy = accuracy();
    progress.finish();
    if (print) {
      std::printf(
          "[%s] epoch %2lld  train loss %.4f  test accuracy %.2f%%  scale %g\n",
          precision.name.c_str(),
          static_cast<long long>(epoch),
          result.final_loss,
          100 * result.accuracy,
          scaler.get_scale());
      std::fflush(stdout);
    }
    metrics.write(
        {{"kind", std::string("epoch")},
         {"model", std::string("mlp")},
         {"precision", precision.name},
         {"epoch", epoch},
         {"step", step},
         {"train_loss", result.final_loss},
         {"test_accuracy", result.accuracy}});
  }
  result.ms_per_step = done > 0 ? total_ms / done : NAN;
  result.images_per_s =
      done > 0 ? world_size * opt.batch_size * done * 1000.0 / total_ms : NAN;
  result.final_scale = scaler.get_scale();
  examples::write_summary(
      metrics,
      {"mlp", precision.name, device, world_size, opt.batch_size},
      {{"epochs", opt.epochs},
       {"ms_per_step", result.ms_per_step},
       {"images_per_s", result.images_per_s},
       {"test_accuracy", result.accuracy},
       {"peak_memory_bytes", examples::peak_memory_bytes(device)}},
      result.final_loss,
      scaler,
      skipped_steps,
      done,
      print,
      "[" + precision.name + "] ");
  return result;
}

} // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "Train an MLP 784-512-10 on Fashion-MNIST with automatic mixed "
      "precision (lamp)"};
  examples::add_precision_flags(
      app,
      opt.precision,
      opt.device,
      {"fp32", "fp16", "bf16", "all"},
      "fp32, fp16, bf16 or all (default: fp16 on CUDA, bf16 on the CPU)");
  app.add_flag(
         "--cuda-graph",
         opt.cuda_graph,
         "GPU only: capture the training step in a CUDA graph "
         "(lamp::GraphedStep) and replay it; drops each epoch's last partial "
         "batch")
      ->group(examples::kSpeedGroup);
  app.add_option("--data", opt.data, "folder with the Fashion-MNIST .gz files")
      ->capture_default_str()
      ->group(examples::kDataGroup);
  app.add_option(
         "--epochs", opt.epochs, "passes over the 60,000 training images")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(examples::kLoopGroup);
  app.add_option("--batch-size", opt.batch_size, "images a step (a process)")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(examples::kLoopGroup);
  app.add_option("--lr", opt.lr, "Adam learning rate (see --lr-schedule)")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(examples::kLoopGroup);
  app.add_option("--seed", opt.seed, "weights' and shuffling's random seed")
      ->capture_default_str()
      ->group(examples::kLoopGroup);
  opt.run.lr_schedule = "linear";
  examples::add_run_flags(app, opt.run);
  examples::add_log_flags(
      app, opt.log_every, opt.metrics, "steps between metrics lines");
  app.add_option(
         "--min-accuracy",
         opt.min_accuracy,
         "exit 1 if a final test accuracy is below this (0..1)")
      ->check(CLI::Range(0.0, 1.0))
      ->group(examples::kOutputGroup);
  app.add_option(
         "--max-accuracy-gap",
         opt.max_accuracy_gap,
         "with --precision all: exit 1 if an AMP accuracy is further than "
         "this from fp32's (0..1)")
      ->check(CLI::Range(0.0, 1.0))
      ->group(examples::kOutputGroup);
  examples::add_dist_flags(app, opt.dist);
  CLI11_PARSE(app, argc, argv);

  const examples::RunPlace place =
      examples::place_run("mlp_amp", opt.dist, opt.device, opt.cuda_graph);
  if (place.exit_status != 0) {
    return place.exit_status;
  }
  const std::shared_ptr<lamp::dist::ProcessGroup>& pg = place.pg;
  const torch::Device& device = place.device;
  if (opt.precision.empty()) {
    opt.precision = device.is_cuda() ? "fp16" : "bf16";
  }
  const auto names =
      examples::precision_runs("mlp_amp", opt.precision, opt.run);
  if (names.empty()) {
    return 2;
  }
  Data data;
  try {
    data = load(opt.data, device);
  } catch (const std::exception& e) {
    std::cerr << "mlp_amp: " << e.what() << "\n";
    return 2;
  }
  const bool print = examples::rank(pg) == 0;
  if (print) {
    std::cout << lamp::build_info() << "\n"
              << "mlp_amp: MLP 784-512-10 on Fashion-MNIST ("
              << data.train_x.size(0) << " train, " << data.test_x.size(0)
              << " test images) on " << device << ", batch " << opt.batch_size
              << ", " << opt.epochs << (opt.epochs == 1 ? " epoch" : " epochs")
              << ", Adam lr " << opt.lr << " (" << opt.run.lr_schedule
              << " schedule"
              << (opt.run.warmup_steps > 0
                      ? ", " + std::to_string(opt.run.warmup_steps) +
                          " warm-up steps"
                      : std::string())
              << (opt.run.clip_grad_norm > 0 ? ", gradients clipped to norm " +
                          std::to_string(opt.run.clip_grad_norm)
                                             : std::string())
              << ")\n";
    if (pg) {
      std::cout << "mlp_amp: DDP over " << pg->world_size()
                << " processes, each on its shard of "
                << data.train_x.size(0) / pg->world_size()
                << " train images, batch " << opt.batch_size << " each\n";
    }
  }
  // NOTE: only rank 0 writes metrics and prints.
  examples::JsonLines metrics(print ? opt.metrics : "");
  std::vector<Result> results;
  try {
    for (const auto& name : names) {
      results.push_back(
          train(opt, device, pg, examples::precision(name), data, metrics));
    }
  } catch (const std::exception& e) {
    return examples::report_failure("mlp_amp", e);
  }

  if (print && pg) {
    std::printf(
        "\n%s: %lld (DDP)",
        device.is_cuda() ? "GPUs" : "processes",
        static_cast<long long>(pg->world_size()));
  }
  if (print) {
    std::printf(
        "\n%-9s %14s %12s %11s %10s\n",
        "precision",
        "test accuracy",
        "train loss",
        "ms/step",
        "scale");
  }
  // NOTE: every rank checks (the replicas are equal, so they agree) and
  // exits with the same status; rank 0 says why.
  bool ok = true;
  for (const auto& r : results) {
    if (print) {
      std::printf(
          "%-9s %13.2f%% %12.4f %11.3f %10g\n",
          r.precision.c_str(),
          100 * r.accuracy,
          r.final_loss,
          r.ms_per_step,
          r.final_scale);
    }
    if (r.accuracy < opt.min_accuracy) {
      if (print) {
        std::fprintf(
            stderr,
            "mlp_amp: FAILED: %s accuracy %.4f < --min-accuracy %.4f\n",
            r.precision.c_str(),
            r.accuracy,
            opt.min_accuracy);
      }
      ok = false;
    }
    if (results.front().precision == "fp32" &&
        std::abs(r.accuracy - results.front().accuracy) >
            opt.max_accuracy_gap) {
      if (print) {
        std::fprintf(
            stderr,
            "mlp_amp: FAILED: %s accuracy is %.2f points from fp32's\n",
            r.precision.c_str(),
            100 * std::abs(r.accuracy - results.front().accuracy));
      }
      ok = false;
    }
  }
  return ok ? 0 : 1;
}
