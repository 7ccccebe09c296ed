// ResNet-50 training with automatic mixed precision (lamp): the seeds'
// experiment in C++. Synthetic ImageNet-shaped data, Adam lr 1e-4,
// cross-entropy over 1000 classes; fp32, fp16 (with lamp::GradScaler) and
// bf16 autocast, compared in one table: median step time, images/s, peak
// device memory, final loss and scale, speed-up and memory against fp32.
// With --data DIR, real images instead: DIR/train and DIR/val ImageFolders
// through lamp::data::ImageLoader, --epochs, top-1/top-5 validation per
// epoch (examples/resnet50_amp/image_data.h).
// With --ddp, data-parallel over the processes torchrun, srun or mpirun
// start (one GPU each, --batch-size per GPU, images/s over all GPUs).
//
// clang-format off
//   resnet50_amp                                   # all precisions, batch 64, 224x224 on CUDA
//   resnet50_amp --precision fp16 --batch-size 256 --channels-last   # fused BatchNorm+ReLU, fused tails
//   resnet50_amp --precision fp16 --batch-size 256 --channels-last --no-fused-tail
//   resnet50_amp --precision fp16 --batch-size 256 --channels-last --no-fused-bn
//   resnet50_amp --device cpu                      # a small bf16 run on the CPU
//   resnet50_amp --precision fp16 --lr-schedule cosine --warmup-steps 10 --clip-grad-norm 1
//   resnet50_amp --precision fp16 --checkpoint-dir ckpt --checkpoint-every 50 [--resume]
//   torchrun --no-python --nproc_per_node=2 resnet50_amp --ddp --precision fp16
//   resnet50_amp --precision fp16 --batch-size 256 --channels-last --data /data/imagenet --epochs 90 [--decode cpu|gpu|auto]
// clang-format on

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "progress.h"
#include "resnet50_amp/image_data.h"
#include "resnet50_amp/resnet50.h"
#include "training.h"

namespace {

struct Options {
  std::string precision;
  std::string device = "auto";
  int64_t batch_size = 0; // 0: 64 on CUDA, 4 on the CPU
  int64_t steps = 0; // 0: 100 on CUDA, 5 on the CPU
  int64_t warmup = -1; // -1: 10 on CUDA, 1 on the CPU
  int64_t image_size = 0; // 0: 224 on CUDA, 64 on the CPU
  int64_t log_every = 10;
  bool channels_last = false;
  bool fused_bn = false;
  bool no_fused_bn = false;
  bool fused_tail = false;
  bool no_fused_tail = false;
  bool s2d_stem = false;
  bool no_s2d_stem = false;
  bool no_cast_weights = false;
  bool cudnn_benchmark = false;
  examples::DistFlags dist;
  bool cuda_graph = false;
  double bucket_cap_mb = 25;
  bool grad_as_bucket_view = false;
  bool no_broadcast_buffers = false;
  std::string trace;
  double lr = 1e-4;
  int64_t seed = 0;
  std::string metrics;
  examples::RunOptions run;
  examples::DataOptions data;
};

struct Result {
  examples::Precision precision;
  bool fused_bn = false;
  bool fused_tail = false;
  double median_ms = 0;
  double images_per_s = 0;
  int64_t peak_bytes = 0;
  double final_loss = 0;
  double final_scale = 1;
};

// --fused-bn / --no-fused-bn, else on where the fused kernels run: CUDA,
// channels-last, fp16 or bf16.
bool use_fused_bn(
    const Options& opt,
    const torch::Device& device,
    const examples::Precision& precision) {
  if (opt.fused_bn || opt.no_fused_bn) {
    return opt.fused_bn;
  }
  return device.is_cuda() && opt.channels_last && precision.amp;
}

// --fused-tail / --no-fused-tail, else on with the fused model (fp16 and
// bf16 AMP): measured on an H200 at batch 256 it made the graphed step 3.5
// ms faster in fp16 and in bf16 (see
// docs/design/batchnorm-in-convolutions.md).
bool use_fused_tail(
    const Options& opt,
    bool fused_bn,
    const examples::Precision& precision) {
  if (opt.fused_tail || opt.no_fused_tail) {
    return fused_bn && opt.fused_tail;
  }
  return fused_bn && precision.amp;
}

// --s2d-stem / --no-s2d-stem, else on with the fused model in bf16: the
// stem's convolution rearranged. On an H200 at batch 256 cuDNN's bf16
// kernels for the stem's 3-channel input take 2.9 ms a step (forward and
// weight gradient), rearranged 1.1 ms plus lamp's rearrangement kernel:
// the graphed step 1.2 ms faster (fp16 0.5 ms slower: its 3-channel
// kernels are fast). See docs/design/resnet50-stem.md.
bool use_s2d_stem(
    const Options& opt,
    bool fused_bn,
    const examples::Precision& precision) {
  if (opt.s2d_stem || opt.no_s2d_stem) {
    return opt.s2d_stem;
  }
  return fused_bn && precision.dtype == torch::kBFloat16;
}

void to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 4) {
      p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
    }
  }
}

Result train(
    const Options& opt,
    const torch::Device& device,
    const std::shared_ptr<lamp::dist::ProcessGroup>& pg,
    const examples::Precision& precision,
    examples::JsonLines& metrics) {
  const bool print = examples::rank(pg) == 0;
  const int64_t world_size = examples::world_size(pg);
  examples::reset_peak_memory(device);
  torch::manual_seed(opt.seed);
  const bool fused_bn = use_fused_bn(opt, device, precision);
  const bool fused_tail = use_fused_tail(opt, fused_bn, precision);
  const bool s2d_stem = use_s2d_stem(opt, fused_bn, precision);
  // NOTE: with the fused model, single-process (under DDP it would hold
  // every gradient back to the end of backward; see lamp/cast_weights.h).
  const bool cast_weights =
      fused_bn && precision.amp && !pg && !opt.no_cast_weights;
  at::globalContext().setBenchmarkCuDNN(opt.cudnn_benchmark);
  // --data: real images, fed in the autocast dtype (the first convolution
  // would cast them to it anyway).
  std::optional<examples::ImageData> data;
  if (!opt.data.dir.empty()) {
    data.emplace(
        opt.data,
        opt.batch_size,
        opt.image_size,
        device,
        precision.amp ? precision.dtype : torch::kFloat,
        opt.channels_last,
        opt.seed,
        pg);
    if (print) {
      std::printf(
          "resnet50_amp: %lld training and %lld validation images, %lld "
          "classes, %lld steps per epoch\n",
          static_cast<long long>(data->train_images()),
          static_cast<long long>(data->val_images()),
          static_cast<long long>(data->num_classes()),
          static_cast<long long>(data->steps_per_epoch()));
    }
  }
  resnet::ResNet50 model(
      data ? data->num_classes() : 1000, fused_bn, fused_tail, s2d_stem);
  model->to(device);
  if (opt.channels_last) {
    to_channels_last(*model);
  }
  // NOTE: declared after the model, so destroyed (hooks removed) before it.
  std::optional<lamp::DistributedDataParallel> ddp;
  if (pg) {
    ddp.emplace(
        model.ptr(),
        pg,
        lamp::DDPOptions()
            .bucket_cap_mb(opt.bucket_cap_mb)
            .gradient_as_bucket_view(opt.grad_as_bucket_view)
            .broadcast_buffers(!opt.no_broadcast_buffers));
    // NOTE: each rank trains on its own data (the model is the same on all:
    // DDP broadcast rank 0's).
    torch::manual_seed(opt.seed + pg->rank());
  }
  lamp::optim::FusedAdam optimizer(
      model->parameters(), torch::optim::AdamOptions(opt.lr));
  // bf16 has fp32's range: only fp16 needs loss scaling.
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().enabled(precision.name == "fp16"));

  auto images = torch::randn(
      {opt.batch_size, 3, opt.image_size, opt.image_size},
      torch::TensorOptions(device));
  if (data && precision.amp) {
    images = images.to(precision.dtype); // the loader's dtype
  }
  if (opt.channels_last) {
    images = images.contiguous(torch::MemoryFormat::ChannelsLast);
  }
  auto labels = torch::randint(
      1000, {opt.batch_size}, torch::TensorOptions(device).dtype(torch::kLong));

  // --warmup and --steps together are the run (--data: --epochs); a
  // resumed run continues it.
  const int64_t total_steps =
      data ? opt.data.epochs * data->steps_per_epoch() : opt.warmup + opt.steps;
  const int64_t warmup = std::min(opt.warmup, total_steps - 1);
  const auto schedule =
      examples::make_schedule(optimizer, opt.run, total_steps, opt.cuda_graph);
  int64_t step = 0;
  auto state = examples::run_state(*model, optimizer, scaler, step, schedule);
  // --data: the loader's position (epoch, next batch) travels with the run.
  int64_t data_epoch = 0;
  int64_t data_batch = 0;
  if (data) {
    state.add("data_epoch", data_epoch).add("data_batch", data_batch);
  }
  examples::RunCheckpoints checkpoints(opt.run, pg, "resnet50_amp");
  step = checkpoints.resume(state, print, total_steps);
  if (data) {
    data->start_at(data_epoch * data->steps_per_epoch() + data_batch);
  }

  auto train_step = [&](const std::vector<torch::Tensor>& in) {
    optimizer.zero_grad();
    torch::Tensor out;
    {
      lamp::AutocastGuard autocast(
          device.type(), precision.dtype, precision.amp);
      // All convolution and fc weights cast in one kernel (their gradients
      // back in another) instead of one each.
      std::optional<lamp::CastWeightsGuard> cast;
      if (cast_weights) {
        cast.emplace(*model, device.type());
      }
      // Every BatchNormAct2d's num_batches_tracked += 1 in one kernel, not
      // one each (nothing to count in the unfused model).
      lamp::nn::BatchCountGuard count_batches(*model);
      out = torch::cross_entropy_loss(model->forward(in[0]), in[1]);
    }
    scaler.scale(out).backward();
    examples::step_optimizer(scaler, optimizer, opt.run.clip_grad_norm);
    return out;
  };
  auto graphed = examples::graphed_step(
      opt.cuda_graph, train_step, {images, labels}, optimizer);

  Result result{precision, fused_bn, fused_tail};
  std::vector<double> step_ms;
  torch::Tensor loss;
  std::optional<examples::Trace> trace;
  const int64_t traced_steps = 5;
  examples::Progress progress(
      precision.name, total_steps, step, opt.log_every, print);
  const auto throughput =
      examples::per_second(double(world_size * opt.batch_size), "images");
  int64_t done = 0; // steps run by this process
  examples::SkippedSteps skipped_steps;
  int64_t logged_gpu = 0; // the loader's counts at the last step record
  int64_t logged_cpu = 0;
  while (step < total_steps) {
    examples::synchronize(device);
    // NOTE: `step` steps are done; trace the last `traced_steps`.
    if (!opt.trace.empty() &&
        step == std::max<int64_t>(warmup, total_steps - traced_steps)) {
      trace.emplace(
          opt.trace + "." + precision.name +
          (pg ? ".rank" + std::to_string(pg->rank()) : std::string()) +
          ".json");
      trace->start();
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<torch::Tensor> batch{images, labels};
    if (data) {
      // Timed: a loader that cannot keep up shows in the step time.
      auto b = data->next();
      batch = {b.images, b.targets};
    }
    loss = graphed ? (*graphed)(batch) : train_step(batch);
    examples::synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    ++step;
    ++done;
    skipped_steps.add(scaler);
    if (schedule) {
      schedule->step();
    }
    const int64_t timed = step - warmup;
    if (timed >= 1) {
      step_ms.push_back(ms);
    }
    progress.update(
        step,
        [&] { return std::make_pair(loss.item<double>(), scaler.get_scale()); },
        throughput);
    if (timed >= 1 && (timed % opt.log_every == 0 || step == total_steps)) {
      std::vector<std::pair<std::string, examples::JsonLines::Value>> record{
          {"kind", std::string("step")},
          {"model", std::string("resnet50")},
          {"precision", precision.name},
          {"step", step}, // as the progress line counts
          {"loss", loss.item<double>()},
          {"scale", scaler.get_scale()},
          {"lr", optimizer.param_groups()[0].options().get_lr()},
          {"step_ms", ms},
          {"images_per_s", world_size * opt.batch_size * 1000.0 / ms}};
      if (data) {
        // How the loader split the batches since the last record (this
        // rank's): where a slow step's images were decoded.
        record.emplace_back("gpu_decoded", data->gpu_decoded() - logged_gpu);
        record.emplace_back("cpu_decoded", data->cpu_decoded() - logged_cpu);
        logged_gpu = data->gpu_decoded();
        logged_cpu = data->cpu_decoded();
      }
      metrics.write(record);
    } else if (data && timed < 1) {
      logged_gpu = data->gpu_decoded(); // warm-up batches are not recorded
      logged_cpu = data->cpu_decoded();
    }
    if (data && step % data->steps_per_epoch() == 0) {
      const int64_t epoch = step / data->steps_per_epoch();
      model->eval();
      const auto accuracy = data->evaluate([&](const torch::Tensor& x) {
        lamp::AutocastGuard autocast(
            device.type(), precision.dtype, precision.amp);
        return model->forward(x);
      });
      model->train();
      auto skipped = data->skipped_paths();
      skipped.insert(
          skipped.end(),
          accuracy.skipped_paths.begin(),
          accuracy.skipped_paths.end());
      if (print) {
        std::printf(
            "resnet50_amp: epoch %lld: validation top-1 %.2f %%, top-5 "
            "%.2f %% (images that could not be decoded, skipped: %lld "
            "training, %lld validation%s)\n",
            static_cast<long long>(epoch),
            accuracy.top1,
            accuracy.top5,
            static_cast<long long>(data->skipped()),
            static_cast<long long>(accuracy.skipped),
            examples::first_few(skipped, 3).c_str());
      }
      metrics.write(
          {{"kind", std::string("epoch")},
           {"precision", precision.name},
           {"epoch", epoch},
           {"step", step},
           {"top1", accuracy.top1},
           {"top5", accuracy.top5},
           {"skipped_paths", skipped}});
    }
    if (data) {
      data_epoch = step / data->steps_per_epoch();
      data_batch = step % data->steps_per_epoch();
    }
    if (!checkpoints.after_step(state, step, total_steps, done)) {
      progress.finish();
      if (print) {
        std::printf(
            "resnet50_amp: stopped after %lld steps (--stop-after)\n",
            static_cast<long long>(done));
      }
      std::exit(0);
    }
  }
  progress.finish();
  if (trace) {
    trace->stop();
  }
  result.median_ms = examples::median(step_ms);
  result.images_per_s = world_size * opt.batch_size * 1000.0 / result.median_ms;
  result.peak_bytes = examples::peak_memory_bytes(device);
  result.final_loss = loss.defined() ? loss.item<double>() : NAN;
  result.final_scale = scaler.get_scale();
  examples::write_summary(
      metrics,
      {"resnet50", precision.name, device, world_size, opt.batch_size},
      {{"image_size", opt.image_size},
       {"channels_last", opt.channels_last},
       {"cudnn_benchmark", opt.cudnn_benchmark},
       {"fused_bn", fused_bn},
       {"fused_tail", fused_tail},
       {"s2d_stem", s2d_stem},
       {"cast_weights", cast_weights},
       {"steps", total_steps - warmup},
       {"median_step_ms", result.median_ms},
       {"images_per_s", result.images_per_s},
       {"peak_memory_bytes", result.peak_bytes}},
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
      "ResNet-50 training with automatic mixed precision (lamp): fp32 vs "
      "fp16 vs bf16 on synthetic data, or on an ImageFolder (--data)"};
  app.add_flag("--channels-last", opt.channels_last, "NHWC memory format")
      ->group(examples::kModelGroup);
  auto* fused =
      app.add_flag(
             "--fused-bn",
             opt.fused_bn,
             "GPU only: BatchNorm (+ residual add) + ReLU as "
             "lamp::nn::BatchNormAct2d: cuDNN's fused kernels for CUDA "
             "channels-last fp16/bf16 training, the same unfused ops elsewhere "
             "(default: on for CUDA channels-last fp16/bf16)")
          ->group(examples::kModelGroup);
  app.add_flag(
         "--no-fused-bn",
         opt.no_fused_bn,
         "torch::nn::BatchNorm2d, add and torch::relu (torchvision's model)")
      ->excludes(fused)
      ->group(examples::kModelGroup);
  auto* tail =
      app.add_flag(
             "--fused-tail",
             opt.fused_tail,
             "GPU only: with the fused model, each bottleneck's last "
             "convolution, BatchNorm, shortcut and ReLU as "
             "lamp::nn::conv_bn_add_relu (BatchNorm's statistics from the "
             "convolutions' epilogues; default: on with the fused model)")
          ->group(examples::kModelGroup);
  app.add_flag(
         "--no-fused-tail",
         opt.no_fused_tail,
         "the bottleneck's tail as conv3, then BatchNormAct2d")
      ->excludes(tail)
      ->group(examples::kModelGroup);
  auto* s2d =
      app.add_flag(
             "--s2d-stem",
             opt.s2d_stem,
             "GPU only: the stem's convolution as "
             "lamp::nn::space_to_depth_conv2d (a stride-1 convolution of the "
             "input's 2x2 space-to-depth; same result; default: on with the "
             "fused model in bf16, where cuDNN's 3-channel kernels are slow)")
          ->group(examples::kModelGroup);
  app.add_flag(
         "--no-s2d-stem",
         opt.no_s2d_stem,
         "the stem's convolution as conv1 (the default but in fused bf16)")
      ->excludes(s2d)
      ->group(examples::kModelGroup);
  examples::add_precision_flags(
      app,
      opt.precision,
      opt.device,
      {"fp32", "fp16", "bf16", "all"},
      "fp32, fp16, bf16 or all (default: all on CUDA, bf16 on the CPU)");
  app.add_flag(
         "--cuda-graph",
         opt.cuda_graph,
         "GPU only: capture the whole training step in a CUDA graph "
         "(lamp::GraphedStep) and replay it")
      ->group(examples::kSpeedGroup);
  app.add_flag(
         "--no-cast-weights",
         opt.no_cast_weights,
         "GPU only: let autocast cast each weight where it is used (default "
         "with the fused model, single process: lamp::CastWeightsGuard casts "
         "them all in one kernel)")
      ->group(examples::kSpeedGroup);
  app.add_flag(
         "--cudnn-benchmark",
         opt.cudnn_benchmark,
         "GPU only: let cuDNN time its convolution algorithms on first use and "
         "keep the fastest (Python's torch.backends.cudnn.benchmark = True)")
      ->group(examples::kSpeedGroup);
  app.add_option("--image-size", opt.image_size, "default 224 (CPU: 64)")
      ->check(CLI::Range(32, 1024))
      ->group(examples::kDataGroup);
  examples::add_data_flags(app, opt.data);
  app.add_option("--batch-size", opt.batch_size, "default 64 (CPU: 4)")
      ->check(examples::Positive)
      ->group(examples::kLoopGroup);
  app.add_option("--steps", opt.steps, "timed steps (default 100, CPU: 5)")
      ->check(examples::Positive)
      ->group(examples::kLoopGroup);
  app.add_option("--warmup", opt.warmup, "untimed steps (default 10, CPU: 1)")
      ->check(examples::NonNegative)
      ->group(examples::kLoopGroup);
  app.add_option("--lr", opt.lr, "Adam learning rate")
      ->capture_default_str()
      ->group(examples::kLoopGroup);
  app.add_option("--seed", opt.seed, "weights' and data's random seed")
      ->capture_default_str()
      ->group(examples::kLoopGroup);
  opt.run.lr_schedule = "constant";
  examples::add_run_flags(app, opt.run);
  examples::add_log_flags(
      app, opt.log_every, opt.metrics, "steps between progress lines");
  app.add_option(
         "--trace",
         opt.trace,
         "write a Chrome trace of the last 5 steps to "
         "TRACE.<precision>[.rank<R>].json")
      ->group(examples::kOutputGroup);
  examples::add_dist_flags(app, opt.dist);
  app.add_option(
         "--bucket-cap-mb", opt.bucket_cap_mb, "--ddp: gradient bucket size")
      ->capture_default_str()
      ->group(examples::kDistGroup);
  app.add_flag(
         "--grad-as-bucket-view",
         opt.grad_as_bucket_view,
         "--ddp: gradients are views into the buckets")
      ->group(examples::kDistGroup);
  app.add_flag(
         "--no-broadcast-buffers",
         opt.no_broadcast_buffers,
         "--ddp: keep each rank's BatchNorm statistics")
      ->group(examples::kDistGroup);
  CLI11_PARSE(app, argc, argv);

  const examples::RunPlace place =
      examples::place_run("resnet50_amp", opt.dist, opt.device, opt.cuda_graph);
  if (place.exit_status != 0) {
    return place.exit_status;
  }
  const std::shared_ptr<lamp::dist::ProcessGroup>& pg = place.pg;
  const torch::Device& device = place.device;
  const bool cuda = device.is_cuda();
  const bool print = examples::rank(pg) == 0;
  if (opt.precision.empty()) {
    opt.precision = cuda ? "all" : "bf16";
  }
  if (opt.batch_size == 0) {
    opt.batch_size = cuda ? 64 : 4;
  }
  if (opt.steps == 0) {
    opt.steps = cuda ? 100 : 5;
  }
  if (opt.warmup < 0) {
    opt.warmup = cuda ? 10 : 1;
  }
  if (opt.image_size == 0) {
    opt.image_size = cuda ? 224 : 64;
  }
  opt.log_every = std::min(opt.log_every, opt.steps);

  const auto names =
      examples::precision_runs("resnet50_amp", opt.precision, opt.run);
  if (names.empty()) {
    return 2;
  }
  if (print) {
    // NOTE: after the flags are checked, and what is in effect: the CPU's
    // defaults are smaller than the GPU's.
    if (!cuda) {
      std::cout << "resnet50_amp: no GPU in use, so a small run on the CPU "
                   "(its defaults: bf16, batch 4, 64x64, 5 steps)\n";
    }
    const int64_t all = opt.steps + opt.warmup;
    std::cout << lamp::build_info() << "\n"
              << "resnet50_amp: " << opt.precision << ", batch "
              << opt.batch_size << ", " << opt.image_size << "x"
              << opt.image_size
              << (opt.channels_last ? ", channels-last" : ", NCHW") << ", "
              << (opt.data.dir.empty()
                      ? examples::count(all, "step") + " (" +
                          std::to_string(opt.warmup) + " warm-up, then " +
                          std::to_string(opt.steps) + " timed)"
                      : examples::count(opt.data.epochs, "epoch") + " of " +
                          opt.data.dir)
              << " on " << device << "\n";
    if (pg) {
      std::cout << "resnet50_amp: DDP over " << pg->world_size()
                << " processes, batch " << opt.batch_size << " each\n";
    }
  }
  // NOTE: only rank 0 writes metrics and prints.
  examples::JsonLines metrics(print ? opt.metrics : "");
  std::vector<Result> results;
  try {
    for (const auto& name : names) {
      results.push_back(
          train(opt, device, pg, examples::precision(name), metrics));
    }
  } catch (const std::exception& e) {
    return examples::report_failure("resnet50_amp", e);
  }
  if (!print) {
    return 0;
  }

  // NOTE: "-" where nothing was measured (the CPU has no allocator
  // statistics), not 0.00.
  auto gib = [](int64_t bytes) {
    char text[32] = "-";
    if (bytes > 0) {
      std::snprintf(text, sizeof text, "%.2f", bytes / double(1 << 30));
    }
    return std::string(text);
  };
  const Result* fp32 = nullptr;
  for (const auto& r : results) {
    if (r.precision.name == "fp32") {
      fp32 = &r;
    }
  }
  if (pg) {
    std::printf(
        "\n%s: %lld (DDP; images/s over all of them)",
        cuda ? "GPUs" : "processes",
        static_cast<long long>(pg->world_size()));
  }
  std::printf(
      "\n%-9s %6s %10s %10s %10s %10s %10s %9s %9s\n",
      "precision",
      "bn",
      "step ms",
      "images/s",
      "peak GiB",
      "loss",
      "scale",
      "speed-up",
      "memory");
  for (const auto& r : results) {
    std::printf(
        "%-9s %6s %10.2f %10.1f %10s %10.4f %10g",
        r.precision.name.c_str(),
        r.fused_tail     ? "tail"
            : r.fused_bn ? "fused"
                         : "plain",
        r.median_ms,
        r.images_per_s,
        gib(r.peak_bytes).c_str(),
        r.final_loss,
        r.final_scale);
    if (fp32 && fp32->peak_bytes > 0) {
      std::printf(
          " %8.2fx %8.2fx\n",
          fp32->median_ms / r.median_ms,
          double(r.peak_bytes) / fp32->peak_bytes);
    } else if (fp32) {
      std::printf(" %8.2fx %9s\n", fp32->median_ms / r.median_ms, "-");
    } else {
      std::printf(" %9s %9s\n", "-", "-");
    }
  }
  return 0;
}
