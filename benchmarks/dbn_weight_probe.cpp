// Does cuDNN's dedicated Dgrad+Drelu+BNBwdWeight ("DBN") fusion, built from
// C++ through cudnn-frontend's Graph::dbn_weight, beat the unfused backward
// of ResNet-50's convolutions that read a BatchNorm+ReLU output?
//
// The C++ half of benchmarks/bn_fusion_backward_probe.py: the Python
// frontend has no dbn_weight node, so that probe stated the BatchNorm
// backward's sums with generic reductions. This program builds, for every
// distinct convolution of ResNet-50 whose input is a BatchNorm+ReLU output
// (bn_fusion_probe.py's LAYERS, rows with the flag set: 11 shapes, 32
// convolutions), fp16 NHWC, the graphs of cudnn-frontend's
// samples/cpp/convolution/dgrads.cpp:
//
//   dgrad            conv_dgrad alone ("Convolution Dgrad")
//   dgrad+drelu(z)   conv_dgrad -> RELU_BWD with the saved ReLU input as
//                    the mask source ("Dgrad Drelu Graph"; the x buffer
//                    stands in for z: the values do not change the time)
//   dgrad+drelu      conv_dgrad -> RELU_BWD of (x - mean) * inv_var * scale
//                    + bias recomputed from x (the DBN graph less dbn_weight)
//   dbn              "Dgrad Drelu DBNweight Graph": the above with dr written
//                    out and dbn_weight(dr, x, mean, inv_var, scale), which
//                    outputs dscale, dbias and eq_scale_dy, eq_scale_x,
//                    eq_bias
//   dx pass          not in the sample: BatchNorm's dx as one pointwise
//                    graph from dbn_weight's outputs,
//                    dx = eq_scale_dy * dr + eq_scale_x * x + eq_bias
//
// Each graph: heuristics A then FALLBACK, the first --plans plans built (in
// parallel threads, as samples/cpp/misc/parallel_compilation.cpp), the
// fastest of them kept (5 timed runs each), then timed: 3 warm-ups, then
// --iters runs enqueued behind a host-function gate (the stream waits while
// the host queues every run, so host launch overhead does not count),
// a CUDA event between runs, the median interval reported. That is kernel
// time plus the gaps between a graph's kernels.
//
// Numerics: on one layer (--check-layer, an index into the 11 shapes;
// default 0: 64->64 3x3 at 56x56, the first batch size) every graph's
// outputs against an fp32 reference: dz from the legacy
// cudnnConvolutionBackwardData in fp32 (FMA math, NCHW), then dr, dbias,
// dscale, the eq_* coefficients and dx in double on the host.
//
// Build (see tools/gpu/dbn_weight_probe.sh):
//   g++ -std=c++17 -O2 -I<cudnn-frontend>/include -I<cudnn>/include
//       -I<cuda>/include benchmarks/dbn_weight_probe.cpp -L<cudnn>/lib
//       -l:libcudnn.so.9 -L<cuda>/lib64 -lcudart -lnvrtc -ldl -pthread
// Usage:
//   dbn_weight_probe [--batch-sizes 64,256] [--iters 20] [--plans 8]
//       [--check-layer 0] [--layers 0,3] [--csv FILE] [--gate-ms 5]

#include <cudnn_frontend.h>

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace {

constexpr double kEps = 1e-5;

// bn_fusion_probe.py's LAYERS: (in channels, out channels, kernel, stride,
// input H=W, count in ResNet-50, input is a BatchNorm+ReLU output). Only
// the rows with the flag set are probed (row 0 reads the max pool: no).
struct Layer {
  int cin, cout, k, stride, hw, count;
  bool bn_relu_input;
};
const Layer kLayers[] = {
    // layer1 (56x56)
    {64, 64, 1, 1, 56, 1, false}, // block 0 conv1 (after the stem's pool)
    {256, 64, 1, 1, 56, 2, false},
    {64, 64, 3, 1, 56, 3, true},
    {64, 256, 1, 1, 56, 3, true},
    {64, 256, 1, 1, 56, 1, false},
    // layer2 (28x28)
    {256, 128, 1, 1, 56, 1, false},
    {512, 128, 1, 1, 28, 3, false},
    {128, 128, 3, 2, 56, 1, true},
    {128, 128, 3, 1, 28, 3, true},
    {128, 512, 1, 1, 28, 4, true},
    {256, 512, 1, 2, 56, 1, false},
    // layer3 (14x14)
    {512, 256, 1, 1, 28, 1, false},
    {1024, 256, 1, 1, 14, 5, false},
    {256, 256, 3, 2, 28, 1, true},
    {256, 256, 3, 1, 14, 5, true},
    {256, 1024, 1, 1, 14, 6, true},
    {512, 1024, 1, 2, 28, 1, false},
    // layer4 (7x7)
    {1024, 512, 1, 1, 14, 1, false},
    {2048, 512, 1, 1, 7, 2, false},
    {512, 512, 3, 2, 14, 1, true},
    {512, 512, 3, 1, 7, 2, true},
    {512, 2048, 1, 1, 7, 3, true},
    {1024, 2048, 1, 2, 14, 1, false},
};

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

// One line, long messages cut in the middle (check_support lists every
// plan's reason; the last line holds cuDNN's own).
std::string one_line(std::string s, size_t keep = 420) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t')
      c = ' ';
  if (s.size() > keep)
    s = s.substr(0, keep / 2) + " ... " + s.substr(s.size() - keep / 2);
  return s;
}

// ------------------------------------------------------------ fp16 on host

uint16_t f2h(float f) {
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

float h2f_slow(uint16_t h) {
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

const std::vector<float>& h2f_table() {
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

std::vector<int64_t> nhwc_stride(int64_t c, int64_t h, int64_t w) {
  return {c * h * w, 1, c * w, c};
}

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
};

// The operands: dy, w (KRSC), x (the BatchNorm's input, NHWC) with
// per-channel offsets and spreads, its batch mean and inverse std, scale
// and bias (fp32), and one output buffer per graph.
struct Operands {
  Problem p;
  DevBuf dy, w, x, mean, inv, scale, bias;
  DevBuf dx_dgrad, dr_z, dr_bn, dr_dbn, dx_pass;
  DevBuf dscale, dbias, eq_dy, eq_x, eq_bias;
  std::vector<uint16_t> w_host, x_host;
  std::vector<float> mean_h, inv_h, scale_h, bias_h;

  Operands(const Problem& pr, const Pool& pool, uint64_t seed, bool keep_host)
      : p(pr) {
    Rng r(seed);
    const size_t C = static_cast<size_t>(p.cin), X = p.x_elems(), M = X / C;
    // x: offset[c] + spread[c] * N(0, 1); its statistics from the fp16 values.
    std::vector<float> off(C), spread(C);
    for (size_t c = 0; c < C; ++c) {
      off[c] = static_cast<float>(r.normal());
      spread[c] = static_cast<float>(r.uniform() + 0.5);
    }
    x_host.resize(X);
    std::vector<double> sum(C, 0.0), sq(C, 0.0);
    size_t po = static_cast<size_t>(r.next() % kPool);
    for (size_t m = 0; m < M; ++m) {
      const size_t base = m * C;
      for (size_t c = 0; c < C; ++c) {
        uint16_t h =
            f2h(off[c] + spread[c] * pool.host[(base + c + po) & (kPool - 1)]);
        x_host[base + c] = h;
        double v = h2f(h);
        sum[c] += v;
        sq[c] += v * v;
      }
    }
    mean_h.resize(C);
    inv_h.resize(C);
    scale_h.resize(C);
    bias_h.resize(C);
    for (size_t c = 0; c < C; ++c) {
      double mu = sum[c] / M, var = std::max(sq[c] / M - mu * mu, 0.0);
      mean_h[c] = static_cast<float>(mu);
      inv_h[c] = static_cast<float>(1.0 / std::sqrt(var + kEps));
      scale_h[c] = static_cast<float>(r.uniform() + 0.5);
      bias_h[c] = static_cast<float>(r.normal() * 0.2);
    }
    const double wscale =
        1.0 / std::sqrt(static_cast<double>(p.cin * p.k * p.k));
    w_host.resize(p.w_elems());
    for (auto& v : w_host)
      v = f2h(static_cast<float>(r.normal() * wscale));

    const size_t xb = X * 2, cb = C * 4;
    dy.alloc(p.dy_elems() * 2);
    pool.fill(dy.p, p.dy_elems(), static_cast<size_t>(r.next() % kPool));
    w.alloc(w_host.size() * 2);
    CUDA_OK(cudaMemcpy(
        w.p, w_host.data(), w_host.size() * 2, cudaMemcpyHostToDevice));
    x.alloc(xb);
    CUDA_OK(cudaMemcpy(x.p, x_host.data(), xb, cudaMemcpyHostToDevice));
    for (auto [buf, v] :
         {std::pair<DevBuf*, std::vector<float>*>{&mean, &mean_h},
          {&inv, &inv_h},
          {&scale, &scale_h},
          {&bias, &bias_h}}) {
      buf->alloc(cb);
      CUDA_OK(cudaMemcpy(buf->p, v->data(), cb, cudaMemcpyHostToDevice));
    }
    for (DevBuf* b : {&dx_dgrad, &dr_z, &dr_bn, &dr_dbn, &dx_pass})
      b->alloc(xb);
    for (DevBuf* b : {&dscale, &dbias, &eq_dy, &eq_x, &eq_bias})
      b->alloc(cb);
    if (!keep_host) {
      std::vector<uint16_t>().swap(x_host);
    }
  }
};

// ------------------------------------------------------------- the graphs

enum Kind { DGRAD, DRELU_Z, DRELU, DBN, DXPASS, NKINDS };
const char* kKindName[NKINDS] =
    {"dgrad", "dgrad+drelu(z)", "dgrad+drelu", "dbn", "dx pass"};
const char* kKindKey[NKINDS] =
    {"dgrad", "dgrad_drelu_z", "dgrad_drelu", "dbn", "dx_pass"};

struct Built {
  std::shared_ptr<fe::graph::Graph> g;
  std::unordered_map<int64_t, void*> pack;
  int64_t plan = -1, plans_total = 0, plans_built = 0;
  std::string plan_name;
  DevBuf ws;
};

struct Timing {
  double us = NAN;
  bool host_bound = false; // the host queued slower than the gate held
};

struct Ctx {
  cudnnHandle_t handle;
  cudaStream_t stream;
  int iters = 20, plans = 8;
  double gate_ms = 5.0;
};

void gate_fn(void* ms) {
  std::this_thread::sleep_for(std::chrono::microseconds(
      static_cast<int64_t>(*static_cast<double*>(ms) * 1000.0)));
}

// Median of `iters` runs of fn, each between two events, all queued behind
// a host-function gate so that the GPU runs them back to back.
Timing gated_median_us(
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

TensorPtr tensor(
    fe::graph::Graph& g,
    std::unordered_map<TensorPtr, void*>& pack,
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
  auto T = g.tensor(a);
  pack[T] = ptr;
  return T;
}

TensorPtr pw(
    fe::graph::Graph& g,
    const char* name,
    fe::PointwiseMode_t mode,
    TensorPtr a,
    TensorPtr b) {
  return g.pointwise(
      a, b, fe::graph::Pointwise_attributes().set_name(name).set_mode(mode));
}

void mark_output(
    std::unordered_map<TensorPtr, void*>& pack,
    TensorPtr T,
    void* ptr,
    fe::DataType_t dt = fe::DataType_t::NOT_SET) {
  T->set_output(true);
  if (dt != fe::DataType_t::NOT_SET)
    T->set_data_type(dt);
  pack[T] = ptr;
}

// Builds graph `kind` of the layer as dgrads.cpp does, builds its first
// ctx.plans plans and keeps the fastest.
std::unique_ptr<Built> build(const Ctx& ctx, Kind kind, Operands& o) {
  const Problem& p = o.p;
  auto b = std::make_unique<Built>();
  b->g = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *b->g;
  g.set_io_data_type(fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  std::unordered_map<TensorPtr, void*> pack;
  const auto F = fe::DataType_t::FLOAT;
  const std::vector<int64_t> xdim{p.n, p.cin, p.hw, p.hw},
      xstr = nhwc_stride(p.cin, p.hw, p.hw);
  const std::vector<int64_t> cdim{1, p.cin, 1, 1}, cstr{p.cin, 1, p.cin, p.cin};

  if (kind == DXPASS) {
    auto DR = tensor(g, pack, "dr", xdim, xstr, o.dr_dbn.p);
    auto X = tensor(g, pack, "x", xdim, xstr, o.x.p);
    auto A = tensor(g, pack, "eq_scale_dy", cdim, cstr, o.eq_dy.p, F);
    auto B = tensor(g, pack, "eq_scale_x", cdim, cstr, o.eq_x.p, F);
    auto C = tensor(g, pack, "eq_bias", cdim, cstr, o.eq_bias.p, F);
    auto t1 = pw(g, "dr_scale", fe::PointwiseMode_t::MUL, DR, A);
    auto t2 = pw(g, "x_scale", fe::PointwiseMode_t::MUL, X, B);
    auto t3 = pw(g, "sum", fe::PointwiseMode_t::ADD, t1, t2);
    auto DX = pw(g, "dx", fe::PointwiseMode_t::ADD, t3, C);
    mark_output(pack, DX, o.dx_pass.p);
  } else {
    auto DY = tensor(
        g,
        pack,
        "grad",
        {p.n, p.cout, p.ho, p.ho},
        nhwc_stride(p.cout, p.ho, p.ho),
        o.dy.p);
    auto W = tensor(
        g,
        pack,
        "weight",
        {p.cout, p.cin, p.k, p.k},
        {p.cin * p.k * p.k, 1, p.cin * p.k, p.cin},
        o.w.p);
    auto opts = fe::graph::Conv_dgrad_attributes()
                    .set_name("dgrad")
                    .set_padding({p.pad, p.pad})
                    .set_stride({p.s, p.s})
                    .set_dilation({1, 1});
    auto DZ = g.conv_dgrad(DY, W, opts);
    DZ->set_dim(xdim).set_stride(xstr);
    if (kind == DGRAD) {
      mark_output(pack, DZ, o.dx_dgrad.p);
    } else if (kind == DRELU_Z) {
      auto Z = tensor(g, pack, "relu_input", xdim, xstr, o.x.p);
      auto DR = g.pointwise(
          DZ,
          Z,
          fe::graph::Pointwise_attributes().set_name("drelu").set_mode(
              fe::PointwiseMode_t::RELU_BWD));
      mark_output(pack, DR, o.dr_z.p);
    } else {
      auto X = tensor(g, pack, "image", xdim, xstr, o.x.p);
      auto M = tensor(g, pack, "mean", cdim, cstr, o.mean.p, F);
      auto V = tensor(g, pack, "inv_variance", cdim, cstr, o.inv.p, F);
      auto S = tensor(g, pack, "scale", cdim, cstr, o.scale.p, F);
      auto Bi = tensor(g, pack, "bias", cdim, cstr, o.bias.p, F);
      auto centred = pw(g, "mean_sub", fe::PointwiseMode_t::SUB, X, M);
      auto norm = pw(g, "inv_var_mul", fe::PointwiseMode_t::MUL, centred, V);
      auto scaled = pw(g, "scale_mul", fe::PointwiseMode_t::MUL, norm, S);
      auto bn = pw(g, "bias_add", fe::PointwiseMode_t::ADD, scaled, Bi);
      auto DR = g.pointwise(
          DZ,
          bn,
          fe::graph::Pointwise_attributes().set_name("drelu").set_mode(
              fe::PointwiseMode_t::RELU_BWD));
      mark_output(pack, DR, kind == DBN ? o.dr_dbn.p : o.dr_bn.p);
      if (kind == DBN) {
        auto [dscale, dbias, eq_dy, eq_x, eq_bias] = g.dbn_weight(
            DR,
            X,
            M,
            V,
            S,
            fe::graph::DBN_weight_attributes().set_name("dbn_weight"));
        mark_output(pack, dscale, o.dscale.p, F);
        mark_output(pack, dbias, o.dbias.p, F);
        mark_output(pack, eq_dy, o.eq_dy.p, F);
        mark_output(pack, eq_x, o.eq_x.p, F);
        mark_output(pack, eq_bias, o.eq_bias.p, F);
      }
    }
  }

  FE_OK(g.validate());
  FE_OK(g.build_operation_graph(ctx.handle));
  FE_OK(
      g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  FE_OK(g.check_support());
  for (auto& [T, ptr] : pack)
    b->pack[T->get_uid()] = ptr;

  // The first ctx.plans plans, built in parallel; if none of them builds,
  // the next ones one by one until one does.
  const int64_t total = g.get_execution_plan_count();
  b->plans_total = total;
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
  b->plans_built = built;
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
      if (static_cast<size_t>(ws) > b->ws.bytes)
        b->ws.alloc(static_cast<size_t>(ws));
      auto run = [&] {
        FE_OK(g.execute_plan_at_index(ctx.handle, b->pack, b->ws.p, i));
      };
      run();
      CUDA_OK(cudaStreamSynchronize(ctx.stream));
      double t = gated_median_us(ctx, run, 5).us;
      if (t < best) {
        best = t;
        b->plan = i;
      }
    } catch (const std::exception& e) {
      why = e.what();
      cudaGetLastError();
    }
  }
  if (b->plan < 0)
    throw std::runtime_error("no built plan ran: " + why);
  if (g.get_plan_name_at_index(b->plan, b->plan_name).is_bad())
    b->plan_name = "plan " + std::to_string(b->plan);
  return b;
}

Timing measure(const Ctx& ctx, Built& b) {
  auto run = [&] {
    FE_OK(b.g->execute_plan_at_index(ctx.handle, b.pack, b.ws.p, b.plan));
  };
  for (int i = 0; i < 3; ++i)
    run();
  CUDA_OK(cudaStreamSynchronize(ctx.stream));
  return gated_median_us(ctx, run, ctx.iters);
}

// ---------------------------------------------------------------- numerics

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
// dz = dgrad(dy, w) in fp32 through the legacy API (FMA math, NCHW), NCHW.
std::vector<float> reference_dgrad(const Ctx& ctx, Operands& o) {
  const Problem& p = o.p;
  std::vector<uint16_t> dyh(p.dy_elems());
  CUDA_OK(
      cudaMemcpy(dyh.data(), o.dy.p, dyh.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> dyf(dyh.size()), wf(o.w_host.size());
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t c = 0; c < p.cout; ++c)
      for (int64_t h = 0; h < p.ho; ++h)
        for (int64_t w = 0; w < p.ho; ++w)
          dyf[((n * p.cout + c) * p.ho + h) * p.ho + w] =
              h2f(dyh[((n * p.ho + h) * p.ho + w) * p.cout + c]);
  for (int64_t k = 0; k < p.cout; ++k)
    for (int64_t c = 0; c < p.cin; ++c)
      for (int64_t r = 0; r < p.k; ++r)
        for (int64_t s = 0; s < p.k; ++s)
          wf[((k * p.cin + c) * p.k + r) * p.k + s] =
              h2f(o.w_host[((k * p.k + r) * p.k + s) * p.cin + c]);
  DevBuf ddy(dyf.size() * 4), dw(wf.size() * 4), ddx(p.x_elems() * 4);
  CUDA_OK(cudaMemcpy(ddy.p, dyf.data(), ddy.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw.p, wf.data(), dw.bytes, cudaMemcpyHostToDevice));
  cudnnTensorDescriptor_t dyD, dxD;
  cudnnFilterDescriptor_t wD;
  cudnnConvolutionDescriptor_t cD;
  CUDNN_OK(cudnnCreateTensorDescriptor(&dyD));
  CUDNN_OK(cudnnCreateTensorDescriptor(&dxD));
  CUDNN_OK(cudnnCreateFilterDescriptor(&wD));
  CUDNN_OK(cudnnCreateConvolutionDescriptor(&cD));
  std::vector<float> out(p.x_elems());
  std::string err;
  try {
    CUDNN_OK(cudnnSetTensor4dDescriptor(
        dyD,
        CUDNN_TENSOR_NCHW,
        CUDNN_DATA_FLOAT,
        (int)p.n,
        (int)p.cout,
        (int)p.ho,
        (int)p.ho));
    CUDNN_OK(cudnnSetTensor4dDescriptor(
        dxD,
        CUDNN_TENSOR_NCHW,
        CUDNN_DATA_FLOAT,
        (int)p.n,
        (int)p.cin,
        (int)p.hw,
        (int)p.hw));
    CUDNN_OK(cudnnSetFilter4dDescriptor(
        wD,
        CUDNN_DATA_FLOAT,
        CUDNN_TENSOR_NCHW,
        (int)p.cout,
        (int)p.cin,
        (int)p.k,
        (int)p.k));
    CUDNN_OK(cudnnSetConvolution2dDescriptor(
        cD,
        (int)p.pad,
        (int)p.pad,
        (int)p.s,
        (int)p.s,
        1,
        1,
        CUDNN_CROSS_CORRELATION,
        CUDNN_DATA_FLOAT));
    CUDNN_OK(cudnnSetConvolutionMathType(cD, CUDNN_FMA_MATH));
    std::string tried;
    bool done = false;
    for (auto algo :
         {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
          CUDNN_CONVOLUTION_BWD_DATA_ALGO_0}) {
      size_t wsb = 0;
      if (cudnnGetConvolutionBackwardDataWorkspaceSize(
              ctx.handle, wD, dyD, cD, dxD, algo, &wsb) != CUDNN_STATUS_SUCCESS)
        continue;
      DevBuf ws(wsb);
      float one = 1.f, zero = 0.f;
      cudnnStatus_t s = cudnnConvolutionBackwardData(
          ctx.handle,
          &one,
          wD,
          dw.p,
          dyD,
          ddy.p,
          cD,
          algo,
          ws.p,
          wsb,
          &zero,
          dxD,
          ddx.p);
      CUDA_OK(cudaStreamSynchronize(ctx.stream));
      if (s == CUDNN_STATUS_SUCCESS) {
        done = true;
        break;
      }
      tried += std::string(" ") + cudnnGetErrorString(s);
    }
    if (!done)
      throw std::runtime_error("fp32 reference dgrad failed:" + tried);
    CUDA_OK(cudaMemcpy(out.data(), ddx.p, ddx.bytes, cudaMemcpyDeviceToHost));
  } catch (const std::exception& e) {
    err = e.what();
  }
  cudnnDestroyTensorDescriptor(dyD);
  cudnnDestroyTensorDescriptor(dxD);
  cudnnDestroyFilterDescriptor(wD);
  cudnnDestroyConvolutionDescriptor(cD);
  if (!err.empty())
    throw std::runtime_error(err);
  return out;
}
#pragma GCC diagnostic pop

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

std::vector<uint16_t> to_host_half(const DevBuf& b, size_t n) {
  std::vector<uint16_t> v(n);
  CUDA_OK(cudaMemcpy(v.data(), b.p, n * 2, cudaMemcpyDeviceToHost));
  return v;
}
std::vector<float> to_host_float(const DevBuf& b, size_t n) {
  std::vector<float> v(n);
  CUDA_OK(cudaMemcpy(v.data(), b.p, n * 4, cudaMemcpyDeviceToHost));
  return v;
}

void check(const Ctx& ctx, Operands& o, const bool ran[NKINDS]) {
  const Problem& p = o.p;
  const size_t C = static_cast<size_t>(p.cin), X = p.x_elems(), M = X / C;
  std::printf(
      "\n## numerics, %lld->%lld %lldx%lld/%lld at %lldx%lld, batch %lld: against fp32 "
      "(dz: legacy cudnnConvolutionBackwardData, fp32 FMA; the rest in double on the host)\n",
      (long long)p.cin,
      (long long)p.cout,
      (long long)p.k,
      (long long)p.k,
      (long long)p.s,
      (long long)p.hw,
      (long long)p.hw,
      (long long)p.n);
  std::printf(
      "| graph | output | max abs err | max abs ref | max err / max abs ref | rel err (L2) | "
      "elements off by > 1%% of max abs ref |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  std::vector<float> dz = reference_dgrad(ctx, o); // NCHW
  auto dz_at = [&](size_t m, size_t c) { // m = (n*H + h)*W + w
    size_t hw2 = static_cast<size_t>(p.hw * p.hw), n = m / hw2, r = m % hw2;
    return static_cast<double>(dz[(n * C + c) * hw2 + r]);
  };
  // Pass 1: dgrad, dr (both graphs that output it), dbias and dscale.
  std::vector<double> dbias(C, 0.0), dscale(C, 0.0);
  std::vector<uint16_t> g_dx =
      ran[DGRAD] ? to_host_half(o.dx_dgrad, X) : std::vector<uint16_t>();
  std::vector<uint16_t> g_dr =
      ran[DRELU] ? to_host_half(o.dr_bn, X) : std::vector<uint16_t>();
  std::vector<uint16_t> g_drd =
      ran[DBN] ? to_host_half(o.dr_dbn, X) : std::vector<uint16_t>();
  ErrStat e_dx, e_dr, e_drd;
  std::vector<double> dr_ref(X);
  for (size_t m = 0; m < M; ++m)
    for (size_t c = 0; c < C; ++c) {
      const size_t i = m * C + c;
      double z = dz_at(m, c), xv = h2f(o.x_host[i]);
      double xhat = (xv - o.mean_h[c]) * o.inv_h[c];
      double y = xhat * o.scale_h[c] + o.bias_h[c];
      double dr = y > 0 ? z : 0.0;
      dr_ref[i] = dr;
      dbias[c] += dr;
      dscale[c] += dr * xhat;
      if (ran[DGRAD])
        e_dx.add(h2f(g_dx[i]), z);
      if (ran[DRELU])
        e_dr.add(h2f(g_dr[i]), dr);
      if (ran[DBN])
        e_drd.add(h2f(g_drd[i]), dr);
    }
  for (size_t i = 0; i < X; ++i) {
    if (ran[DGRAD])
      e_dx.count_far(h2f(g_dx[i]), dz_at(i / C, i % C), 0.01 * e_dx.max_ref);
    if (ran[DRELU])
      e_dr.count_far(h2f(g_dr[i]), dr_ref[i], 0.01 * e_dr.max_ref);
    if (ran[DBN])
      e_drd.count_far(h2f(g_drd[i]), dr_ref[i], 0.01 * e_drd.max_ref);
  }
  if (ran[DGRAD])
    e_dx.print("dgrad", "dz");
  if (ran[DRELU])
    e_dr.print("dgrad+drelu", "dr");
  // BatchNorm's backward as dx = eq_dy * dr + eq_x * x + eq_bias:
  // eq_dy = scale*inv, eq_x = -scale*inv^2*dscale/M, eq_bias =
  // -scale*inv*dbias/M - eq_x*mean.
  std::vector<double> r_eqdy(C), r_eqx(C), r_eqb(C);
  for (size_t c = 0; c < C; ++c) {
    double a = static_cast<double>(o.scale_h[c]) * o.inv_h[c];
    r_eqdy[c] = a;
    r_eqx[c] = -a * o.inv_h[c] * dscale[c] / M;
    r_eqb[c] = -a * dbias[c] / M - r_eqx[c] * o.mean_h[c];
  }
  if (ran[DBN]) {
    e_drd.print("dbn", "dr");
    auto chan =
        [&](const char* what, const DevBuf& b, const std::vector<double>& ref) {
          std::vector<float> got = to_host_float(b, C);
          ErrStat e;
          for (size_t c = 0; c < C; ++c)
            e.add(got[c], ref[c]);
          for (size_t c = 0; c < C; ++c)
            e.count_far(got[c], ref[c], 0.01 * e.max_ref);
          e.print("dbn", what);
        };
    chan("dbias", o.dbias, dbias);
    chan("dscale", o.dscale, dscale);
    chan("eq_scale_dy", o.eq_dy, r_eqdy);
    chan("eq_scale_x", o.eq_x, r_eqx);
    chan("eq_bias", o.eq_bias, r_eqb);
    std::vector<float> gdb = to_host_float(o.dbias, C),
                       gds = to_host_float(o.dscale, C);
    std::printf(
        "channel 0..2: dbias %.6g %.6g %.6g (ref %.6g %.6g %.6g); dscale %.6g %.6g %.6g "
        "(ref %.6g %.6g %.6g)\n",
        gdb[0],
        gdb[1],
        gdb[2],
        dbias[0],
        dbias[1],
        dbias[2],
        gds[0],
        gds[1],
        gds[2],
        dscale[0],
        dscale[1],
        dscale[2]);
  }
  if (ran[DXPASS] && ran[DBN]) {
    // The dx pass ran on dbn's own dr and eq_* (as it would in training).
    std::vector<uint16_t> g = to_host_half(o.dx_pass, X);
    ErrStat e;
    std::vector<double> ref(X);
    for (size_t i = 0; i < X; ++i) {
      size_t c = i % C;
      ref[i] = r_eqdy[c] * dr_ref[i] + r_eqx[c] * h2f(o.x_host[i]) + r_eqb[c];
      e.add(h2f(g[i]), ref[i]);
    }
    for (size_t i = 0; i < X; ++i)
      e.count_far(h2f(g[i]), ref[i], 0.01 * e.max_ref);
    e.print("dbn -> dx pass", "dx (BatchNorm backward)");
  }
  std::fflush(stdout);
}

// ------------------------------------------------------------------- main

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ','))
    if (!tok.empty())
      v.push_back(std::stoi(tok));
  return v;
}

std::string fmt_us(double us) {
  if (std::isnan(us))
    return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", us);
  return b;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<int> batches{64, 256}, only;
  int check_layer = 0;
  std::string csv_path;
  Ctx ctx;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--batch-sizes")
      batches = parse_ints(val());
    else if (a == "--iters")
      ctx.iters = std::stoi(val());
    else if (a == "--plans")
      ctx.plans = std::stoi(val());
    else if (a == "--check-layer")
      check_layer = std::stoi(val());
    else if (a == "--layers")
      only = parse_ints(val());
    else if (a == "--csv")
      csv_path = val();
    else if (a == "--gate-ms")
      ctx.gate_ms = std::stod(val());
    else {
      std::fprintf(
          stderr,
          "usage: %s [--batch-sizes 64,256] [--iters 20] [--plans 8] [--check-layer 0 (-1: none)] "
          "[--layers i,j (indices into the 11 shapes)] [--csv FILE] [--gate-ms 5]\n",
          argv[0]);
      return 2;
    }
  }

  std::vector<Layer> layers;
  for (const Layer& l : kLayers)
    if (l.bn_relu_input)
      layers.push_back(l);

  std::FILE* csv = nullptr;
  try {
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
    if (!csv_path.empty()) {
      csv = std::fopen(csv_path.c_str(), "w");
      if (csv)
        std::fprintf(csv, "batch,cin,cout,k,stride,hw,count,graph,us,plan\n");
    }
    const Pool pool;
    auto t_start = std::chrono::steady_clock::now();
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const int n = batches[bi];
      std::printf(
          "\n## batch %d, per layer (us a call, median; '-' where the graph did not run)\n",
          n);
      std::printf(
          "| cin | cout | k | s | hw | count | dgrad | dgrad+drelu(z) | dgrad+drelu | dbn | dx pass | "
          "dbn + dx pass |\n| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
      std::fflush(stdout);
      std::vector<std::string> notes;
      double total[NKINDS] = {}, total_dbn_dx = 0;
      int shapes[NKINDS] = {}, convs[NKINDS] = {}, shapes_dbn_dx = 0,
          convs_dbn_dx = 0;
      double same_set[3] =
          {}; // dgrad, dgrad+drelu, dbn+dx over the layers where dbn and dx ran
      for (size_t li = 0; li < layers.size(); ++li) {
        if (!only.empty() &&
            std::find(only.begin(), only.end(), (int)li) == only.end())
          continue;
        const Layer& L = layers[li];
        const bool checking = bi == 0 && (int)li == check_layer;
        Problem p{n, L.cin, L.cout, L.k, L.stride, L.k / 2, L.hw, 0};
        p.ho = (p.hw + 2 * p.pad - p.k) / p.s + 1;
        double us[NKINDS];
        bool ran[NKINDS] = {};
        std::string plan_line;
        char tag[96];
        std::snprintf(
            tag,
            sizeof tag,
            "bs%d %d->%d %dx%d/%d %dx%d",
            n,
            L.cin,
            L.cout,
            L.k,
            L.k,
            L.stride,
            L.hw,
            L.hw);
        std::unique_ptr<Operands> o;
        try {
          o = std::make_unique<Operands>(
              p, pool, 1000003ull * (li + 1) + n, checking);
        } catch (const std::exception& e) {
          std::printf(
              "| %d | %d | %d | %d | %d | %d | operands failed: %s |\n",
              L.cin,
              L.cout,
              L.k,
              L.stride,
              L.hw,
              L.count,
              one_line(e.what()).c_str());
          cudaGetLastError();
          continue;
        }
        for (int k = 0; k < NKINDS; ++k) {
          us[k] = NAN;
          try {
            auto b = build(ctx, static_cast<Kind>(k), *o);
            Timing t = measure(ctx, *b);
            us[k] = t.us;
            ran[k] = true;
            plan_line += std::string(plan_line.empty() ? "" : "; ") +
                kKindName[k] + " " + b->plan_name + " (" +
                std::to_string(b->plans_built) + " built of " +
                std::to_string(b->plans_total) +
                (t.host_bound ? ", HOST-BOUND" : "") + ")";
            if (csv)
              std::fprintf(
                  csv,
                  "%d,%d,%d,%d,%d,%d,%d,%s,%.3f,%s\n",
                  n,
                  L.cin,
                  L.cout,
                  L.k,
                  L.stride,
                  L.hw,
                  L.count,
                  kKindKey[k],
                  t.us,
                  b->plan_name.c_str());
          } catch (const std::exception& e) {
            cudaGetLastError();
            cudaStreamSynchronize(ctx.stream);
            notes.push_back(
                std::string(tag) + " " + kKindName[k] +
                ": not supported: " + one_line(e.what()));
            if (csv)
              std::fprintf(
                  csv,
                  "%d,%d,%d,%d,%d,%d,%d,%s,nan,\n",
                  n,
                  L.cin,
                  L.cout,
                  L.k,
                  L.stride,
                  L.hw,
                  L.count,
                  kKindKey[k]);
          }
          if (ran[k]) {
            total[k] += us[k] * L.count / 1000.0;
            shapes[k] += 1;
            convs[k] += L.count;
          }
        }
        double dbn_dx = ran[DBN] && ran[DXPASS] ? us[DBN] + us[DXPASS] : NAN;
        if (!std::isnan(dbn_dx)) {
          total_dbn_dx += dbn_dx * L.count / 1000.0;
          shapes_dbn_dx += 1;
          convs_dbn_dx += L.count;
          if (ran[DGRAD] && ran[DRELU]) {
            same_set[0] += us[DGRAD] * L.count / 1000.0;
            same_set[1] += us[DRELU] * L.count / 1000.0;
            same_set[2] += dbn_dx * L.count / 1000.0;
          }
        }
        std::printf(
            "| %d | %d | %d | %d | %d | %d | %s | %s | %s | %s | %s | %s |\n",
            L.cin,
            L.cout,
            L.k,
            L.stride,
            L.hw,
            L.count,
            fmt_us(us[DGRAD]).c_str(),
            fmt_us(us[DRELU_Z]).c_str(),
            fmt_us(us[DRELU]).c_str(),
            fmt_us(us[DBN]).c_str(),
            fmt_us(us[DXPASS]).c_str(),
            fmt_us(dbn_dx).c_str());
        notes.push_back(std::string(tag) + " plans: " + plan_line);
        std::fflush(stdout);
        if (csv)
          std::fflush(csv);
        if (checking) {
          try {
            check(ctx, *o, ran);
          } catch (const std::exception& e) {
            std::printf(
                "numerics check failed: %s\n", one_line(e.what()).c_str());
            cudaGetLastError();
          }
          std::printf("\n");
        }
      }
      std::printf(
          "\n## batch %d: ms a step (each layer's median x its count, summed over the layers where the "
          "graph ran)\n| graph | ms a step | layer shapes that ran |\n| --- | ---: | --- |\n",
          n);
      const int all_convs = [&] {
        int c = 0;
        for (size_t li = 0; li < layers.size(); ++li)
          if (only.empty() ||
              std::find(only.begin(), only.end(), (int)li) != only.end())
            c += layers[li].count;
        return c;
      }();
      const int all_shapes =
          only.empty() ? (int)layers.size() : (int)only.size();
      const char* label[NKINDS] = {
          "(1) dgrad alone",
          "(2z) dgrad + drelu, mask from the saved z (sample)",
          "(2) dgrad + drelu, BN+ReLU recomputed from x",
          "(3) dgrad + drelu + dbn_weight (dr, dscale, dbias, eq_*)",
          "(4) dx pass (pointwise, from dbn_weight's eq_*)"};
      for (int k = 0; k < NKINDS; ++k)
        std::printf(
            "| %s | %.3f | %d of %d (%d of %d convolutions) |\n",
            label[k],
            total[k],
            shapes[k],
            all_shapes,
            convs[k],
            all_convs);
      std::printf(
          "| (3) + (4): the whole DBN backward | %.3f | %d of %d (%d of %d convolutions) |\n",
          total_dbn_dx,
          shapes_dbn_dx,
          all_shapes,
          convs_dbn_dx,
          all_convs);
      std::printf(
          "\nover the layers where (3) and (4) ran: dgrad alone %.3f ms, dgrad+drelu %.3f ms, "
          "dbn + dx pass %.3f ms\n",
          same_set[0],
          same_set[1],
          same_set[2]);
      std::printf("\nplans and failures, batch %d:\n", n);
      for (auto& s : notes)
        std::printf("  %s\n", s.c_str());
      std::printf(
          "[%.0f s so far]\n",
          std::chrono::duration<double>(
              std::chrono::steady_clock::now() - t_start)
              .count());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::printf("fatal: %s\n", one_line(e.what(), 2000).c_str());
    if (csv)
      std::fclose(csv);
    return 1;
  }
  if (csv)
    std::fclose(csv);
  return 0;
}
