// One rank of a multi-process test, started by torchrun from ddp_test.cpp
// (`torchrun --no-python --nproc_per_node=N lamp_ddp_worker --out DIR ...`):
// one GPU each over NCCL, or CPU processes over Gloo (`--backend gloo`).
// Each rank writes what it saw to DIR/rank<R>.txt (lines of words) and its
// final parameters to DIR/rank<R>.pt; rank 0 also trains the single-process
// reference on the whole batch (DIR/reference.pt). The test compares them.

#include <lamp/lamp.h>

#if LAMP_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>

namespace {

struct Args {
  std::string out;
  // train | collectives | fp8-amax | fp8-amax-ahead | mismatch | exit |
  // never | graph-exit
  std::string scenario = "train";
  int64_t steps = 12;
  int64_t batch = 32; // per rank
  double bucket_cap_mb = 25;
  double first_bucket_cap_mb = 1;
  bool no_sync = false; // accumulate two micro-batches, the first unsynced
  bool local = false; // --local-sgd: never average, backward under no_sync
  bool fp32 = false; // no autocast, no loss scaling
  bool cuda_graph = false; // steps through lamp::GraphedStep
  bool unused = false; // a parameter used every other step, one never
  bool grad_view = false; // gradient_as_bucket_view + zero_grad(false)
  bool batch_norm = false;
  bool tied = false; // fc2.weight registered a second time, as a tied head
  bool zero_grad_in_step = false; // FusedOptimizer::zero_grad_in_step
  std::string comm_dtype; // "" | fp16 | bf16
  int64_t inject_rank = -1; // rank whose input gets an inf ...
  int64_t inject_step = -1; // ... at this step
  double timeout_s = 60;
  std::string backend = "auto"; // ProcessGroupOptions::backend
};

// Waits for the device's work (a GPU's streams; nothing on the CPU).
void synchronize(const torch::Device& device) {
  if (device.is_cuda()) {
    torch::cuda::synchronize();
  }
}

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i];
    TORCH_CHECK(key.rfind("--", 0) == 0, "unexpected argument ", key);
    key = key.substr(2);
    const bool is_flag =
        i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0;
    kv[key] = is_flag ? "1" : argv[++i];
  }
  auto take = [&](const char* key, auto& field) {
    auto it = kv.find(key);
    if (it == kv.end()) {
      return;
    }
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, std::string>) {
      field = it->second;
    } else if constexpr (std::is_same_v<T, bool>) {
      field = it->second == "1";
    } else if constexpr (std::is_same_v<T, double>) {
      field = std::stod(it->second);
    } else {
      field = std::stoll(it->second);
    }
    kv.erase(it);
  };
  take("out", a.out);
  take("scenario", a.scenario);
  take("steps", a.steps);
  take("batch", a.batch);
  take("bucket-cap-mb", a.bucket_cap_mb);
  take("first-bucket-cap-mb", a.first_bucket_cap_mb);
  take("no-sync", a.no_sync);
  take("local-sgd", a.local);
  take("unused", a.unused);
  take("grad-view", a.grad_view);
  take("batch-norm", a.batch_norm);
  take("tied", a.tied);
  take("zero-grad-in-step", a.zero_grad_in_step);
  take("fp32", a.fp32);
  take("cuda-graph", a.cuda_graph);
  take("comm-dtype", a.comm_dtype);
  take("inject-rank", a.inject_rank);
  take("inject-step", a.inject_step);
  take("timeout-s", a.timeout_s);
  take("backend", a.backend);
  TORCH_CHECK(kv.empty(), "unknown option --", kv.begin()->first);
  TORCH_CHECK(!a.out.empty(), "--out DIR is required");
  return a;
}

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t hidden, bool batch_norm, bool unused, bool tied = false) {
    fc1 = register_module("fc1", torch::nn::Linear(32, hidden));
    if (batch_norm) {
      bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    }
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    if (unused) {
      sometimes =
          register_module("sometimes", torch::nn::Linear(hidden, hidden));
      never = register_module("never", torch::nn::Linear(4, 4));
    }
    head = register_module("head", torch::nn::Linear(hidden, 10));
    if (tied) {
      // A second name for one tensor: parameters() lists it twice.
      register_parameter("fc2_tied_weight", fc2->weight);
    }
  }
  torch::Tensor forward(torch::Tensor x, int64_t step) {
    x = fc1(x);
    if (bn) {
      x = bn(x);
    }
    x = torch::relu(fc2(torch::relu(x)));
    if (sometimes && step % 2 == 0) {
      x = torch::relu(sometimes(x));
    }
    return head(x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, sometimes{nullptr},
      never{nullptr}, head{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

struct Data {
  torch::Tensor x; // [steps, world * batch, 32]
  torch::Tensor y; // [steps, world * batch]
};

Data make_data(const Args& a, int64_t world) {
  torch::manual_seed(1234);
  // Labels from a fixed random teacher, so that there is something to learn.
  const auto x = torch::randn({a.steps, world * a.batch, 32});
  const auto teacher = torch::randn({32, 10});
  Data d{x, x.matmul(teacher).argmax(-1)};
  if (a.inject_rank >= 0) {
    d.x[a.inject_step][a.inject_rank * a.batch][0] =
        std::numeric_limits<float>::infinity();
  }
  return d;
}

struct History {
  std::vector<double> scale, found_inf, loss;
};

// Trains `net` on rows [begin, begin + rows) of every step's batch.
History train(
    Net& net,
    const Data& data,
    int64_t begin,
    int64_t rows,
    const Args& a,
    lamp::DistributedDataParallel* ddp,
    const std::shared_ptr<lamp::dist::ProcessGroup>& scaler_pg) {
  const auto device = net->parameters()[0].device();
  lamp::optim::FusedSGD optimizer(
      net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  optimizer.zero_grad_in_step(a.zero_grad_in_step);
  lamp::GradScaler scaler(lamp::GradScalerOptions()
                              .enabled(!a.fp32)
                              .init_scale(1024)
                              .growth_interval(4)
                              .process_group(scaler_pg));
  const int64_t micro = (ddp && a.no_sync) ? 2 : 1;
  int64_t s = 0;
  // One training step; returns the loss (device tensor, no host sync).
  auto step = [&](const std::vector<torch::Tensor>& in) {
    optimizer.zero_grad(/*set_to_none=*/!a.grad_view);
    torch::Tensor loss_sum;
    for (int64_t m = 0; m < micro; ++m) {
      std::optional<lamp::DistributedDataParallel::NoSyncGuard> no_sync;
      if (ddp && (a.local || m + 1 < micro)) {
        no_sync.emplace(*ddp);
      }
      torch::Tensor loss;
      {
        // NOTE: the CPU's autocast in bf16, its usual precision there.
        lamp::AutocastGuard autocast(
            device.type(),
            device.is_cuda() ? torch::kHalf : torch::kBFloat16,
            !a.fp32);
        loss =
            torch::nn::functional::cross_entropy(
                net->forward(in[0].chunk(micro)[m], s), in[1].chunk(micro)[m]) /
            micro;
      }
      scaler.scale(loss).backward();
      loss_sum = m ? loss_sum + loss.detach() : loss.detach();
    }
    scaler.step(optimizer);
    scaler.update();
    return loss_sum;
  };
  std::optional<lamp::GraphedStep> graphed;
  if (a.cuda_graph) {
    graphed.emplace(
        step,
        std::vector{
            data.x[0].narrow(0, begin, rows).to(device),
            data.y[0].narrow(0, begin, rows).to(device)},
        std::vector<torch::optim::Optimizer*>{&optimizer});
  }
  History h;
  for (s = 0; s < a.steps; ++s) {
    const std::vector<torch::Tensor> batch{
        data.x[s].narrow(0, begin, rows).to(device),
        data.y[s].narrow(0, begin, rows).to(device)};
    const auto loss = graphed ? (*graphed)(batch) : step(batch);
    h.scale.push_back(scaler.get_scale());
    const auto found_inf = scaler.get_found_inf_async();
    h.found_inf.push_back(found_inf.defined() ? found_inf.item<double>() : 0);
    h.loss.push_back(loss.item<double>());
  }
  return h;
}

std::vector<torch::Tensor> to_cpu(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) {
    out.push_back(t.detach().cpu());
  }
  return out;
}

void write_history(std::ofstream& out, const char* prefix, const History& h) {
  for (size_t s = 0; s < h.scale.size(); ++s) {
    out << prefix << " " << s << " " << h.scale[s] << " " << h.found_inf[s]
        << " " << h.loss[s] << "\n";
  }
}

std::string one_line(std::string text) {
  for (auto& c : text) {
    if (c == '\n') {
      c = ' ';
    }
  }
  return text;
}

// "seconds", "error_type" and "error" lines for an error `took` after the
// fault.
void write_error(
    std::ofstream& out,
    const c10::Error& e,
    std::chrono::steady_clock::time_point since) {
  const std::chrono::duration<double> took =
      std::chrono::steady_clock::now() - since;
  out << "seconds " << took.count() << "\n";
  out << "error_type "
      << (dynamic_cast<const c10::DistBackendError*>(&e) ? "DistBackendError"
              : dynamic_cast<const c10::DistStoreError*>(&e) ? "DistStoreError"
                                                             : "Error")
      << "\n";
  out << "error " << one_line(e.what_without_backtrace()) << "\n";
}

lamp::dist::ProcessGroupOptions pg_options(const Args& a) {
  return lamp::dist::ProcessGroupOptions()
      .timeout(
          std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000)))
      .backend(a.backend);
}

int run_train(const Args& a) {
  auto pg = lamp::dist::init_process_group(pg_options(a));
  const auto rank = pg->rank();
  const auto data = make_data(a, pg->world_size());
  torch::manual_seed(42 + rank); // replicas start apart: DDP must fix that
  Net net(64, a.batch_norm, a.unused, a.tied);
  net->to(pg->device());
  auto options = lamp::DDPOptions()
                     .bucket_cap_mb(a.bucket_cap_mb)
                     .first_bucket_cap_mb(a.first_bucket_cap_mb)
                     .find_unused_parameters(a.unused)
                     .gradient_as_bucket_view(a.grad_view);
  if (a.comm_dtype == "fp16") {
    options.comm_dtype(torch::kHalf);
  } else if (a.comm_dtype == "bf16") {
    options.comm_dtype(torch::kBFloat16);
  }
  History h;
  size_t buckets = 0;
  {
    lamp::DistributedDataParallel ddp(net.ptr(), pg, options);
    buckets = ddp.bucket_indices().size();
    h = train(
        net, data, rank * a.batch, a.batch, a, &ddp, a.local ? pg : nullptr);
  }
  std::ofstream out(a.out + "/rank" + std::to_string(rank) + ".txt");
  out << "buckets " << buckets << "\n";
  write_history(out, "ddp", h);
  torch::save(
      to_cpu(net->parameters()),
      a.out + "/rank" + std::to_string(rank) + ".pt");
  torch::save(
      to_cpu(net->buffers()),
      a.out + "/rank" + std::to_string(rank) + "_buffers.pt");
  if (rank == 0 && !a.local) {
    torch::manual_seed(42);
    Net reference(64, a.batch_norm, a.unused, a.tied);
    reference->to(pg->device());
    const auto r = train(
        reference, data, 0, a.batch * pg->world_size(), a, nullptr, nullptr);
    write_history(out, "reference", r);
    torch::save(to_cpu(reference->parameters()), a.out + "/reference.pt");
  }
  out << "done\n";
  return 0;
}

int run_collectives(const Args& a) {
  auto pg = lamp::dist::init_process_group(pg_options(a));
  const auto rank = pg->rank();
  const auto device = pg->device();
  std::ofstream out(a.out + "/rank" + std::to_string(rank) + ".txt");
  auto check = [&](const std::string& name, bool ok) {
    out << "check " << name << " " << (ok ? "ok" : "FAIL") << "\n";
  };
  using lamp::dist::ReduceOp;
  const auto n = static_cast<double>(pg->world_size());
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    const auto name = std::string(c10::toString(dtype));
    auto t = torch::full({5}, rank + 1.0, torch::dtype(dtype).device(device));
    auto sum = t.clone(), avg = t.clone(), max = t.clone();
    pg->allreduce(sum, ReduceOp::kSum);
    pg->allreduce(avg, ReduceOp::kAvg);
    pg->allreduce(max, ReduceOp::kMax);
    check("sum_" + name, sum.eq(n * (n + 1) / 2).all().item<bool>());
    check("avg_" + name, avg.eq((n + 1) / 2).all().item<bool>());
    check("max_" + name, max.eq(n).all().item<bool>());
  }
  auto big = torch::full(
      {3},
      (int64_t{1} << 40) * (rank + 1),
      torch::dtype(torch::kLong).device(device));
  pg->allreduce(big, ReduceOp::kSum);
  const auto triangle = pg->world_size() * (pg->world_size() + 1) / 2;
  check("sum_int64", big.eq(triangle << 40).all().item<bool>());
#if LAMP_WITH_CUDA
  // On a side stream, ordered after the producer by the caller.
  if (device.is_cuda()) {
    auto side = c10::cuda::getStreamFromPool(false, device.index());
    auto t = torch::arange(1000, torch::dtype(torch::kFloat).device(device)) *
        (rank + 1);
    c10::cuda::CUDAEvent produced;
    produced.record(c10::cuda::getCurrentCUDAStream(device.index()));
    produced.block(side);
    pg->allreduce(t, ReduceOp::kSum, side);
    c10::cuda::CUDAEvent reduced;
    reduced.record(side);
    reduced.block(c10::cuda::getCurrentCUDAStream(device.index()));
    check("side_stream", t.equal(torch::arange(1000, t.options()) * triangle));
  }
#endif
  {
    auto a1 = torch::full(
        {4, 3}, rank * 10.0, torch::dtype(torch::kFloat).device(device));
    auto a2 =
        torch::full({7}, rank + 5, torch::dtype(torch::kLong).device(device));
    pg->broadcast({a1, a2}, /*root=*/1);
    check(
        "broadcast_root1",
        a1.eq(10).all().item<bool>() && a2.eq(6).all().item<bool>());
  }
  const auto gathered = pg->allgather("hello from " + std::to_string(rank));
  bool gathered_ok = static_cast<int64_t>(gathered.size()) == pg->world_size();
  for (size_t r = 0; gathered_ok && r < gathered.size(); ++r) {
    gathered_ok = gathered[r] == "hello from " + std::to_string(r);
  }
  check("allgather", gathered_ok);
  pg->barrier();
  check("barrier", true);
  // Bad input is an error, not a hang.
  try {
    pg->allreduce(
        torch::ones({2, 2}, device).t().narrow(0, 0, 1), ReduceOp::kSum);
    check("non_dense_rejected", false);
  } catch (const c10::Error&) {
    check("non_dense_rejected", true);
  }
  if (device.is_cuda()) {
    try {
      pg->allreduce(torch::ones({2}), ReduceOp::kSum);
      check("cpu_tensor_rejected", false);
    } catch (const c10::Error& e) {
      check(
          "cpu_tensor_rejected",
          std::string(e.what()).find("this rank's device") !=
              std::string::npos);
    }
  }
  synchronize(device);
  out << "done\n";
  return 0;
}

int run_mismatch(const Args& a) {
  auto pg = lamp::dist::init_process_group(pg_options(a));
  const auto rank = pg->rank();
  Net net(rank == 1 ? 65 : 64, false, false);
  net->to(pg->device());
  std::ofstream out(a.out + "/rank" + std::to_string(rank) + ".txt");
  const auto start = std::chrono::steady_clock::now();
  try {
    lamp::DistributedDataParallel ddp(net.ptr(), pg);
    out << "no_error\n";
    return 1;
  } catch (const c10::Error& e) {
    const std::chrono::duration<double> took =
        std::chrono::steady_clock::now() - start;
    out << "seconds " << took.count() << "\n";
    out << "error " << one_line(e.what_without_backtrace()) << "\n";
  }
  out << "done\n";
  return 0;
}

// Delayed FP8 scaling with Fp8Recipe::amax_group: each rank's input is
// scaled by rank + 1, so the ranks' amaxes differ. After the second forward
// call (whose update reduces the first step's amaxes) every rank holds the
// first step's largest input amax and the same scales; a layer without the
// group follows its own rank's amaxes. Prints "local A", "reduced A",
// "scales S0 S1 S2", "scales2 ..." (a second layer with the group),
// "own_scale S0" (the layer without the group) and "reductions N" (the
// amax all-reduces made: one a pass once the layers are known). With
// `ahead` (fp8-amax-ahead) each step first calls lamp::update_fp8_scales on
// the two shared layers: one all-reduce a step for both, the same values.
int run_fp8_amax(const Args& a, bool ahead) {
  auto pg = lamp::dist::init_process_group(pg_options(a));
  const auto rank = pg->rank();
  const auto device = pg->device();
  std::ofstream out(a.out + "/rank" + std::to_string(rank) + ".txt");
  out << std::setprecision(9);
  const auto delayed =
      lamp::Fp8Recipe().scaling(lamp::Fp8Scaling::kDelayed).amax_history_len(4);
  const auto shared = lamp::Fp8Recipe(delayed).amax_group(pg);
  torch::manual_seed(3);
  lamp::nn::Linear fc(32, 16), fc2(16, 16), own(32, 16);
  fc->to(device);
  fc2->to(device);
  own->to(device);
  lamp::init_fp8_state(*fc, shared);
  lamp::init_fp8_state(*fc2, shared);
  const auto reductions = lamp::nn::detail::fp8_amax_reduction_count();
  lamp::init_fp8_state(*own, delayed);
  torch::nn::Sequential both(fc, fc2);
  torch::manual_seed(10 + rank);
  float local = 0;
  for (int step = 0; step < 2; ++step) {
    const auto x = torch::randn({16, 32}, device) * (rank + 1);
    if (step == 0) {
      local = x.abs().max().item<float>();
    }
    {
      lamp::Fp8AutocastGuard fp8(shared);
      if (ahead) {
        lamp::update_fp8_scales(*both);
      }
      fc2(fc(x)).square().sum().backward();
    }
    lamp::Fp8AutocastGuard fp8(delayed);
    own(x).square().sum().backward();
  }
  const auto scale = fc->fp8_scale.cpu();
  out << "local " << local << "\n";
  // NOTE: the update rolls the history as Transformer Engine's does: the
  // amaxes it reduced are in the last column now, column 0 records anew.
  out << "reduced " << fc->fp8_amax_history[0][-1].item<float>() << "\n";
  out << "scales " << scale[0].item<float>() << " " << scale[1].item<float>()
      << " " << scale[2].item<float>() << "\n";
  const auto scale2 = fc2->fp8_scale.cpu();
  out << "scales2 " << scale2[0].item<float>() << " " << scale2[1].item<float>()
      << " " << scale2[2].item<float>() << "\n";
  out << "own_scale " << own->fp8_scale[0].item<float>() << "\n";
  out << "reductions "
      << lamp::nn::detail::fp8_amax_reduction_count() - reductions << "\n";
  out << "done\n";
  return 0;
}

// What the rank-exits scenarios share: the group, a seeded Net wrapped in
// DDP with plain SGD, one batch, this rank's output file (members in the
// order they are made, so every rank draws the same weights and batch).
struct ExitRun {
  explicit ExitRun(const Args& a)
      : pg(lamp::dist::init_process_group(pg_options(a))),
        rank(pg->rank()),
        net(seeded_net(pg->device())),
        ddp(net.ptr(), pg),
        optimizer(net->parameters(), torch::optim::SGDOptions(0.01)),
        out(a.out + "/rank" + std::to_string(rank) + ".txt"),
        x(torch::randn({a.batch, 32}, pg->device())),
        y(torch::randint(
            0,
            10,
            {a.batch},
            torch::dtype(torch::kLong).device(pg->device()))) {}

  static Net seeded_net(const torch::Device& device) {
    torch::manual_seed(42);
    Net net(64, false, false);
    net->to(device);
    return net;
  }

  std::shared_ptr<lamp::dist::ProcessGroup> pg;
  int64_t rank;
  Net net;
  lamp::DistributedDataParallel ddp;
  lamp::optim::FusedSGD optimizer;
  std::ofstream out;
  torch::Tensor x, y;
};

int run_exit(const Args& a) {
  ExitRun run(a);
  auto& [pg, rank, net, ddp, optimizer, out, x, y] = run;
  (void)ddp;
  auto left = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < 1000; ++s) {
    if (s == 3) {
      if (rank == 1) {
        out << "exiting\n";
        out.close();
        std::_Exit(0);
      }
      left = std::chrono::steady_clock::now();
    }
    try {
      optimizer.zero_grad();
      torch::nn::functional::cross_entropy(net->forward(x, s), y).backward();
      optimizer.step();
      synchronize(pg->device());
    } catch (const c10::Error& e) {
      out << "failed_at_step " << s << "\n";
      write_error(out, e, left);
      out << "done\n";
      return 0;
    }
  }
  out << "no_error\n";
  return 1;
}

// Rank 1 never calls the first collective (it waits on the store until rank
// 0 is done): rank 0's allreduce, blocked on the host connecting to rank 1
// or on the device waiting for it, must fail within the timeout.
int run_never(const Args& a) {
  auto pg = lamp::dist::init_process_group(pg_options(a));
  const auto rank = pg->rank();
  std::ofstream out(a.out + "/rank" + std::to_string(rank) + ".txt");
  auto& store = *pg->store();
  if (rank == 1) {
    store.wait({"test/rank0_finished"}, std::chrono::seconds(120));
    out << "waited\n";
    out << "done\n";
    return 0; // the destructor's shutdown is bounded by the timeout too
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    auto t = torch::ones({1 << 20}, pg->device());
    pg->allreduce(t, lamp::dist::ReduceOp::kSum);
    synchronize(pg->device());
    pg->check();
    out << "no_error\n";
  } catch (const c10::Error& e) {
    write_error(out, e, start);
  }
  store.set("test/rank0_finished", std::vector<uint8_t>{'1'});
  out << "done\n";
  return 0;
}

// Both ranks train through lamp::GraphedStep (DDP's allreduce inside the
// graph); rank 1 exits after the capture. Rank 0's replays must not wait
// forever: the watchdog watches them and the next step throws.
int run_graph_exit(const Args& a) {
  ExitRun run(a);
  auto& [pg, rank, net, ddp, optimizer, out, x, y] = run;
  (void)ddp;
  lamp::GraphedStep graphed(
      // NOTE: C++17 lambdas capture no structured binding: `run`'s members.
      [&run](const std::vector<torch::Tensor>& in) {
        run.optimizer.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(
            run.net->forward(in[0], 0), in[1]);
        loss.backward();
        run.optimizer.step();
        return loss.detach();
      },
      {x, y},
      {&optimizer});
  auto left = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < 1000; ++s) {
    if (s == 6) {
      if (rank == 1) {
        out << "exiting\n";
        out.close();
        std::_Exit(0);
      }
      left = std::chrono::steady_clock::now();
    }
    try {
      (void)graphed({x, y}).item<double>();
    } catch (const c10::Error& e) {
      out << "captured " << graphed.is_captured() << "\n";
      out << "failed_at_step " << s << "\n";
      write_error(out, e, left);
      out << "done\n";
      return 0;
    }
  }
  out << "no_error\n";
  return 1;
}

} // namespace

int main(int argc, char** argv) {
  try {
    const auto a = parse(argc, argv);
    if (a.scenario == "train") {
      return run_train(a);
    }
    if (a.scenario == "collectives") {
      return run_collectives(a);
    }
    if (a.scenario == "fp8-amax" || a.scenario == "fp8-amax-ahead") {
      return run_fp8_amax(a, a.scenario == "fp8-amax-ahead");
    }
    if (a.scenario == "mismatch") {
      return run_mismatch(a);
    }
    if (a.scenario == "exit") {
      return run_exit(a);
    }
    if (a.scenario == "never") {
      return run_never(a);
    }
    if (a.scenario == "graph-exit") {
      return run_graph_exit(a);
    }
    std::cerr << "unknown scenario " << a.scenario << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "lamp_ddp_worker: " << e.what() << "\n";
    return 1;
  }
}
