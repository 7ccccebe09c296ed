#pragma once

// The harness shared by the standalone cuDNN probes
// (benchmarks/dbn_weight_probe.cpp, benchmarks/mlperf_form_probe.cpp):
// CUDA runtime + cuDNN + the header-only cudnn-frontend, no LibTorch.
//
//   - ResNet-50's distinct convolutions (bn_fusion_probe.py's LAYERS) with
//     their counts, whether the input is a BatchNorm+ReLU output and what
//     follows the output's BatchNorm;
//   - status checks that throw (each probe catches per graph, prints what
//     failed and carries on), device buffers, fp16 on the host, random
//     operands cut from one N(0, 1) pool;
//   - GraphBuilder: a cudnn-frontend graph, its variant pack, and the plan
//     choice (heuristics A then FALLBACK, the first --plans plans built in
//     parallel, the fastest of them kept);
//   - timing: runs queued behind a host-function gate, a CUDA event
//     between runs, the median interval (see gated_median_us);
//   - the flags both probes take, the device banner, the CSV.
//
// Everything is inline in namespace cudnn_probe so that a probe that uses
// only part of it compiles without unused-function warnings.

#include <cudnn_frontend.h>

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

// ---------------------------------------------------------------- errors

#define CUDA_OK(x)                                          \
  do {                                                      \
    cudaError_t e_ = (x);                                   \
    if (e_ != cudaSuccess)                                  \
      throw std::runtime_error(                             \
          std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define CUDNN_OK(x)                                          \
  do {                                                       \
    cudnnStatus_t s_ = (x);                                  \
    if (s_ != CUDNN_STATUS_SUCCESS)                          \
      throw std::runtime_error(                              \
          std::string(#x) + ": " + cudnnGetErrorString(s_)); \
  } while (0)
#define FE_OK(x)                                                           \
  do {                                                                     \
    auto s_ = (x);                                                         \
    if (s_.is_bad())                                                       \
      throw std::runtime_error(std::string(#x) + ": " + s_.get_message()); \
  } while (0)

namespace cudnn_probe {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

constexpr double kEps = 1e-5;

// ------------------------------------------------------------ the network

// What follows a convolution's BatchNorm in ResNet-50's bottleneck blocks.
enum class After {
  kRelu, // bn1, bn2: BatchNorm + ReLU, read by the next convolution
  kAddRelu, // bn3: BatchNorm + the shortcut + ReLU (the block's output)
  kNone, // the downsample's BatchNorm: its output is bn3's shortcut
};

// bn_fusion_probe.py's LAYERS: (in channels, out channels, kernel, stride,
// input H=W, count in ResNet-50, input is a BatchNorm+ReLU output), plus
// what follows the output's BatchNorm. The stem (3->64 7x7/2) is not here.
struct Layer {
  int cin, cout, k, stride, hw, count;
  bool bn_relu_input;
  After after;
};
inline constexpr Layer kLayers[] = {
    // layer1 (56x56)
    {64, 64, 1, 1, 56, 1, false, After::kRelu}, // block 0 conv1 (after the
                                                // stem's pool)
    {256, 64, 1, 1, 56, 2, false, After::kRelu}, // conv1 of blocks 1-2
    {64, 64, 3, 1, 56, 3, true, After::kRelu}, // conv2
    {64, 256, 1, 1, 56, 3, true, After::kAddRelu}, // conv3
    {64, 256, 1, 1, 56, 1, false, After::kNone}, // downsample
    // layer2 (28x28)
    {256, 128, 1, 1, 56, 1, false, After::kRelu},
    {512, 128, 1, 1, 28, 3, false, After::kRelu},
    {128, 128, 3, 2, 56, 1, true, After::kRelu},
    {128, 128, 3, 1, 28, 3, true, After::kRelu},
    {128, 512, 1, 1, 28, 4, true, After::kAddRelu},
    {256, 512, 1, 2, 56, 1, false, After::kNone},
    // layer3 (14x14)
    {512, 256, 1, 1, 28, 1, false, After::kRelu},
    {1024, 256, 1, 1, 14, 5, false, After::kRelu},
    {256, 256, 3, 2, 28, 1, true, After::kRelu},
    {256, 256, 3, 1, 14, 5, true, After::kRelu},
    {256, 1024, 1, 1, 14, 6, true, After::kAddRelu},
    {512, 1024, 1, 2, 28, 1, false, After::kNone},
    // layer4 (7x7)
    {1024, 512, 1, 1, 14, 1, false, After::kRelu},
    {2048, 512, 1, 1, 7, 2, false, After::kRelu},
    {512, 512, 3, 2, 14, 1, true, After::kRelu},
    {512, 512, 3, 1, 7, 2, true, After::kRelu},
    {512, 2048, 1, 1, 7, 3, true, After::kAddRelu},
    {1024, 2048, 1, 2, 14, 1, false, After::kNone},
};
inline constexpr int kNumLayers =
    static_cast<int>(sizeof(kLayers) / sizeof(kLayers[0]));

// "| cin | cout | k | s | hw | count |", a table row's first cells.
inline std::string layer_cells(const Layer& L) {
  char b[96];
  std::snprintf(
      b,
      sizeof b,
      "| %d | %d | %d | %d | %d | %d |",
      L.cin,
      L.cout,
      L.k,
      L.stride,
      L.hw,
      L.count);
  return b;
}

// "bs64 64->64 3x3/1 56x56", how notes name a layer.
inline std::string layer_tag(int n, const Layer& L) {
  char b[96];
  std::snprintf(
      b,
      sizeof b,
      "bs%d %d->%d %dx%d/%d %dx%d",
      n,
      L.cin,
      L.cout,
      L.k,
      L.k,
      L.stride,
      L.hw,
      L.hw);
  return b;
}

// One line, long messages cut in the middle (check_support lists every
// plan's reason; the last line holds cuDNN's own).
inline std::string one_line(std::string s, size_t keep = 420) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t')
      c = ' ';
  if (s.size() > keep)
    s = s.substr(0, keep / 2) + " ... " + s.substr(s.size() - keep / 2);
  return s;
}

// ------------------------------------------------------------ fp16 on host

inline uint16_t f2h(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t e8 = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (e8 == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int32_t exp = static_cast<int32_t>(e8) - 127 + 15;
  if (exp >= 31)
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10)
      return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    int shift = 14 - exp;
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1),
             half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u)))
      ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
    ++h; // may carry into the exponent: right
  return static_cast<uint16_t>(h);
}

inline float h2f_slow(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  uint32_t x = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                         : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline const std::vector<float>& h2f_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(65536);
    for (uint32_t i = 0; i < 65536; ++i)
      v[i] = h2f_slow(static_cast<uint16_t>(i));
    return v;
  }();
  return t;
}
inline float h2f(uint16_t h) {
  return h2f_table()[h];
}

// ------------------------------------------------------------------ random

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() { // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() {
    return (next() >> 11) * (1.0 / 9007199254740992.0);
  }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300)
      u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// ----------------------------------------------------------- device memory

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) {
    alloc(n);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    reset();
  }
  void alloc(size_t n) {
    reset();
    if (n == 0)
      return;
    CUDA_OK(cudaMalloc(&p, n));
    bytes = n;
    CUDA_OK(cudaMemset(p, 0, n)); // on the legacy stream, which the probe's
    CUDA_OK(cudaDeviceSynchronize()); // non-blocking stream does not wait for
  }
  void reset() {
    if (p)
      cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
};

inline void upload(DevBuf& b, const void* host, size_t bytes) {
  b.alloc(bytes);
  CUDA_OK(cudaMemcpy(b.p, host, bytes, cudaMemcpyHostToDevice));
}
inline std::vector<uint16_t> to_host_half(const DevBuf& b, size_t n) {
  std::vector<uint16_t> v(n);
  CUDA_OK(cudaMemcpy(v.data(), b.p, n * 2, cudaMemcpyDeviceToHost));
  return v;
}
inline std::vector<float> to_host_float(const DevBuf& b, size_t n) {
  std::vector<float> v(n);
  CUDA_OK(cudaMemcpy(v.data(), b.p, n * 4, cudaMemcpyDeviceToHost));
  return v;
}

// A pool of N(0, 1) values, on the host as float and on the device as fp16,
// from which the large random operands are cut.
constexpr size_t kPool = size_t(1) << 24;
struct Pool {
  std::vector<float> host;
  DevBuf dev;
  Pool() : host(kPool) {
    Rng r(12345);
    std::vector<uint16_t> h(kPool);
    for (size_t i = 0; i < kPool; ++i) {
      host[i] = static_cast<float>(r.normal());
      h[i] = f2h(host[i]);
    }
    dev.alloc(kPool * 2);
    CUDA_OK(cudaMemcpy(dev.p, h.data(), kPool * 2, cudaMemcpyHostToDevice));
  }
  // Fills count fp16 values at dst from the device pool, starting at offset.
  void fill(void* dst, size_t count, size_t offset) const {
    auto* d = static_cast<char*>(dst);
    size_t off = offset % (kPool / 2);
    while (count) {
      size_t chunk = std::min(count, kPool - off);
      CUDA_OK(cudaMemcpy(
          d,
          static_cast<const char*>(dev.p) + off * 2,
          chunk * 2,
          cudaMemcpyDeviceToDevice));
      d += chunk * 2;
      count -= chunk;
      off = (off + 7919) % (kPool / 2);
    }
    CUDA_OK(cudaDeviceSynchronize()); // device-to-device copies do not block
                                      // the host
  }
};

// ------------------------------------------------------------- one layer

inline std::vector<int64_t> nhwc_stride(int64_t c, int64_t h, int64_t w) {
  return {c * h * w, 1, c * w, c};
}

// One convolution at one batch size: x (N, cin, hw, hw) NHWC, w (cout,
// cin, k, k) KRSC, y and dy (N, cout, ho, ho) NHWC.
struct Problem {
  int64_t n, cin, cout, k, s, pad, hw, ho;
  size_t x_elems() const {
    return static_cast<size_t>(n * cin * hw * hw);
  }
  size_t dy_elems() const {
    return static_cast<size_t>(n * cout * ho * ho);
  }
  size_t w_elems() const {
    return static_cast<size_t>(cout * cin * k * k);
  }
  std::vector<int64_t> x_dim() const {
    return {n, cin, hw, hw};
  }
  std::vector<int64_t> x_stride() const {
    return nhwc_stride(cin, hw, hw);
  }
  std::vector<int64_t> y_dim() const {
    return {n, cout, ho, ho};
  }
  std::vector<int64_t> y_stride() const {
    return nhwc_stride(cout, ho, ho);
  }
  std::vector<int64_t> w_dim() const {
    return {cout, cin, k, k};
  }
  std::vector<int64_t> w_stride() const {
    return {cin * k * k, 1, cin * k, cin};
  }
};

inline Problem make_problem(int n, const Layer& L) {
  Problem p{n, L.cin, L.cout, L.k, L.stride, L.k / 2, L.hw, 0};
  p.ho = (p.hw + 2 * p.pad - p.k) / p.s + 1;
  return p;
}

// The layer's weights, KRSC fp16: N(0, 1 / fan-in).
inline std::vector<uint16_t> random_weights(Rng& r, const Problem& p) {
  const double wscale = 1.0 / std::sqrt(static_cast<double>(p.cin * p.k * p.k));
  std::vector<uint16_t> w(p.w_elems());
  for (auto& v : w)
    v = f2h(static_cast<float>(r.normal() * wscale));
  return w;
}

// count N(0, 1) fp16 values from the pool into b (allocated here), from an
// offset r draws.
inline void random_fill(const Pool& pool, Rng& r, DevBuf& b, size_t count) {
  b.alloc(count * 2);
  pool.fill(b.p, count, static_cast<size_t>(r.next() % kPool));
}

// ----------------------------------------------------------------- timing

struct Ctx {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  int iters = 20, plans = 8;
  double gate_ms = 5.0;
};

struct Timing {
  double us = NAN;
  bool host_bound = false; // the host queued slower than the gate held
};

inline void gate_fn(void* ms) {
  std::this_thread::sleep_for(std::chrono::microseconds(
      static_cast<int64_t>(*static_cast<double*>(ms) * 1000.0)));
}

// Median of `iters` runs of fn, each between two events, all queued behind
// a host-function gate so that the GPU runs them back to back.
inline Timing gated_median_us(
    const Ctx& ctx,
    const std::function<void()>& fn,
    int iters) {
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev)
    CUDA_OK(cudaEventCreate(&e));
  Timing t;
  std::string err;
  try {
    double gate = ctx.gate_ms;
    CUDA_OK(cudaLaunchHostFunc(ctx.stream, gate_fn, &gate));
    auto t0 = std::chrono::steady_clock::now();
    CUDA_OK(cudaEventRecord(ev[0], ctx.stream));
    for (int i = 0; i < iters; ++i) {
      fn();
      CUDA_OK(cudaEventRecord(ev[i + 1], ctx.stream));
    }
    double queued_ms = std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
    t.host_bound = queued_ms > gate;
    CUDA_OK(cudaStreamSynchronize(ctx.stream)); // `gate` lives until here
    std::vector<double> d(iters);
    for (int i = 0; i < iters; ++i) {
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
      d[i] = ms * 1000.0;
    }
    std::nth_element(d.begin(), d.begin() + iters / 2, d.end());
    t.us = iters % 2 ? d[iters / 2]
                     : 0.5 *
            (d[iters / 2] +
             *std::max_element(d.begin(), d.begin() + iters / 2));
  } catch (const std::exception& e) {
    err = e.what();
    cudaStreamSynchronize(ctx.stream);
  }
  for (auto& e : ev)
    cudaEventDestroy(e);
  if (!err.empty())
    throw std::runtime_error(err);
  return t;
}

// 3 warm-up runs, then ctx.iters gated runs: the median.
inline Timing time_runs(const Ctx& ctx, const std::function<void()>& run) {
  for (int i = 0; i < 3; ++i)
    run();
  CUDA_OK(cudaStreamSynchronize(ctx.stream));
  return gated_median_us(ctx, run, ctx.iters);
}

// ------------------------------------------------------------- the graphs

// A graph with its variant pack and the plan kept.
struct Built {
  std::shared_ptr<fe::graph::Graph> g;
  std::unordered_map<int64_t, void*> pack;
  int64_t plan = -1, plans_total = 0, plans_built = 0;
  std::string plan_name;
  DevBuf ws;

  void run(const Ctx& ctx) {
    FE_OK(g->execute_plan_at_index(ctx.handle, pack, ws.p, plan));
  }
  // Runs the kept plan once with some buffers swapped for others (the
  // numerics checks feed a graph other inputs), then waits for it.
  void run_swapped(
      const Ctx& ctx,
      const std::vector<std::pair<const void*, void*>>& swaps) {
    std::unordered_map<int64_t, void*> p = pack;
    for (auto& [uid, ptr] : p)
      for (auto& [from, to] : swaps)
        if (ptr == from)
          ptr = to;
    FE_OK(g->execute_plan_at_index(ctx.handle, p, ws.p, plan));
    CUDA_OK(cudaStreamSynchronize(ctx.stream));
  }
};

inline Timing measure(const Ctx& ctx, Built& b) {
  return time_runs(ctx, [&] { b.run(ctx); });
}

// "plan name (b built of t[, HOST-BOUND])", how the notes name a plan.
inline std::string plan_summary(const Built& b, const Timing& t) {
  return b.plan_name + " (" + std::to_string(b.plans_built) + " built of " +
      std::to_string(b.plans_total) + (t.host_bound ? ", HOST-BOUND" : "") +
      ")";
}

// Builds one cudnn-frontend graph: tensors with their device pointers, then
// finish() picks its plan.
class GraphBuilder {
 public:
  GraphBuilder(fe::DataType_t io, fe::DataType_t intermediate)
      : b_(std::make_unique<Built>()) {
    b_->g = std::make_shared<fe::graph::Graph>();
    b_->g->set_io_data_type(io)
        .set_intermediate_data_type(intermediate)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  }

  fe::graph::Graph& graph() {
    return *b_->g;
  }

  TensorPtr tensor(
      const char* name,
      std::vector<int64_t> dim,
      std::vector<int64_t> stride,
      void* ptr,
      fe::DataType_t dt = fe::DataType_t::NOT_SET) {
    auto a =
        fe::graph::Tensor_attributes().set_name(name).set_dim(dim).set_stride(
            stride);
    if (dt != fe::DataType_t::NOT_SET)
      a.set_data_type(dt);
    auto T = b_->g->tensor(a);
    pack_[T] = ptr;
    return T;
  }

  // A per-channel (1, c, 1, 1) tensor.
  TensorPtr channels(
      const char* name,
      int64_t c,
      void* ptr,
      fe::DataType_t dt = fe::DataType_t::NOT_SET) {
    return tensor(name, {1, c, 1, 1}, {c, 1, c, c}, ptr, dt);
  }

  TensorPtr pw(
      const char* name,
      fe::PointwiseMode_t mode,
      TensorPtr a,
      TensorPtr b) {
    return b_->g->pointwise(
        a, b, fe::graph::Pointwise_attributes().set_name(name).set_mode(mode));
  }
  TensorPtr pw(const char* name, fe::PointwiseMode_t mode, TensorPtr a) {
    return b_->g->pointwise(
        a, fe::graph::Pointwise_attributes().set_name(name).set_mode(mode));
  }

  void output(
      TensorPtr T,
      void* ptr,
      fe::DataType_t dt = fe::DataType_t::NOT_SET) {
    T->set_output(true);
    if (dt != fe::DataType_t::NOT_SET)
      T->set_data_type(dt);
    pack_[T] = ptr;
  }

  // Validates and lowers the graph, builds the first ctx.plans plans of
  // heuristics A then FALLBACK (in parallel threads, as
  // samples/cpp/misc/parallel_compilation.cpp) and keeps the fastest of
  // them (5 timed runs each). Throws when none builds or runs.
  std::unique_ptr<Built> finish(const Ctx& ctx) {
    fe::graph::Graph& g = *b_->g;
    FE_OK(g.validate());
    FE_OK(g.build_operation_graph(ctx.handle));
    FE_OK(g.create_execution_plans(
        {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
    FE_OK(g.check_support());
    for (auto& [T, ptr] : pack_)
      b_->pack[T->get_uid()] = ptr;

    // The first ctx.plans plans, built in parallel; if none of them builds,
    // the next ones one by one until one does.
    const int64_t total = g.get_execution_plan_count();
    b_->plans_total = total;
    const int64_t first = std::min<int64_t>(total, ctx.plans);
    std::vector<char> ok(static_cast<size_t>(total), 0);
    {
      std::vector<std::thread> threads;
      for (int64_t i = 0; i < first; ++i)
        threads.emplace_back(
            [&g, &ok, i] { ok[i] = g.build_plan_at_index(i).is_good(); });
      for (auto& t : threads)
        t.join();
    }
    int64_t built = std::count(ok.begin(), ok.end(), 1);
    for (int64_t i = first; built == 0 && i < total; ++i)
      if ((ok[i] = g.build_plan_at_index(i).is_good()))
        ++built;
    b_->plans_built = built;
    if (built == 0)
      throw std::runtime_error(
          "no plan built (" + std::to_string(total) + " candidates)");

    double best = INFINITY;
    std::string why;
    for (int64_t i = 0; i < total; ++i) {
      if (!ok[i])
        continue;
      try {
        int64_t ws = 0;
        FE_OK(g.get_workspace_size_plan_at_index(i, ws));
        if (static_cast<size_t>(ws) > b_->ws.bytes)
          b_->ws.alloc(static_cast<size_t>(ws));
        auto run = [&] {
          FE_OK(g.execute_plan_at_index(ctx.handle, b_->pack, b_->ws.p, i));
        };
        run();
        CUDA_OK(cudaStreamSynchronize(ctx.stream));
        double t = gated_median_us(ctx, run, 5).us;
        if (t < best) {
          best = t;
          b_->plan = i;
        }
      } catch (const std::exception& e) {
        why = e.what();
        cudaGetLastError();
      }
    }
    if (b_->plan < 0)
      throw std::runtime_error("no built plan ran: " + why);
    if (g.get_plan_name_at_index(b_->plan, b_->plan_name).is_bad())
      b_->plan_name = "plan " + std::to_string(b_->plan);
    return std::move(b_);
  }

 private:
  std::unique_ptr<Built> b_;
  std::unordered_map<TensorPtr, void*> pack_;
};

// The layer's x, y/dy and w tensors (NHWC, KRSC).
inline TensorPtr x_tensor(
    GraphBuilder& gb,
    const char* name,
    const Problem& p,
    void* ptr) {
  return gb.tensor(name, p.x_dim(), p.x_stride(), ptr);
}
inline TensorPtr y_tensor(
    GraphBuilder& gb,
    const char* name,
    const Problem& p,
    void* ptr) {
  return gb.tensor(name, p.y_dim(), p.y_stride(), ptr);
}
inline TensorPtr w_tensor(GraphBuilder& gb, const Problem& p, void* ptr) {
  return gb.tensor("weight", p.w_dim(), p.w_stride(), ptr);
}

// The layer's padding, stride and dilation on a convolution node's
// attributes.
template <class Attributes>
Attributes conv_attributes(const char* name, const Problem& p) {
  Attributes a;
  a.set_name(name)
      .set_padding({p.pad, p.pad})
      .set_stride({p.s, p.s})
      .set_dilation({1, 1});
  return a;
}

// dz = conv_dgrad(dy, w), as samples/cpp/convolution/dgrads.cpp builds it.
inline TensorPtr conv_dgrad(
    GraphBuilder& gb,
    const Problem& p,
    void* dy,
    void* w) {
  auto DY = y_tensor(gb, "grad", p, dy);
  auto W = w_tensor(gb, p, w);
  auto DZ = gb.graph().conv_dgrad(
      DY, W, conv_attributes<fe::graph::Conv_dgrad_attributes>("dgrad", p));
  DZ->set_dim(p.x_dim()).set_stride(p.x_stride());
  return DZ;
}

// ------------------------------------------------------------ one result

// One graph on one layer: its median time and plan, or why it has none.
struct Cell {
  bool ran = false;
  double us = NAN;
  std::string plan; // plan_summary(), for the notes
  std::string plan_name; // the plan's own name, for the CSV
  std::string why; // why it did not run
};

// Runs f (which builds and times something); a failure becomes the cell's
// reason, and CUDA's error state is cleared so that the next graph runs.
inline Cell attempt(const Ctx& ctx, const std::function<Cell()>& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    cudaGetLastError();
    cudaStreamSynchronize(ctx.stream);
    Cell c;
    c.why = one_line(e.what());
    return c;
  }
}

// Times a built graph into a cell.
inline Cell timed(const Ctx& ctx, Built& b) {
  Timing t = measure(ctx, b);
  Cell c;
  c.ran = true;
  c.us = t.us;
  c.plan = plan_summary(b, t);
  c.plan_name = b.plan_name;
  return c;
}

inline std::string fmt_us(double us) {
  if (std::isnan(us))
    return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", us);
  return b;
}

// ---------------------------------------------------------------- numerics

struct ErrStat {
  double max_abs = 0, max_ref = 0, se = 0, sr = 0;
  size_t n = 0, far = 0; // far: errors over 1% of max |ref| (ReLU mask flips)
  void add(double got, double ref) {
    double d = std::fabs(got - ref);
    max_abs = std::max(max_abs, d);
    max_ref = std::max(max_ref, std::fabs(ref));
    se += d * d;
    sr += ref * ref;
    ++n;
  }
  void count_far(double got, double ref, double limit) {
    far += std::fabs(got - ref) > limit;
  }
  void print(const char* graph, const char* what) const {
    std::printf(
        "| %s | %s | %.3g | %.3g | %.3g | %.3g | %zu of %zu |\n",
        graph,
        what,
        max_abs,
        max_ref,
        max_ref > 0 ? max_abs / max_ref : 0.0,
        sr > 0 ? std::sqrt(se / sr) : 0.0,
        far,
        n);
  }
};

// got against ref element by element, "far" counted at 1% of max |ref|.
template <class Got, class Ref>
ErrStat compare(const Got& got, const Ref& ref) {
  ErrStat e;
  const size_t n = std::min<size_t>(got.size(), ref.size());
  for (size_t i = 0; i < n; ++i)
    e.add(got[i], ref[i]);
  for (size_t i = 0; i < n; ++i)
    e.count_far(got[i], ref[i], 0.01 * e.max_ref);
  return e;
}

// fp16 values as doubles, for compare().
inline std::vector<double> widen(const std::vector<uint16_t>& h) {
  std::vector<double> v(h.size());
  for (size_t i = 0; i < h.size(); ++i)
    v[i] = h2f(h[i]);
  return v;
}

inline void print_err_header() {
  std::printf(
      "| graph | output | max abs err | max abs ref | max err / max abs ref | rel err (L2) | "
      "elements off by > 1%% of max abs ref |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
}

// ------------------------------------------------------------------ flags

// The flags both probes take.
struct Options {
  std::vector<int> batches{64, 256};
  std::vector<int> layers; // --layers: indices into the probe's table
  int check_layer = 0;
  std::string csv_path;
};

// Exits with status 2 after a one-line message (bad flags and values).
[[noreturn]] inline void usage_error(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::exit(2);
}

inline int parse_int(const std::string& flag, const std::string& s) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size())
    usage_error(flag + ": '" + s + "' is not a whole number");
  return v;
}

inline std::vector<int> parse_ints(
    const std::string& flag,
    const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ','))
    if (!tok.empty())
      v.push_back(parse_int(flag, tok));
  return v;
}

// Parses argv into o and ctx. `usage` is what follows "usage: <program> ";
// `extra(flag, value)` takes a probe's own flags (value() reads the next
// argument) and returns false for a flag it does not know. --help prints
// the usage and exits 0; an unknown flag or a bad value exits 2.
inline void parse_args(
    int argc,
    char** argv,
    const char* usage,
    Options& o,
    Ctx& ctx,
    const std::function<
        bool(const std::string&, const std::function<std::string()>&)>& extra =
        {}) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::function<std::string()> val = [&]() -> std::string {
      if (i + 1 >= argc)
        usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf("usage: %s %s\n", argv[0], usage);
      std::exit(0);
    } else if (a == "--batch-sizes")
      o.batches = parse_ints(a, val());
    else if (a == "--iters")
      ctx.iters = parse_int(a, val());
    else if (a == "--plans")
      ctx.plans = parse_int(a, val());
    else if (a == "--check-layer")
      o.check_layer = parse_int(a, val());
    else if (a == "--layers")
      o.layers = parse_ints(a, val());
    else if (a == "--csv")
      o.csv_path = val();
    else if (a == "--gate-ms") {
      std::string v = val();
      char* end = nullptr;
      ctx.gate_ms = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(ctx.gate_ms >= 0))
        usage_error(a + ": '" + v + "' is not a number of milliseconds");
    } else if (!extra || !extra(a, val)) {
      std::fprintf(
          stderr, "unknown flag %s; usage: %s %s\n", a.c_str(), argv[0], usage);
      std::exit(2);
    }
  }
  if (o.batches.empty() ||
      std::any_of(
          o.batches.begin(), o.batches.end(), [](int n) { return n <= 0; }))
    usage_error("--batch-sizes: positive whole numbers, e.g. 64,256");
  if (ctx.iters < 1 || ctx.plans < 1)
    usage_error("--iters and --plans take a number >= 1");
}

// Whether --layers selects row i of the probe's table (all rows without
// --layers).
inline bool selected(const Options& o, int i) {
  return o.layers.empty() ||
      std::find(o.layers.begin(), o.layers.end(), i) != o.layers.end();
}

// ----------------------------------------------------------------- device

// No GPU (or no driver for it): the probe exits 77, as a skipped test.
struct NoDevice : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Creates the probe's non-blocking stream and cuDNN handle on device 0 and
// prints the banner.
inline void open_device(Ctx& ctx) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0)
    throw NoDevice(
        std::string("no usable CUDA device (cudaGetDeviceCount: ") +
        (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  CUDA_OK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  CUDNN_OK(cudnnCreate(&ctx.handle));
  CUDNN_OK(cudnnSetStream(ctx.handle, ctx.stream));
  std::printf(
      "# %s (sm_%d%d), CUDA runtime %d, cuDNN %zu (headers %d), cudnn-frontend %d; fp16 NHWC, "
      "fp32 compute; %d timed runs (median), first %d plans of heuristics A + FALLBACK\n",
      prop.name,
      prop.major,
      prop.minor,
      rt,
      cudnnGetVersion(),
      CUDNN_VERSION,
      CUDNN_FRONTEND_VERSION,
      ctx.iters,
      ctx.plans);
}

// Runs a probe's body: "fatal: ..." and status 1 on an error, 77 without a
// GPU.
inline int run_main(const std::function<void()>& body) {
  try {
    body();
  } catch (const NoDevice& e) {
    std::printf("fatal: %s\n", one_line(e.what(), 2000).c_str());
    return 77;
  } catch (const std::exception& e) {
    std::printf("fatal: %s\n", one_line(e.what(), 2000).c_str());
    return 1;
  }
  return 0;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// -------------------------------------------------------------------- CSV

// batch,cin,cout,k,stride,hw,count,graph,us,plan: one row a graph and
// layer ("nan" and no plan where it did not run).
class Csv {
 public:
  Csv() = default;
  Csv(const Csv&) = delete;
  Csv& operator=(const Csv&) = delete;
  ~Csv() {
    if (f_)
      std::fclose(f_);
  }
  void open(const std::string& path) {
    if (path.empty())
      return;
    f_ = std::fopen(path.c_str(), "w");
    if (f_)
      std::fprintf(f_, "batch,cin,cout,k,stride,hw,count,graph,us,plan\n");
    else
      std::fprintf(
          stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
  }
  void row(
      int n,
      const Layer& L,
      const char* graph,
      double us,
      std::string plan) {
    if (!f_)
      return;
    std::replace(plan.begin(), plan.end(), ',', ';');
    std::fprintf(
        f_,
        "%d,%d,%d,%d,%d,%d,%d,%s,",
        n,
        L.cin,
        L.cout,
        L.k,
        L.stride,
        L.hw,
        L.count,
        graph);
    if (std::isnan(us))
      std::fprintf(f_, "nan,\n");
    else
      std::fprintf(f_, "%.3f,%s\n", us, plan.c_str());
  }
  void flush() {
    if (f_)
      std::fflush(f_);
  }

 private:
  std::FILE* f_ = nullptr;
};

} // namespace cudnn_probe
