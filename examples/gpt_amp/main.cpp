// Trains GPT-2 (nanoGPT's and llm.c's model, sizes gpt2 to gpt2-xl, or a
// tiny one for the CPU) with automatic mixed precision (lamp): bf16 autocast
// or fp16 with lamp::GradScaler, fused AdamW with weight decay on matrices
// only, warm-up + cosine, clipping, gradient accumulation, the whole step
// in a CUDA graph (--cuda-graph), data-parallel (--ddp), checkpoints and
// resume, validation loss, and a few sampled tokens at the end.
//
// Data: --data FILE of uint16 tokens in llm.c's .bin layout (what llm.c's
// and nanoGPT's prepare scripts write; tools/make_tokens.py makes them from
// local text), else random tokens.
//
// clang-format off
//   gpt_amp --model tiny --device cpu --steps 200            # a small model on random bytes
//   python3 tools/make_tokens.py corpus/ --out-dir tok       # bytes of local text
//   gpt_amp --model tiny --data tok/train.bin --val-data tok/val.bin --steps 2000
//   gpt_amp --model gpt2 --batch-size 16 --precision bf16 --cuda-graph
//   torchrun --no-python --nproc_per_node=8 gpt_amp --ddp --model gpt2-medium --data ...
// clang-format on

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "gpt.h"
#include "progress.h"
#include "training.h"

namespace {

struct Options {
  std::string model = "gpt2";
  int64_t vocab_size = 0; // 0: the model's
  double dropout = 0;
  std::string data, val_data;
  int64_t seq_len = 0; // 0: the model's block size
  std::string precision;
  std::string fp8_scaling = "current";
  int64_t fp8_amax_history = 16;
  std::string device = "auto";
  bool cuda_graph = false;
  std::string recompute_blocks = "0"; // a count, or "all"
  examples::DistFlags dist;
  int64_t batch_size = 0; // 0: 16 (CPU: 4)
  int64_t grad_accum = 1;
  int64_t steps = 0; // 0: 50 (CPU: 20)
  int64_t warmup = -1; // untimed steps; -1: 10 (CPU: 2)
  double lr = 6e-4;
  double weight_decay = 0.1;
  int64_t seed = 0;
  int64_t eval_every = 0;
  int64_t eval_batches = 20;
  int64_t sample_tokens = -1; // -1: 200 for byte vocabularies, else 0
  int64_t log_every = 10;
  double peak_tflops = 989;
  std::string metrics;
  std::string save_init;
  std::string trace;
  double max_loss = 0; // 0: no check
  examples::RunOptions run;
};

// Tokens as text when they are bytes (the tiny model, tools/make_tokens.py's
// default); token ids otherwise.
std::string as_text(const std::vector<int64_t>& tokens, int64_t vocab) {
  std::string out;
  for (const int64_t t : tokens) {
    if (vocab <= 256) {
      out += (t == '\n' || (t >= 32 && t < 127)) ? static_cast<char>(t) : '?';
    } else {
      out += std::to_string(t) + " ";
    }
  }
  return out;
}

int run(
    const Options& opt,
    const examples::RunPlace& place,
    examples::JsonLines& metrics) {
  const auto& pg = place.pg;
  const auto& device = place.device;
  const bool print = examples::rank(pg) == 0;
  const int64_t world = examples::world_size(pg);
  auto config = *gpt::config_of(opt.model);
  if (opt.vocab_size > 0) {
    config.vocab_size = opt.vocab_size;
  }
  config.dropout = opt.dropout;
  const int64_t recompute_blocks = opt.recompute_blocks == "all"
      ? config.n_layer
      : std::stoll(opt.recompute_blocks);
  TORCH_CHECK_VALUE(
      recompute_blocks <= config.n_layer,
      "--activation-checkpointing ",
      recompute_blocks,
      " is more blocks than ",
      opt.model,
      " has (",
      config.n_layer,
      "); pass at most that, or all");
  const bool cpu = !device.is_cuda();
  const int64_t seq = opt.seq_len > 0 ? opt.seq_len : config.block_size;
  const int64_t batch = opt.batch_size > 0 ? opt.batch_size : (cpu ? 4 : 16);
  const int64_t timed_steps = opt.steps > 0 ? opt.steps : (cpu ? 20 : 50);
  const int64_t warmup = opt.warmup >= 0 ? opt.warmup : (cpu ? 2 : 10);
  const int64_t total = warmup + timed_steps;
  const auto precision = examples::precision(opt.precision);
  TORCH_CHECK_VALUE(
      seq <= config.block_size,
      "--seq-len ",
      seq,
      " is longer than ",
      opt.model,
      "'s block size, ",
      config.block_size);

  // Data: a file's windows (every rank its share), or random tokens.
  std::optional<lamp::data::TokenDataset> train, val;
  auto data_options = lamp::data::TokenDatasetOptions()
                          .seq_len(seq)
                          .batch_size(batch * opt.grad_accum)
                          .rank(examples::rank(pg))
                          .world_size(world)
                          .seed(opt.seed)
                          .vocab_size(config.vocab_size);
  if (!opt.data.empty()) {
    train.emplace(opt.data, data_options);
  }
  if (!opt.val_data.empty()) {
    val.emplace(opt.val_data, data_options.batch_size(batch).shuffle(false));
  }
  auto random_batch = [&](int64_t step) {
    auto generator =
        at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(
            opt.seed * 1000003 + step * world + examples::rank(pg)));
    auto tokens = torch::randint(
        config.vocab_size,
        {batch * opt.grad_accum, seq + 1},
        generator,
        torch::kLong);
    // NOTE: pinned, so that the copies to the GPU are asynchronous (from
    // pageable memory a copy first waits for the stream: for the step
    // before, which Note [timing steps without a sync a step] overlaps).
    auto x = tokens.narrow(1, 0, seq).contiguous();
    auto y = tokens.narrow(1, 1, seq).contiguous();
    if (device.is_cuda()) {
      x = x.pin_memory();
      y = y.pin_memory();
    }
    return std::make_pair(x, y);
  };
  auto batch_at = [&](int64_t step) {
    auto b = train ? train->batch(
                         step / train->batches_per_epoch(),
                         step % train->batches_per_epoch())
                   : random_batch(step);
    return std::vector<torch::Tensor>{
        b.first.to(device, /*non_blocking=*/true),
        b.second.to(device, /*non_blocking=*/true)};
  };

  examples::reset_peak_memory(device);
  torch::manual_seed(opt.seed);
  gpt::Gpt model(config);
  model->recompute_blocks = recompute_blocks;
  model->to(device);
  // --fp8-scaling delayed: the layers' amax histories and scales are
  // buffers, made now so that a checkpoint holding them loads and DDP
  // broadcasts them with the others; each update takes the newest amaxes'
  // max over the ranks (every rank then scales alike, from all ranks'
  // data, as Transformer Engine's reduce_amax).
  const auto fp8_recipe =
      lamp::Fp8Recipe()
          .scaling(
              opt.fp8_scaling == "delayed" ? lamp::Fp8Scaling::kDelayed
                                           : lamp::Fp8Scaling::kCurrent)
          .amax_history_len(opt.fp8_amax_history)
          .amax_group(pg);
  if (precision.fp8) {
    lamp::init_fp8_state(*model, fp8_recipe);
  }
  std::optional<lamp::DistributedDataParallel> ddp;
  if (pg) {
    ddp.emplace(model.ptr(), pg);
  }
  lamp::optim::FusedAdamW optimizer(
      model->param_groups(torch::optim::AdamWOptions(opt.lr)
                              .betas({0.9, 0.95})
                              .eps(1e-8)
                              .weight_decay(opt.weight_decay)));
  // The weights' 16-bit casts written by the step's kernel as it writes
  // the weights, and taken by the step's CastWeightsGuard instead of a cast
  // each step (lamp/optim.h). Not with FP8, whose layers cast the fp32
  // weights themselves.
  if (precision.amp && !precision.fp8) {
    optimizer.keep_weight_casts(precision.dtype);
  }
  // The step leaves the gradients undefined instead of storing them
  // clipped (a pass over them): train_step's zero_grad() drops them next
  // anyway, and nothing reads them in between (lamp/optim.h).
  optimizer.zero_grad_in_step(true);
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().enabled(precision.name == "fp16"));
  const auto schedule =
      examples::make_schedule(optimizer, opt.run, total, opt.cuda_graph);
  int64_t step = 0;
  auto state = examples::run_state(*model, optimizer, scaler, step, schedule);
  if (!opt.save_init.empty()) {
    lamp::TrainingState init;
    init.add("model", *model).rng(false);
    lamp::save_checkpoint(init, opt.save_init);
  }
  examples::RunCheckpoints checkpoints(opt.run, pg, "gpt_amp");
  step = checkpoints.resume(state, print, total);
  if (print && pg) {
    std::cout << "gpt_amp: DDP over " << world << " processes ("
              << (device.is_cuda() ? "GPUs, NCCL" : "CPUs, Gloo") << "), batch "
              << batch << " x " << seq << " tokens each\n";
  }

  // One optimizer step: --grad-accum micro-batches of the batch's rows.
  auto train_step = [&](const std::vector<torch::Tensor>& in) {
    optimizer.zero_grad();
    torch::Tensor sum;
    {
      // --precision fp8: the blocks' GEMMs in FP8 (lamp/fp8.h), one scope
      // for the step's micro-batches so that each weight is cast to FP8
      // once a step.
      lamp::Fp8AutocastGuard fp8(fp8_recipe, precision.fp8);
      // --fp8-scaling delayed: every layer's scales updated in one launch,
      // not one in each layer's call (the same values: lamp/fp8.h).
      lamp::update_fp8_scales(*model);
      for (int64_t a = 0; a < opt.grad_accum; ++a) {
        const auto x = in[0].narrow(0, a * batch, batch);
        const auto y = in[1].narrow(0, a * batch, batch);
        torch::Tensor loss;
        {
          lamp::AutocastGuard autocast(
              device.type(), precision.dtype, precision.amp);
          // Every linear layer's weight and bias cast in one kernel (their
          // biases' gradients back in another, the weights' written in fp32
          // by their GEMMs: GPT::cast_options) instead of one each. NOTE:
          // not with FP8, whose layers cast the fp32 weights to FP8
          // themselves and get fp32 weight gradients from their GEMMs: a
          // 16-bit copy first would be one more pass over each weight and
          // its gradient.
          std::optional<lamp::CastWeightsGuard> cast;
          if (!precision.fp8) {
            cast.emplace(*model, device.type(), gpt::GptImpl::cast_options());
          }
          loss = model->loss(x, y) / static_cast<double>(opt.grad_accum);
        }
        scaler.scale(loss).backward();
        sum = a == 0 ? loss.detach() : sum + loss.detach();
      }
    }
    examples::step_optimizer(scaler, optimizer, opt.run.clip_grad_norm);
    return sum;
  };
  auto graphed = examples::graphed_step(
      opt.cuda_graph, train_step, batch_at(step), optimizer);

  auto evaluate = [&]() -> double {
    torch::NoGradGuard no_grad;
    model->eval();
    const int64_t n = std::min(opt.eval_batches, val->batches_per_epoch());
    auto sum = torch::zeros({}, torch::TensorOptions(device));
    for (int64_t b = 0; b < n; ++b) {
      auto [x, y] = val->batch(0, b);
      lamp::AutocastGuard autocast(
          device.type(), precision.dtype, precision.amp);
      sum += model->loss(x.to(device), y.to(device));
    }
    if (world > 1) {
      pg->allreduce(sum, lamp::dist::ReduceOp::kAvg);
    }
    model->train();
    return sum.item<double>() / n;
  };

  const double tokens_per_step = double(world * batch * opt.grad_accum * seq);
  // nanoGPT's estimate_mfu: 6 N + 12 L H Q T flops a token.
  const double flops_per_token =
      6.0 * model->num_params() + 12.0 * config.n_layer * config.n_embd * seq;
  auto throughput = [&](double steps_per_s) {
    const double tokens_s = steps_per_s * tokens_per_step;
    char line[96];
    std::snprintf(line, sizeof line, "  %.0f tokens/s", tokens_s);
    std::string out = line;
    if (device.is_cuda()) { // MFU against a GPU's peak
      std::snprintf(
          line,
          sizeof line,
          "  MFU %.1f %%",
          100 * tokens_s * flops_per_token / (opt.peak_tflops * 1e12 * world));
      out += line;
    }
    return out;
  };

  std::vector<double> step_ms;
  torch::Tensor loss;
  examples::Progress progress(opt.model, total, step, opt.log_every, print);
  int64_t done = 0;
  examples::SkippedSteps skipped_steps;
  std::optional<examples::Trace> trace;
  const int64_t traced_steps = 3;
  // Note [timing steps without a sync a step] (examples/common.h): the
  // device is waited for only at a window's end.
  examples::StepTimer timer(device);
  double ms = NAN; // the last window's mean
  while (step < total) {
    if (!opt.trace.empty() && print &&
        step == std::max<int64_t>(warmup, total - traced_steps)) {
      timer.restart(); // the trace holds these steps' kernels only
      trace.emplace(opt.trace);
      trace->start();
    }
    const auto in = batch_at(step);
    loss = graphed ? (*graphed)(in) : train_step(in);
    timer.step();
    ++step;
    ++done;
    skipped_steps.add(scaler);
    const double lr = optimizer.param_groups()[0].options().get_lr();
    if (schedule) {
      schedule->step();
    }
    const bool evaluate_now = val &&
        ((opt.eval_every > 0 && step % opt.eval_every == 0) || step == total);
    const bool checkpoint_now =
        opt.run.checkpoint_every > 0 && step % opt.run.checkpoint_every == 0;
    if (step == warmup || step % opt.log_every == 0 || step == total ||
        evaluate_now || checkpoint_now) {
      const auto [window_ms, steps] = timer.lap();
      ms = window_ms;
      // Windows begun in the warm-up are not timed.
      if (steps > 0 && step - steps >= warmup) {
        step_ms.insert(step_ms.end(), steps, window_ms);
      }
    }
    progress.update(
        step,
        [&] { return std::make_pair(loss.item<double>(), scaler.get_scale()); },
        throughput);
    if (step % opt.log_every == 0 || step == total) {
      metrics.write(
          {{"kind", std::string("step")},
           {"step", step},
           {"loss", loss.item<double>()},
           {"lr", lr},
           {"scale", scaler.get_scale()},
           {"step_ms", ms},
           {"tokens_per_s", tokens_per_step * 1000.0 / ms}});
    }
    if (evaluate_now) {
      const double v = evaluate();
      progress.finish();
      if (print) {
        std::printf(
            "gpt_amp: step %lld: validation loss %.4f\n",
            static_cast<long long>(step),
            v);
      }
      metrics.write(
          {{"kind", std::string("eval")}, {"step", step}, {"val_loss", v}});
    }
    if (!checkpoints.after_step(state, step, total, done)) {
      progress.finish();
      if (print) {
        std::printf(
            "gpt_amp: stopped after %lld steps (--stop-after)\n",
            static_cast<long long>(done));
      }
      return 0;
    }
    if (evaluate_now || checkpoint_now) {
      timer.restart(); // not a step's time
    }
  }
  progress.finish();
  if (trace) {
    trace->stop();
  }
  const double median_ms = examples::median(step_ms);
  const double tokens_s = tokens_per_step * 1000.0 / median_ms;
  const double mfu =
      tokens_s * flops_per_token / (opt.peak_tflops * 1e12 * world);
  const double final_loss = loss.defined() ? loss.item<double>() : NAN;
  const auto peak = examples::peak_memory_bytes(device);
  examples::write_summary(
      metrics,
      {opt.model, precision.name, device, world, batch},
      {{"impl", std::string(opt.cuda_graph ? "lamp-graphed" : "lamp")},
       {"grad_accum", opt.grad_accum},
       {"seq_len", seq},
       {"steps", static_cast<int64_t>(step_ms.size())},
       {"ms_per_step", median_ms},
       {"tokens_per_s", tokens_s},
       {"mfu", mfu},
       {"peak_memory_gib", peak / double(int64_t{1} << 30)}},
      final_loss,
      scaler,
      skipped_steps,
      done,
      print,
      "gpt_amp: ");
  if (print) {
    std::printf(
        "\n%-12s %-9s %10s %12s %7s %10s %10s\n",
        "model",
        "precision",
        "ms/step",
        "tokens/s",
        "MFU",
        "peak GiB",
        "loss");
    std::printf(
        "%-12s %-9s %10.2f %12.0f %6.1f%% %10.2f %10.4f\n",
        opt.model.c_str(),
        precision.name.c_str(),
        median_ms,
        tokens_s,
        100 * mfu,
        peak / double(int64_t{1} << 30),
        final_loss);
  }

  // A few tokens sampled from the trained model (temperature 1, top 50),
  // from the first tokens of the validation data or a newline.
  const int64_t n_sample = opt.sample_tokens >= 0
      ? opt.sample_tokens
      : (config.vocab_size <= 256 ? 200 : 0);
  if (print && n_sample > 0) {
    torch::NoGradGuard no_grad;
    model->eval();
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        static_cast<uint64_t>(opt.seed));
    std::vector<int64_t> context{
        val ? val->batch(0, 0).first[0][0].item<int64_t>() : int64_t{'\n'}};
    std::vector<int64_t> sampled;
    for (int64_t i = 0; i < n_sample; ++i) {
      const int64_t from =
          std::max<int64_t>(0, int64_t(context.size()) - config.block_size);
      const auto idx = torch::tensor(std::vector<int64_t>(
                                         context.begin() + from, context.end()))
                           .unsqueeze(0)
                           .to(device);
      torch::Tensor logits;
      {
        lamp::AutocastGuard autocast(
            device.type(), precision.dtype, precision.amp);
        logits = model->last_logits(idx).to(torch::kFloat).cpu()[0];
      }
      const auto [top, index] =
          logits.topk(std::min<int64_t>(50, logits.size(0)));
      const auto pick =
          torch::multinomial(torch::softmax(top, 0), 1, false, generator);
      const int64_t token = index[pick.item<int64_t>()].item<int64_t>();
      context.push_back(token);
      sampled.push_back(token);
    }
    std::printf(
        "\ngpt_amp: %lld sampled tokens:\n%s\n",
        static_cast<long long>(n_sample),
        as_text(sampled, config.vocab_size).c_str());
  }
  if (opt.max_loss > 0 && !(final_loss <= opt.max_loss)) {
    if (print) {
      std::fprintf(
          stderr,
          "gpt_amp: FAILED: final loss %.4f > --max-loss %.4f\n",
          final_loss,
          opt.max_loss);
    }
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "Train GPT-2 (nanoGPT's and llm.c's model) with automatic mixed "
      "precision (lamp)"};
  const char* model = examples::kModelGroup;
  const char* speed = examples::kSpeedGroup;
  const char* data = examples::kDataGroup;
  const char* loop = examples::kLoopGroup;
  const char* output = examples::kOutputGroup;
  app.add_option(
         "--model",
         opt.model,
         "gpt2 (124M), gpt2-medium (350M), gpt2-large (774M), gpt2-xl "
         "(1.5B) or tiny (2 layers of 64 on bytes, for the CPU)")
      ->check(CLI::IsMember(
          {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "tiny"}))
      ->capture_default_str()
      ->group(model);
  app.add_option(
         "--vocab-size",
         opt.vocab_size,
         "vocabulary (default: the model's, 50304 or 256 for tiny)")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}))
      ->group(model);
  app.add_option("--dropout", opt.dropout, "dropout probability")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str()
      ->group(model);
  examples::add_precision_flags(
      app,
      opt.precision,
      opt.device,
      {"fp32", "fp16", "bf16", "fp8"},
      "fp32, fp16 (with loss scaling), bf16 (default), or fp8 (bf16 with the "
      "blocks' GEMMs in FP8; Hopper/Ada on a GPU)");
  app.add_option(
         "--fp8-scaling",
         opt.fp8_scaling,
         "--precision fp8: current (each tensor's own amax, torchao's "
         "tensorwise) or delayed (earlier steps' amaxes, Transformer "
         "Engine's DelayedScaling)")
      ->check(CLI::IsMember({"current", "delayed"}))
      ->capture_default_str()
      ->group(speed);
  app.add_option(
         "--fp8-amax-history",
         opt.fp8_amax_history,
         "--fp8-scaling delayed: amaxes kept per tensor")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(speed);
  app.add_flag(
         "--cuda-graph",
         opt.cuda_graph,
         "capture the whole step in a CUDA graph and replay it (GPU only)")
      ->group(speed);
  app.add_option(
         "--activation-checkpointing",
         opt.recompute_blocks,
         "recompute the activations of the first N blocks in the backward "
         "pass instead of keeping them (less memory, ~1/3 more compute), "
         "or of all")
      ->check(CLI::IsMember({"all"}) | examples::NonNegative)
      ->capture_default_str()
      ->group(speed);
  app.add_option(
         "--peak-tflops",
         opt.peak_tflops,
         "the GPU's dense bf16 peak, for MFU (H100/H200 SXM: 989)")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(speed);
  app.add_option(
         "--data",
         opt.data,
         "training tokens: a .bin file in llm.c's layout "
         "(tools/make_tokens.py); default: random tokens")
      ->group(data);
  app.add_option(
         "--val-data",
         opt.val_data,
         "validation tokens (.bin), for the validation loss")
      ->group(data);
  app.add_option(
         "--seq-len",
         opt.seq_len,
         "tokens a sequence (default: the block size, 1024; tiny 64)")
      ->check(examples::Positive)
      ->group(data);
  app.add_option(
         "--batch-size",
         opt.batch_size,
         "sequences a micro-batch, per process (default 16; CPU 4)")
      ->check(examples::Positive)
      ->group(loop);
  app.add_option(
         "--grad-accum",
         opt.grad_accum,
         "micro-batches an optimizer step (gradient accumulation)")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(loop);
  app.add_option(
         "--steps", opt.steps, "timed optimizer steps (default 50; CPU 20)")
      ->check(examples::Positive)
      ->group(loop);
  app.add_option(
         "--warmup",
         opt.warmup,
         "untimed optimizer steps before them (default 10; CPU 2)")
      ->check(examples::NonNegative)
      ->group(loop);
  app.add_option("--lr", opt.lr, "AdamW's learning rate (see --lr-schedule)")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(loop);
  app.add_option(
         "--weight-decay",
         opt.weight_decay,
         "AdamW's weight decay, on matrices and embeddings only")
      ->check(examples::NonNegative)
      ->capture_default_str()
      ->group(loop);
  app.add_option("--seed", opt.seed, "seed of the weights and the data order")
      ->capture_default_str()
      ->group(loop);
  app.add_option(
         "--eval-every",
         opt.eval_every,
         "steps between validation losses (0: only at the end; needs "
         "--val-data)")
      ->check(examples::NonNegative)
      ->capture_default_str()
      ->group(loop);
  app.add_option(
         "--eval-batches",
         opt.eval_batches,
         "validation batches a validation loss")
      ->check(examples::Positive)
      ->capture_default_str()
      ->group(loop);
  opt.run.lr_schedule = "cosine";
  opt.run.clip_grad_norm = 1.0;
  examples::add_run_flags(app, opt.run);
  app.add_option(
         "--sample-tokens",
         opt.sample_tokens,
         "tokens to sample at the end (default: 200 for byte vocabularies, "
         "else 0)")
      ->check(examples::NonNegative)
      ->group(output);
  examples::add_log_flags(
      app,
      opt.log_every,
      opt.metrics,
      "steps between progress and metrics lines");
  app.add_option(
         "--max-loss",
         opt.max_loss,
         "exit 1 if the final training loss is above this (0: no check)")
      ->check(examples::NonNegative)
      ->group(output);
  app.add_option(
         "--trace",
         opt.trace,
         "write a Chrome trace of the last 3 steps' ops and kernels to this "
         "file (tools/trace_summary.py sums it)")
      ->group(output);
  app.add_option(
         "--save-init",
         opt.save_init,
         "write the initial weights to this checkpoint (for "
         "benchmarks/gpt2.py --init)")
      ->group(output);
  examples::add_dist_flags(app, opt.dist);
  CLI11_PARSE(app, argc, argv);
  if (opt.model == "tiny" && opt.seq_len == 0) {
    opt.seq_len = 64;
  }
  if (opt.precision.empty()) {
    opt.precision = "bf16";
  }

  const examples::RunPlace place =
      examples::place_run("gpt_amp", opt.dist, opt.device, opt.cuda_graph);
  if (place.exit_status != 0) {
    return place.exit_status;
  }
  const bool print = examples::rank(place.pg) == 0;
  try {
    examples::JsonLines metrics(print ? opt.metrics : "");
    if (print) {
      std::cout << lamp::build_info() << "\n";
    }
    return run(opt, place, metrics);
  } catch (const std::exception& e) {
    return examples::report_failure("gpt_amp", e);
  }
}
