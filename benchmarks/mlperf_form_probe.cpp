// Would ResNet-50 in "MLPerf form" be faster than lamp's path today? The
// forward half and the weight gradients, convolution by convolution, from
// C++ (CUDA runtime + cuDNN + the header-only cudnn-frontend; no LibTorch).
//
// Today lamp runs each convolution (cuDNN through ATen), then cuDNN's legacy
// NHWC BatchNorm kernel with the ReLU, or the shortcut add and the ReLU,
// folded in (src/nn/batch_norm_act_cudnn.cpp); backward is dgrad, wgrad
// and that kernel's backward. MLPerf's ResNet-50 instead computes each
// BatchNorm's statistics in the convolution's epilogue (genstats), turns
// them into one scale and bias a channel (bn_finalize), applies scale, bias
// and ReLU in the next convolution's prologue, and keeps one pointwise pass
// after each block's bn3 (both branches normalised, added, ReLU). Its
// backward fuses dgrad, the ReLU's backward and the BatchNorm's backward
// sums (benchmarks/dbn_weight_probe.cpp measures that part) and recomputes
// each convolution's input through the same prologue in wgrad.
// benchmarks/bn_fusion_probe.py measured the forward graphs through the
// Python frontend (kernel time); this program measures both halves the way
// dbn_weight_probe does, with today's BatchNorm kernels beside them, so the
// two paths can be added up.
//
// For every distinct convolution of ResNet-50 (cudnn_probe.h's kLayers,
// bn_fusion_probe.py's LAYERS: 23 shapes, 52 convolutions; the stem is not
// among them), fp16 NHWC tensors, fp32 statistics and BatchNorm weights:
//
//   F1  conv_fprop alone (graph API; samples/cpp/convolution/fprop.cpp)
//   F2  conv_fprop, then genstats of its output (per-channel SUM, SQ_SUM)
//   F3  scale+bias+ReLU prologue, conv_fprop, genstats (fprop.cpp's
//       "SBRCS" graph): only where the input is a BatchNorm+ReLU output
//   F4  bn_finalize for the output's channels (samples/cpp/norm/
//       batchnorm.cpp): sum, sq_sum, scale, bias, epsilon, count, momentum
//       and the running stats in; eq_scale, eq_bias, saved mean and inverse
//       std, next running stats out
//   F5  today's BatchNorm after the convolution: cudnnBatchNormalization-
//       ForwardTrainingEx, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, with the ops
//       lamp passes (BN_ACTIVATION before a ReLU, BN_ADD_ACTIVATION for bn3
//       with the shortcut as z, BN for the downsample)
//   F6  after bn3 only: relu(y * eq_scale + eq_bias + shortcut) as one
//       pointwise graph, the shortcut either the downsample's raw output
//       with its own scale and bias (block 0 of each stage) or the block's
//       input (the other blocks)
//   B0  conv_dgrad alone (samples/cpp/convolution/dgrads.cpp)
//   B1  conv_wgrad of the saved input (wgrads.cpp's "Convolution Wgrad")
//   B2  conv_wgrad with x recomputed as relu(x * scale + bias) from the
//       previous convolution's raw output (wgrads.cpp's
//       "scale-bias-relu-wgrad"): only where the input is a BN+ReLU output
//   B3  today's BatchNorm backward, cudnnBatchNormalizationBackwardEx with
//       F5's ops and F5's reserve space and saved statistics
//
// The prologue's scale and bias are fp16 as in MLPerf and cuDNN's samples
// (bn_finalize writes them in fp16 too); where a graph finds no engine
// that way it is built again with fp32 ones (and B2 with fp16
// intermediates), and the notes name the form that ran.
//
// Each graph: heuristics A then FALLBACK, the first --plans plans built in
// parallel, the fastest kept, then the median of --iters runs queued behind
// a host-function gate with a CUDA event between runs (cudnn_probe.h). The
// legacy BatchNorm calls are timed the same way. bn_finalize depends only on
// the channel count and the element count, so it is built once for each
// pair and its time reused.
//
// Per batch size the program prints one row a layer and then the step
// totals (each layer's median times its count) of both paths:
//   today        forward F1 + F5; backward B0 + B1 + B3
//   MLPerf form  forward F3 (BN+ReLU input) or F2 (the rest) + F4 + F6;
//                backward B2 (BN+ReLU input) or B1 (the rest), B0 of the
//                convolutions whose input is not a BN+ReLU output, B3 of
//                the bn3 and downsample BatchNorms (their backward is not
//                fused here), and dbn_weight_probe's "dbn" + "dx_pass" rows
//                (dgrad + ReLU backward + BatchNorm backward) for the 32
//                convolutions whose input is a BN+ReLU output; with
//                --dbn-csv (that probe's CSV) they are added in, otherwise
//                the total says what is missing.
//
// Numerics on one layer (--check-layer, an index into the 23 shapes;
// default 2: 64->64 3x3 at 56x56, the first batch size): F2's sums against
// a double reduction of F1's output on the host; F3's output against F1 run
// on the input normalised on the host; B2 against B1 on that same input;
// F4's outputs against the formulas (mean = sum/count, var = sq/count -
// mean^2, inv = 1/sqrt(var + eps), eq_scale = scale*inv, eq_bias = bias -
// mean*eq_scale, running stats with the unbiased variance). Errors are
// printed, never fatal.
//
// Build (see tools/gpu/cudnn_probe.sh, PROBE=mlperf_form_probe; the harness
// is benchmarks/cudnn_probe.h):
//   g++ -std=c++17 -O2 -isystem <cudnn-frontend>/include -I<cudnn>/include
//       -I<cuda>/include benchmarks/mlperf_form_probe.cpp -L<cudnn>/lib
//       -l:libcudnn.so.9 -L<cuda>/lib64 -lcudart -lnvrtc -ldl -pthread
// Usage:
//   mlperf_form_probe [--batch-sizes 64,256] [--iters 20] [--plans 8]
//       [--check-layer 2] [--layers 0,3] [--graphs f1,f3,b2]
//       [--dbn-csv dbn_weight_probe.csv] [--csv FILE] [--gate-ms 5]

#include "cudnn_probe.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace cudnn_probe;

constexpr float kMomentum = 0.1f;
constexpr int kDefaultCheckLayer = 2;

// ------------------------------------------------------------- the graphs

enum Kind { F1, F2, F3, F4, F5, F6_DS, F6_ID, B0, B1, B2, B3, NKINDS };
const char* kKey[NKINDS] = {
    "f1_conv",
    "f2_conv_genstats",
    "f3_sbr_conv_genstats",
    "f4_bn_finalize",
    "f5_legacy_bn_fwd",
    "f6_bn3_pass_downsample",
    "f6_bn3_pass_identity",
    "b0_dgrad",
    "b1_wgrad",
    "b2_sbr_wgrad",
    "b3_legacy_bn_bwd"};
const char* kColumn[NKINDS] = {
    "F1 conv",
    "F2 conv+stats",
    "F3 sbr+conv+stats",
    "F4 finalize",
    "F5 BN fwd",
    "F6 bn3 (ds)",
    "F6 bn3 (id)",
    "B0 dgrad",
    "B1 wgrad",
    "B2 sbr+wgrad",
    "B3 BN bwd"};

// Whether graph k applies to layer L.
bool applies(Kind k, const Layer& L) {
  switch (k) {
    case F3:
    case B2:
      return L.bn_relu_input;
    case F6_DS:
      return L.after == After::kAddRelu;
    case F6_ID:
      return L.after == After::kAddRelu && L.count > 1;
    default:
      return true;
  }
}

const char* after_name(After a) {
  switch (a) {
    case After::kRelu:
      return "ReLU";
    case After::kAddRelu:
      return "add+ReLU";
    default:
      return "-";
  }
}

// One way to build a graph: the per-channel parameters' type and the
// intermediates' type. The first form listed is MLPerf's; the others are
// tried where it finds no engine.
struct Variant {
  const char* label; // "" for the first form
  fe::DataType_t params, inter;
};
const std::vector<Variant> kPlain = {
    {"", fe::DataType_t::HALF, fe::DataType_t::FLOAT}};
const std::vector<Variant> kWithParams = {
    {"", fe::DataType_t::HALF, fe::DataType_t::FLOAT},
    {"fp32 scale/bias", fe::DataType_t::FLOAT, fe::DataType_t::FLOAT}};
// NOTE: wgrads.cpp's scale-bias-relu-wgrad sets fp16 intermediates.
const std::vector<Variant> kWgradWithParams = {
    {"", fe::DataType_t::HALF, fe::DataType_t::FLOAT},
    {"fp16 intermediates", fe::DataType_t::HALF, fe::DataType_t::HALF},
    {"fp32 scale/bias", fe::DataType_t::FLOAT, fe::DataType_t::FLOAT}};

// Per-channel values: on the host, and on the device as fp32 and (where a
// graph may read them so) fp16. With fp16 they are rounded to fp16 first,
// so that both copies hold the same numbers.
struct Chan {
  std::vector<float> h;
  DevBuf f32, f16;
  void set(std::vector<float> v, bool as_half) {
    std::vector<uint16_t> hv;
    if (as_half) {
      hv.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        hv[i] = f2h(v[i]);
        v[i] = h2f(hv[i]);
      }
      upload(f16, hv.data(), hv.size() * 2);
    }
    h = std::move(v);
    upload(f32, h.data(), h.size() * 4);
  }
  void* ptr(fe::DataType_t dt) const {
    return dt == fe::DataType_t::HALF ? f16.p : f32.p;
  }
};

std::vector<float> uniform(Rng& r, size_t n, double lo, double hi) {
  std::vector<float> v(n);
  for (auto& x : v)
    x = static_cast<float>(lo + (hi - lo) * r.uniform());
  return v;
}
std::vector<float> normal(Rng& r, size_t n, double sd) {
  std::vector<float> v(n);
  for (auto& x : v)
    x = static_cast<float>(sd * r.normal());
  return v;
}

// The operands of one layer. x is the convolution's input (for F3 and B2
// the previous convolution's raw output), N(0, 1) from the pool; y1..y3 are
// F1..F3's outputs. The BatchNorm after the convolution (F5, B3) reads y1.
struct Operands {
  Problem p;
  Layer L;
  DevBuf x, w, y1, y2, y3, dy, dx, dw1, dw2;
  DevBuf sum2, sq2, sum3, sq3;
  Chan in_scale, in_bias; // the prologue's (cin)
  Chan gamma, beta; // the BatchNorm's weight and bias (cout, fp32)
  DevBuf rmean, rvar, smean, sinv, bn_y, bn_z, bn_dx, bn_dz, dgamma, dbeta;
  Chan eq_scale, eq_bias, ds_scale, ds_bias; // F6's (cout)
  DevBuf f6_out;

  Operands(const Problem& pr, const Layer& l, const Pool& pool, uint64_t seed)
      : p(pr), L(l) {
    Rng r(seed);
    const size_t Y = p.dy_elems(), cin = static_cast<size_t>(p.cin),
                 cout = static_cast<size_t>(p.cout);
    random_fill(pool, r, x, p.x_elems());
    std::vector<uint16_t> wh = random_weights(r, p);
    upload(w, wh.data(), wh.size() * 2);
    random_fill(pool, r, dy, Y);
    for (DevBuf* b : {&y1, &y2, &bn_y, &bn_dx})
      b->alloc(Y * 2);
    if (L.bn_relu_input)
      y3.alloc(Y * 2);
    dx.alloc(p.x_elems() * 2);
    dw1.alloc(p.w_elems() * 2);
    dw2.alloc(p.w_elems() * 2);
    for (DevBuf* b :
         {&sum2, &sq2, &sum3, &sq3, &rmean, &smean, &sinv, &dgamma, &dbeta})
      b->alloc(cout * 4);
    std::vector<float> ones(cout, 1.f);
    upload(rvar, ones.data(), cout * 4);
    // NOTE: the equivalent scale and bias of a BatchNorm of x ~ N(0, 1):
    // scale ~ gamma, bias ~ beta; about half of relu(x*s + b) is zero.
    in_scale.set(uniform(r, cin, 0.5, 1.5), true);
    in_bias.set(normal(r, cin, 0.2), true);
    gamma.set(uniform(r, cout, 0.5, 1.5), false);
    beta.set(normal(r, cout, 0.2), false);
    if (L.after == After::kAddRelu) {
      random_fill(pool, r, bn_z, Y);
      bn_dz.alloc(Y * 2);
      f6_out.alloc(Y * 2);
      eq_scale.set(uniform(r, cout, 0.5, 1.5), true);
      eq_bias.set(normal(r, cout, 0.2), true);
      ds_scale.set(uniform(r, cout, 0.5, 1.5), true);
      ds_bias.set(normal(r, cout, 0.2), true);
    }
  }
};

// bn_finalize's operands for c channels over `count` elements each: sums
// of a plausible batch (mean ~ N(0, 1), variance in [0.5, 2]).
struct FinalizeOperands {
  int64_t c, count;
  Chan sum, sq, gamma, beta, rmean, rvar;
  DevBuf eq_scale, eq_bias, mean, inv, next_rmean, next_rvar;

  FinalizeOperands(int64_t channels, int64_t elements, uint64_t seed)
      : c(channels), count(elements) {
    Rng r(seed);
    const size_t C = static_cast<size_t>(c);
    std::vector<float> mu = normal(r, C, 1.0), var = uniform(r, C, 0.5, 2.0);
    const double n = static_cast<double>(count);
    std::vector<float> s(C), q(C);
    for (size_t i = 0; i < C; ++i) {
      s[i] = static_cast<float>(mu[i] * n);
      q[i] = static_cast<float>((var[i] + double(mu[i]) * mu[i]) * n);
    }
    sum.set(s, false);
    sq.set(q, false);
    gamma.set(uniform(r, C, 0.5, 1.5), false);
    beta.set(normal(r, C, 0.2), false);
    rmean.set(normal(r, C, 0.1), false);
    rvar.set(uniform(r, C, 0.5, 1.5), false);
    for (DevBuf* b :
         {&eq_scale, &eq_bias, &mean, &inv, &next_rmean, &next_rvar})
      b->alloc(C * 4);
  }
};

// x * scale + bias a channel (scale and bias in type dt), the node names
// prefixed with `name`.
TensorPtr scale_bias(
    GraphBuilder& gb,
    const std::string& name,
    TensorPtr X,
    const Chan& scale,
    const Chan& bias,
    fe::DataType_t dt) {
  const int64_t c = static_cast<int64_t>(scale.h.size());
  auto S = gb.channels((name + "_scale").c_str(), c, scale.ptr(dt), dt);
  auto B = gb.channels((name + "_bias").c_str(), c, bias.ptr(dt), dt);
  auto scaled = gb.pw((name + "_mul").c_str(), fe::PointwiseMode_t::MUL, X, S);
  return gb.pw((name + "_add").c_str(), fe::PointwiseMode_t::ADD, scaled, B);
}

// relu(x * scale + bias) a channel: the previous BatchNorm and ReLU as a
// prologue (scale and bias: bn_finalize's eq_scale and eq_bias).
TensorPtr sbr_prologue(
    GraphBuilder& gb,
    const Operands& o,
    TensorPtr X,
    fe::DataType_t dt) {
  auto bn = scale_bias(gb, "prologue", X, o.in_scale, o.in_bias, dt);
  return gb.pw("relu", fe::PointwiseMode_t::RELU_FWD, bn);
}

// Each graph's nodes, added to gb; dt is the per-channel parameters' type.
// F1, F2, F3: [scale+bias+ReLU ->] conv_fprop [-> genstats].
void fprop_nodes(GraphBuilder& gb, Operands& o, Kind kind, fe::DataType_t dt) {
  const Problem& p = o.p;
  TensorPtr in = x_tensor(gb, "image", p, o.x.p);
  if (kind == F3)
    in = sbr_prologue(gb, o, in, dt);
  auto Y = gb.graph().conv_fprop(
      in,
      w_tensor(gb, p, o.w.p),
      conv_attributes<fe::graph::Conv_fprop_attributes>("fprop", p));
  Y->set_dim(p.y_dim()).set_stride(p.y_stride());
  gb.output(Y, (kind == F1 ? o.y1 : kind == F2 ? o.y2 : o.y3).p);
  if (kind != F1) {
    auto [SUM, SQ] = gb.graph().genstats(
        Y, fe::graph::Genstats_attributes().set_name("genstats"));
    gb.output(SUM, (kind == F2 ? o.sum2 : o.sum3).p, fe::DataType_t::FLOAT);
    gb.output(SQ, (kind == F2 ? o.sq2 : o.sq3).p, fe::DataType_t::FLOAT);
  }
}

// F4: bn_finalize, as samples/cpp/norm/batchnorm.cpp's "BN Finalize Graph"
// (an fp32 graph); eq_scale and eq_bias in type dt.
void finalize_nodes(GraphBuilder& gb, FinalizeOperands& f, fe::DataType_t dt) {
  const auto F = fe::DataType_t::FLOAT;
  auto SUM = gb.channels("sum", f.c, f.sum.f32.p, F);
  auto SQ = gb.channels("sq_sum", f.c, f.sq.f32.p, F);
  auto S = gb.channels("scale", f.c, f.gamma.f32.p, F);
  auto B = gb.channels("bias", f.c, f.beta.f32.p, F);
  auto RM = gb.channels("prev_running_mean", f.c, f.rmean.f32.p, F);
  auto RV = gb.channels("prev_running_var", f.c, f.rvar.f32.p, F);
  // NOTE: scalars passed by value: the graph holds them, not the pack.
  auto eps =
      gb.graph().tensor(fe::graph::Tensor_attributes(static_cast<float>(kEps)));
  auto momentum = gb.graph().tensor(fe::graph::Tensor_attributes(kMomentum));
  auto count = gb.graph().tensor(
      fe::graph::Tensor_attributes(static_cast<int64_t>(f.count)));
  fe::graph::BN_finalize_attributes attrs;
  attrs.set_name("bn_finalize");
  attrs.set_previous_running_stats(RM, RV, momentum);
  auto [eq_scale, eq_bias, mean, inv, next_rm, next_rv] =
      gb.graph().bn_finalize(SUM, SQ, S, B, eps, count, attrs);
  gb.output(eq_scale, f.eq_scale.p, dt);
  gb.output(eq_bias, f.eq_bias.p, dt);
  gb.output(mean, f.mean.p, F);
  gb.output(inv, f.inv.p, F);
  gb.output(next_rm, f.next_rmean.p, F);
  gb.output(next_rv, f.next_rvar.p, F);
}

// F6: relu(y * eq_scale + eq_bias + shortcut), the shortcut either the
// downsample's raw output normalised with its own scale and bias or the
// block's input as it is.
void bn3_pass_nodes(GraphBuilder& gb, Operands& o, bool ds, fe::DataType_t dt) {
  auto Y = y_tensor(gb, "conv3_out", o.p, o.y1.p);
  auto Z = y_tensor(gb, "shortcut", o.p, o.bn_z.p);
  auto bn3 = scale_bias(gb, "bn3", Y, o.eq_scale, o.eq_bias, dt);
  if (ds)
    Z = scale_bias(gb, "downsample_bn", Z, o.ds_scale, o.ds_bias, dt);
  auto sum = gb.pw("add", fe::PointwiseMode_t::ADD, bn3, Z);
  gb.output(gb.pw("relu", fe::PointwiseMode_t::RELU_FWD, sum), o.f6_out.p);
}

// B1, B2: conv_wgrad of x, or of relu(x * scale + bias) recomputed from x.
void wgrad_nodes(GraphBuilder& gb, Operands& o, Kind kind, fe::DataType_t dt) {
  const Problem& p = o.p;
  TensorPtr X = x_tensor(gb, "image", p, o.x.p);
  if (kind == B2)
    X = sbr_prologue(gb, o, X, dt);
  auto DW = gb.graph().conv_wgrad(
      y_tensor(gb, "grad", p, o.dy.p),
      X,
      conv_attributes<fe::graph::Conv_wgrad_attributes>("wgrad", p));
  DW->set_dim(p.w_dim()).set_stride(p.w_stride());
  gb.output(DW, (kind == B2 ? o.dw2 : o.dw1).p);
}

// The first variant whose graph (io tensors in type io, nodes from
// add_nodes) builds and runs, timed; `keep` gets the graph (the numerics
// run it again) and `used` its variant. Where none runs, the cell's reason
// lists each variant's.
Cell first_that_runs(
    const Ctx& ctx,
    fe::DataType_t io,
    const std::vector<Variant>& variants,
    const std::function<void(GraphBuilder&, const Variant&)>& add_nodes,
    std::unique_ptr<Built>& keep,
    const Variant*& used) {
  std::string why;
  for (const Variant& v : variants) {
    std::unique_ptr<Built> b;
    Cell c = attempt(ctx, [&] {
      GraphBuilder gb(io, v.inter);
      add_nodes(gb, v);
      b = gb.finish(ctx);
      return timed(ctx, *b);
    });
    if (c.ran) {
      if (*v.label) {
        c.plan = std::string("[") + v.label + "] " + c.plan;
        c.plan_name = std::string("[") + v.label + "] " + c.plan_name;
      }
      keep = std::move(b);
      used = &v;
      return c;
    }
    why += std::string(why.empty() ? "" : " || ") +
        (*v.label ? v.label : "as MLPerf") + ": " + c.why;
  }
  Cell c;
  c.why = one_line(why, 1200);
  return c;
}

// ------------------------------------------------- today's BatchNorm kernel

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() {
    CUDNN_OK(Create(&d_));
  }
  ~Descriptor() {
    Destroy(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const {
    return d_;
  }

 private:
  T d_ = nullptr;
};

// The BatchNorm after the convolution as lamp runs it today
// (src/nn/batch_norm_act_cudnn.cpp, Note [Fused BatchNorm on cuDNN]):
// cuDNN's legacy "Ex" kernel on NHWC fp16 x (y1) and y, fp32 statistics,
// CUDNN_BATCHNORM_SPATIAL_PERSISTENT, the ops by what follows it, the ReLU
// descriptor ATen's, workspace and reserve space as cuDNN sizes them.
class LegacyBn {
 public:
  static constexpr cudnnBatchNormMode_t kMode =
      CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

  LegacyBn(const Ctx& ctx, Operands& o)
      : ctx_(ctx),
        o_(o),
        relu_(o.L.after != After::kNone),
        add_(o.L.after == After::kAddRelu) {
    ops_ = add_ ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
        : relu_ ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                : CUDNN_BATCHNORM_OPS_BN;
    const Problem& p = o.p;
    CUDNN_OK(cudnnSetTensor4dDescriptor(
        x_.get(),
        CUDNN_TENSOR_NHWC,
        CUDNN_DATA_HALF,
        static_cast<int>(p.n),
        static_cast<int>(p.cout),
        static_cast<int>(p.ho),
        static_cast<int>(p.ho)));
    CUDNN_OK(cudnnDeriveBNTensorDescriptor(stats_.get(), x_.get(), kMode));
    if (relu_)
      CUDNN_OK(cudnnSetActivationDescriptor(
          act_.get(),
          CUDNN_ACTIVATION_RELU,
          CUDNN_NOT_PROPAGATE_NAN,
          std::numeric_limits<double>::max()));
    const cudnnTensorDescriptor_t x = x_.get();
    CUDNN_OK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        ctx.handle, kMode, ops_, x, x, x, stats_.get(), act(), &fwd_ws_size_));
    CUDNN_OK(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
        ctx.handle, kMode, ops_, act(), x, &reserve_size_));
    CUDNN_OK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        ctx.handle,
        kMode,
        ops_,
        x,
        x,
        x,
        add_ ? x : nullptr,
        x,
        stats_.get(),
        act(),
        &bwd_ws_size_));
    // NOTE: never null, as lamp's: a null workspace would make cuDNN
    // ignore the fused ops.
    fwd_ws_.alloc(std::max<size_t>(fwd_ws_size_, 1));
    bwd_ws_.alloc(std::max<size_t>(bwd_ws_size_, 1));
    reserve_.alloc(std::max<size_t>(reserve_size_, 1));
  }

  void forward() {
    const cudnnTensorDescriptor_t x = x_.get();
    CUDNN_OK(cudnnBatchNormalizationForwardTrainingEx(
        ctx_.handle,
        kMode,
        ops_,
        &one_,
        &zero_,
        x,
        o_.y1.p,
        add_ ? x : nullptr,
        add_ ? o_.bn_z.p : nullptr,
        x,
        o_.bn_y.p,
        stats_.get(),
        o_.gamma.f32.p,
        o_.beta.f32.p,
        kMomentum,
        o_.rmean.p,
        o_.rvar.p,
        kEps,
        o_.smean.p,
        o_.sinv.p,
        act(),
        fwd_ws_.p,
        fwd_ws_.bytes,
        reserve_.p,
        reserve_.bytes));
  }

  // Needs a forward() before it (the reserve space, the saved statistics).
  void backward() {
    const cudnnTensorDescriptor_t x = x_.get();
    CUDNN_OK(cudnnBatchNormalizationBackwardEx(
        ctx_.handle,
        kMode,
        ops_,
        &one_,
        &zero_,
        &one_,
        &zero_,
        x,
        o_.y1.p,
        relu_ ? x : nullptr,
        relu_ ? o_.bn_y.p : nullptr,
        x,
        o_.dy.p,
        add_ ? x : nullptr,
        add_ ? o_.bn_dz.p : nullptr,
        x,
        o_.bn_dx.p,
        stats_.get(),
        o_.gamma.f32.p,
        relu_ ? o_.beta.f32.p : nullptr,
        o_.dgamma.p,
        o_.dbeta.p,
        kEps,
        o_.smean.p,
        o_.sinv.p,
        act(),
        bwd_ws_.p,
        bwd_ws_.bytes,
        reserve_.p,
        reserve_.bytes));
  }

  // "BN_ACTIVATION workspace 0/0 B reserve 1234 B" (forward/backward
  // workspace), for the notes.
  std::string describe() const {
    const char* ops = add_ ? "BN_ADD_ACTIVATION"
        : relu_            ? "BN_ACTIVATION"
                           : "BN";
    return std::string(ops) + " workspace " + std::to_string(fwd_ws_size_) +
        "/" + std::to_string(bwd_ws_size_) + " B reserve " +
        std::to_string(reserve_size_) + " B";
  }

 private:
  cudnnActivationDescriptor_t act() const {
    return relu_ ? act_.get() : nullptr;
  }

  const Ctx& ctx_;
  Operands& o_;
  bool relu_, add_;
  cudnnBatchNormOps_t ops_;
  Descriptor<
      cudnnTensorDescriptor_t,
      &cudnnCreateTensorDescriptor,
      &cudnnDestroyTensorDescriptor>
      x_, stats_;
  Descriptor<
      cudnnActivationDescriptor_t,
      &cudnnCreateActivationDescriptor,
      &cudnnDestroyActivationDescriptor>
      act_;
  size_t fwd_ws_size_ = 0, bwd_ws_size_ = 0, reserve_size_ = 0;
  DevBuf fwd_ws_, bwd_ws_, reserve_;
  const float one_ = 1.f, zero_ = 0.f;
};

#pragma GCC diagnostic pop

// A legacy call timed into a cell.
Cell timed_call(
    const Ctx& ctx,
    const std::function<void()>& call,
    const std::string& what) {
  Timing t = time_runs(ctx, call);
  Cell c;
  c.ran = true;
  c.us = t.us;
  c.plan_name = what;
  c.plan = what + (t.host_bound ? " (HOST-BOUND)" : "");
  return c;
}

// ------------------------------------------------------------- one layer

// bn_finalize built once for each (channels, count) pair in a batch.
struct Finalize {
  Cell cell;
  std::unique_ptr<FinalizeOperands> o;
  std::unique_ptr<Built> b;
  const Variant* v = nullptr;
};
using FinalizeCache = std::map<std::pair<int64_t, int64_t>, Finalize>;

// Everything measured on one layer.
struct LayerRun {
  Cell cell[NKINDS];
  bool tried[NKINDS] = {};
  std::unique_ptr<Built> built[NKINDS];
  const Variant* variant[NKINDS] = {};
  std::unique_ptr<LegacyBn> bn;
  Finalize* fin = nullptr;
  bool fin_new = false; // bn_finalize was measured on this layer
};

void run_layer(
    const Ctx& ctx,
    Operands& o,
    const bool enabled[NKINDS],
    FinalizeCache& finalize,
    uint64_t seed,
    LayerRun& r) {
  const Problem& p = o.p;
  for (int ki = 0; ki < NKINDS; ++ki) {
    const Kind k = static_cast<Kind>(ki);
    if (!enabled[k] || !applies(k, o.L))
      continue;
    r.tried[k] = true;
    Cell& c = r.cell[k];
    // The graph API's kinds: io tensors fp16, nodes from add.
    auto graph = [&](const std::vector<Variant>& vs, auto&& add) {
      return first_that_runs(
          ctx, fe::DataType_t::HALF, vs, add, r.built[k], r.variant[k]);
    };
    switch (k) {
      case F1:
      case F2:
      case F3:
        c = graph(
            k == F3 ? kWithParams : kPlain, [&](GraphBuilder& gb, auto& v) {
              fprop_nodes(gb, o, k, v.params);
            });
        break;
      case F4: {
        auto key = std::make_pair(p.cout, p.n * p.ho * p.ho);
        auto it = finalize.find(key);
        if (it == finalize.end()) {
          Finalize& f = finalize[key];
          r.fin_new = true;
          f.cell = attempt(ctx, [&] {
            f.o = std::make_unique<FinalizeOperands>(
                key.first, key.second, seed ^ 0xf4);
            return first_that_runs(
                ctx,
                fe::DataType_t::FLOAT,
                kWithParams,
                [&](GraphBuilder& gb, const Variant& v) {
                  finalize_nodes(gb, *f.o, v.params);
                },
                f.b,
                f.v);
          });
          it = finalize.find(key);
        }
        r.fin = &it->second;
        c = r.fin->cell;
        break;
      }
      case F5:
        c = attempt(ctx, [&] {
          r.bn = std::make_unique<LegacyBn>(ctx, o);
          return timed_call(
              ctx, [&] { r.bn->forward(); }, r.bn->describe());
        });
        break;
      case F6_DS:
      case F6_ID:
        c = graph(kWithParams, [&](GraphBuilder& gb, auto& v) {
          bn3_pass_nodes(gb, o, k == F6_DS, v.params);
        });
        break;
      case B0:
        c = graph(kPlain, [&](GraphBuilder& gb, auto&) {
          gb.output(conv_dgrad(gb, o.p, o.dy.p, o.w.p), o.dx.p);
        });
        break;
      case B1:
      case B2:
        c = graph(
            k == B2 ? kWgradWithParams : kPlain,
            [&](GraphBuilder& gb, auto& v) {
              wgrad_nodes(gb, o, k, v.params);
            });
        break;
      case B3:
        c = attempt(ctx, [&] {
          if (!r.cell[F5].ran) { // F5 not selected, or it failed
            r.bn = std::make_unique<LegacyBn>(ctx, o);
            r.bn->forward();
            CUDA_OK(cudaStreamSynchronize(ctx.stream));
          }
          return timed_call(
              ctx, [&] { r.bn->backward(); }, r.bn->describe());
        });
        break;
      default:
        break;
    }
  }
}

// ---------------------------------------------------------------- numerics

// Per-channel sum and sum of squares of an NHWC fp16 tensor, in double.
void channel_sums(
    const std::vector<uint16_t>& y,
    size_t C,
    std::vector<double>& sum,
    std::vector<double>& sq) {
  sum.assign(C, 0.0);
  sq.assign(C, 0.0);
  for (size_t i = 0; i < y.size(); ++i) {
    double v = h2f(y[i]);
    sum[i % C] += v;
    sq[i % C] += v * v;
  }
}

// A graph's fp16 or fp32 per-channel output as doubles.
std::vector<double> channel_output(const DevBuf& b, size_t C, bool half) {
  if (half)
    return widen(to_host_half(b, C));
  std::vector<float> f = to_host_float(b, C);
  return std::vector<double>(f.begin(), f.end());
}

void check_stats(
    const char* graph,
    const Operands& o,
    const DevBuf& y,
    const DevBuf& sum,
    const DevBuf& sq,
    const char* what) {
  const size_t C = static_cast<size_t>(o.p.cout);
  std::vector<double> rs, rq;
  channel_sums(to_host_half(y, o.p.dy_elems()), C, rs, rq);
  compare(to_host_float(sum, C), rs)
      .print(graph, (std::string("SUM against ") + what).c_str());
  compare(to_host_float(sq, C), rq)
      .print(graph, (std::string("SQ_SUM against ") + what).c_str());
}

void check_finalize(const Finalize& f) {
  const FinalizeOperands& o = *f.o;
  const size_t C = static_cast<size_t>(o.c);
  const double n = static_cast<double>(o.count), m = kMomentum;
  std::vector<double> mean(C), inv(C), eqs(C), eqb(C), nrm(C), nrv(C),
      nrv_biased(C);
  for (size_t c = 0; c < C; ++c) {
    double mu = o.sum.h[c] / n, var = o.sq.h[c] / n - mu * mu;
    mean[c] = mu;
    inv[c] = 1.0 / std::sqrt(var + kEps);
    eqs[c] = o.gamma.h[c] * inv[c];
    eqb[c] = o.beta.h[c] - mu * eqs[c];
    nrm[c] = (1 - m) * o.rmean.h[c] + m * mu;
    nrv[c] = (1 - m) * o.rvar.h[c] + m * var * n / (n - 1);
    nrv_biased[c] = (1 - m) * o.rvar.h[c] + m * var;
  }
  const bool half = f.v && f.v->params == fe::DataType_t::HALF;
  const char* g = "F4 bn_finalize";
  compare(channel_output(o.eq_scale, C, half), eqs).print(g, "eq_scale");
  compare(channel_output(o.eq_bias, C, half), eqb).print(g, "eq_bias");
  compare(channel_output(o.mean, C, false), mean).print(g, "saved mean");
  compare(channel_output(o.inv, C, false), inv).print(g, "saved inv std");
  compare(channel_output(o.next_rmean, C, false), nrm)
      .print(g, "next running mean");
  std::vector<double> got_rv = channel_output(o.next_rvar, C, false);
  compare(got_rv, nrv).print(g, "next running var (unbiased variance)");
  compare(got_rv, nrv_biased)
      .print(g, "next running var against the biased variance (for contrast)");
}

void check(const Ctx& ctx, Operands& o, LayerRun& r, int n) {
  const Problem& p = o.p;
  const size_t C = static_cast<size_t>(p.cin);
  std::printf(
      "\n## numerics, %s: F2/F3 sums against a double reduction of the "
      "outputs on the host, F3 and B2 against F1 and B1 run on x normalised "
      "on the host, F4 against its formulas in double\n",
      layer_tag(n, o.L).c_str());
  print_err_header();
  if (r.cell[F1].ran && r.cell[F2].ran) {
    check_stats("F2 conv+genstats", o, o.y1, o.sum2, o.sq2, "F1's y");
    compare(
        widen(to_host_half(o.y2, p.dy_elems())),
        widen(to_host_half(o.y1, p.dy_elems())))
        .print("F2 conv+genstats", "y against F1's y");
  }
  if (o.L.bn_relu_input &&
      ((r.cell[F1].ran && r.cell[F3].ran) ||
       (r.cell[B1].ran && r.cell[B2].ran))) {
    // xn = relu(x * scale + bias) in fp32, rounded to fp16 as the
    // convolution reads it.
    std::vector<uint16_t> xn = to_host_half(o.x, p.x_elems());
    for (size_t i = 0; i < xn.size(); ++i) {
      const size_t c = i % C;
      float v = h2f(xn[i]) * o.in_scale.h[c] + o.in_bias.h[c];
      xn[i] = f2h(v > 0.f ? v : 0.f);
    }
    DevBuf xn_dev;
    upload(xn_dev, xn.data(), xn.size() * 2);
    if (r.cell[F1].ran && r.cell[F3].ran) {
      DevBuf y_ref(p.dy_elems() * 2);
      r.built[F1]->run_swapped(ctx, {{o.x.p, xn_dev.p}, {o.y1.p, y_ref.p}});
      compare(
          widen(to_host_half(o.y3, p.dy_elems())),
          widen(to_host_half(y_ref, p.dy_elems())))
          .print("F3 sbr+conv+genstats", "y against F1 on normalised x");
      check_stats("F3 sbr+conv+genstats", o, o.y3, o.sum3, o.sq3, "F3's y");
    }
    if (r.cell[B1].ran && r.cell[B2].ran) {
      DevBuf dw_ref(p.w_elems() * 2);
      r.built[B1]->run_swapped(ctx, {{o.x.p, xn_dev.p}, {o.dw1.p, dw_ref.p}});
      compare(
          widen(to_host_half(o.dw2, p.w_elems())),
          widen(to_host_half(dw_ref, p.w_elems())))
          .print("B2 sbr+wgrad", "dw against B1 on normalised x");
    }
  } else if (!o.L.bn_relu_input) {
    std::printf("(no prologue on this layer: F3 and B2 not checked)\n");
  }
  if (r.fin && r.fin->cell.ran && r.fin->o)
    check_finalize(*r.fin);
  std::fflush(stdout);
}

// -------------------------------------------------------------- the totals

// A piece of a step: each layer's median times its count, and how many of
// the convolutions it should cover had a time.
struct Total {
  double ms = 0;
  int convs = 0, expected = 0;
  void add(double us, int count) {
    expected += count;
    if (!std::isnan(us)) {
      ms += us * count / 1000.0;
      convs += count;
    }
  }
  void add(const Total& t) {
    ms += t.ms;
    convs += t.convs;
    expected += t.expected;
  }
};

struct Totals {
  // today
  Total f1, f5, b0, b1, b3;
  // MLPerf form
  Total f2_rest, f3, f4, f6, b1_rest, b2, b0_rest, b3_rest, dbn;
  // for comparison
  Total f2_all, b0_bn_relu, b3_relu;

  void add(const Layer& L, const LayerRun& r, double dbn_us) {
    auto us = [&](Kind k) { return r.cell[k].us; };
    const int n = L.count;
    f1.add(us(F1), n);
    f5.add(us(F5), n);
    b0.add(us(B0), n);
    b1.add(us(B1), n);
    b3.add(us(B3), n);
    f2_all.add(us(F2), n);
    f4.add(us(F4), n);
    if (L.bn_relu_input) {
      f3.add(us(F3), n);
      b2.add(us(B2), n);
      dbn.add(dbn_us, n);
      b0_bn_relu.add(us(B0), n);
    } else {
      f2_rest.add(us(F2), n);
      b1_rest.add(us(B1), n);
      b0_rest.add(us(B0), n);
    }
    if (L.after == After::kAddRelu) {
      f6.add(us(F6_DS), 1);
      if (n > 1)
        f6.add(us(F6_ID), n - 1);
    }
    if (L.after == After::kRelu)
      b3_relu.add(us(B3), n);
    else
      b3_rest.add(us(B3), n);
  }
};

// One row of the totals; a sum of pieces (total) in bold, its last cell
// saying whether every piece had every time.
void print_total(
    const char* path,
    const char* piece,
    const char* graphs,
    const Total& t,
    bool total = false) {
  const char* b = total ? "**" : "";
  char cover[64] = "complete";
  if (!total)
    std::snprintf(
        cover,
        sizeof cover,
        "%d of %d%s",
        t.convs,
        t.expected,
        t.convs < t.expected ? " (INCOMPLETE)" : "");
  else if (t.convs < t.expected)
    std::snprintf(
        cover,
        sizeof cover,
        "INCOMPLETE: %d of %d times missing",
        t.expected - t.convs,
        t.expected);
  std::printf(
      "| %s%s%s | %s%s%s | %s | %s%.3f%s | %s |\n",
      b,
      path,
      b,
      b,
      piece,
      b,
      graphs,
      b,
      t.ms,
      b,
      cover);
}

void print_totals(int n, const Totals& t, bool have_dbn) {
  std::printf(
      "\n## batch %d: ms a step (each layer's median x its count; the last "
      "column: the convolutions whose time is in the sum, of those the piece "
      "covers, F6 counting bn3 passes)\n"
      "| path | piece | graphs | ms a step | convolutions |\n"
      "| --- | --- | --- | ---: | --- |\n",
      n);
  const char* today = "today";
  const char* mlperf = "MLPerf form";
  Total fwd_today, bwd_today, fwd_ml, bwd_ml;
  for (const Total* x : {&t.f1, &t.f5})
    fwd_today.add(*x);
  for (const Total* x : {&t.b0, &t.b1, &t.b3})
    bwd_today.add(*x);
  for (const Total* x : {&t.f2_rest, &t.f3, &t.f4, &t.f6})
    fwd_ml.add(*x);
  for (const Total* x : {&t.b1_rest, &t.b2, &t.b0_rest, &t.b3_rest, &t.dbn})
    bwd_ml.add(*x);
  print_total(today, "convolution", "F1, every convolution", t.f1);
  print_total(
      today,
      "lamp's BatchNorm (+ReLU, +add+ReLU)",
      "F5, after every convolution",
      t.f5);
  print_total(today, "forward", "", fwd_today, true);
  print_total(
      mlperf, "conv + genstats", "F2, input not a BN+ReLU output", t.f2_rest);
  print_total(
      mlperf,
      "BN+ReLU prologue + conv + genstats",
      "F3, input a BN+ReLU output",
      t.f3);
  print_total(mlperf, "bn_finalize", "F4, after every convolution", t.f4);
  print_total(
      mlperf,
      "bn3 pass: normalise, add the shortcut, ReLU",
      "F6: downsample in block 0, identity in the others",
      t.f6);
  print_total(mlperf, "forward", "", fwd_ml, true);
  print_total(today, "dgrad", "B0, every convolution", t.b0);
  print_total(today, "wgrad", "B1, every convolution", t.b1);
  print_total(
      today,
      "lamp's BatchNorm backward (+ReLU, +add+ReLU)",
      "B3, every BatchNorm",
      t.b3);
  print_total(today, "backward", "", bwd_today, true);
  print_total(
      mlperf,
      "wgrad of the saved input",
      "B1, input not a BN+ReLU output",
      t.b1_rest);
  print_total(
      mlperf,
      "wgrad with the BN+ReLU prologue",
      "B2, input a BN+ReLU output",
      t.b2);
  print_total(mlperf, "dgrad", "B0, input not a BN+ReLU output", t.b0_rest);
  print_total(
      mlperf,
      "bn3 and downsample BatchNorm backward (not fused: today's kernel)",
      "B3, BatchNorms not followed by a ReLU alone",
      t.b3_rest);
  print_total(
      mlperf,
      "dgrad + ReLU backward + BatchNorm backward",
      have_dbn ? "dbn_weight_probe's dbn + dx_pass (--dbn-csv)"
               : "dbn_weight_probe's dbn + dx_pass: NOT GIVEN (--dbn-csv)",
      t.dbn);
  print_total(mlperf, "backward", "", bwd_ml, true);
  Total step_today = fwd_today, step_ml = fwd_ml;
  step_today.add(bwd_today);
  step_ml.add(bwd_ml);
  print_total(today, "forward + backward", "", step_today, true);
  print_total(mlperf, "forward + backward", "", step_ml, true);
  std::printf(
      "\nFor comparison: F2 on every convolution (statistics everywhere, no "
      "prologue) %.3f ms (%d of %d). What dbn_weight_probe's rows replace "
      "(its \"(3) + (4): the whole DBN backward\" line at batch %d, over the "
      "%d convolutions whose input is a BN+ReLU output): today's B0 of those "
      "%.3f ms + B3 of the BatchNorms before a ReLU %.3f ms = %.3f ms.\n",
      t.f2_all.ms,
      t.f2_all.convs,
      t.f2_all.expected,
      n,
      t.b0_bn_relu.expected,
      t.b0_bn_relu.ms,
      t.b3_relu.ms,
      t.b0_bn_relu.ms + t.b3_relu.ms);
  if (!have_dbn)
    std::printf(
        "The MLPerf-form backward above lacks the dgrad + ReLU backward + "
        "BatchNorm backward of %d convolutions: add dbn_weight_probe's \"(3) "
        "+ (4)\" line for batch %d (or rerun with --dbn-csv).\n",
        t.dbn.expected,
        n);
}

// ------------------------------------------------------------------- main

// dbn_weight_probe's CSV: (batch, cin, cout, k, stride, hw) -> its "dbn" +
// "dx_pass" median (NaN where either is missing).
using DbnTimes = std::map<std::array<int, 6>, std::pair<double, double>>;

DbnTimes read_dbn_csv(const std::string& path) {
  DbnTimes t;
  std::ifstream in(path);
  if (!in) {
    std::printf("note: cannot read --dbn-csv %s\n", path.c_str());
    return t;
  }
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ','))
      f.push_back(cell);
    if (f.size() < 9 || f[0] == "batch")
      continue;
    try {
      std::array<int, 6> key;
      for (size_t i = 0; i < 6; ++i)
        key[i] = std::stoi(f[i]);
      double us = std::stod(f[8]); // "nan" reads as NaN
      auto& slot = t.try_emplace(key, NAN, NAN).first->second;
      if (f[7] == "dbn")
        slot.first = us;
      else if (f[7] == "dx_pass")
        slot.second = us;
    } catch (const std::exception&) {
      // a malformed line: skipped
    }
  }
  return t;
}

double dbn_us(const DbnTimes& t, int n, const Layer& L) {
  auto it = t.find({n, L.cin, L.cout, L.k, L.stride, L.hw});
  return it == t.end() ? NAN : it->second.first + it->second.second;
}

// --graphs: keys or their prefixes (f1, b2, f6 for both passes).
void parse_graphs(const std::string& list, bool enabled[NKINDS]) {
  std::fill(enabled, enabled + NKINDS, false);
  std::stringstream ss(list);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    bool any = false;
    for (int k = 0; k < NKINDS; ++k) {
      const std::string key = kKey[k];
      if (!tok.empty() &&
          (key == tok || key.compare(0, tok.size() + 1, tok + "_") == 0)) {
        enabled[k] = true;
        any = true;
      }
    }
    if (!any)
      usage_error("--graphs: unknown graph '" + tok + "' (f1..f6, b0..b3)");
  }
}

std::string cells_row(const LayerRun& r) {
  std::string s;
  for (int k = 0; k < NKINDS; ++k)
    s += " " + (r.tried[k] ? fmt_us(r.cell[k].us) : std::string()) + " |";
  return s;
}

} // namespace

int main(int argc, char** argv) {
  Options opt;
  opt.check_layer = kDefaultCheckLayer;
  Ctx ctx;
  bool enabled[NKINDS];
  std::fill(enabled, enabled + NKINDS, true);
  std::string dbn_csv;
  parse_args(
      argc,
      argv,
      "[--batch-sizes 64,256] [--iters 20] [--plans 8] [--check-layer 2 "
      "(index into the 23 shapes; -1: none)] [--layers i,j (indices into the "
      "23 shapes)] [--graphs f1,f2,f3,f4,f5,f6,b0,b1,b2,b3] [--dbn-csv FILE "
      "(dbn_weight_probe's CSV)] [--csv FILE] [--gate-ms 5]",
      opt,
      ctx,
      [&](const std::string& flag, const std::function<std::string()>& val) {
        if (flag == "--graphs")
          parse_graphs(val(), enabled);
        else if (flag == "--dbn-csv")
          dbn_csv = val();
        else
          return false;
        return true;
      });

  Csv csv;
  return run_main([&] {
    open_device(ctx);
    csv.open(opt.csv_path);
    const DbnTimes dbn = dbn_csv.empty() ? DbnTimes() : read_dbn_csv(dbn_csv);
    const Pool pool;
    auto t_start = std::chrono::steady_clock::now();
    for (size_t bi = 0; bi < opt.batches.size(); ++bi) {
      const int n = opt.batches[bi];
      std::printf(
          "\n## batch %d, per layer (us a call, median; '-' where the graph "
          "did not run, blank where it does not apply)\n| # | cin | cout | k "
          "| s | hw | count | BN then |",
          n);
      for (int k = 0; k < NKINDS; ++k)
        std::printf(" %s |", kColumn[k]);
      std::printf("\n| --- | --- | --- | --- | --- | --- | --- | --- |");
      for (int k = 0; k < NKINDS; ++k)
        std::printf(" ---: |");
      std::printf("\n");
      std::fflush(stdout);
      std::vector<std::string> notes;
      FinalizeCache finalize;
      Totals totals;
      for (int li = 0; li < kNumLayers; ++li) {
        if (!selected(opt, li))
          continue;
        const Layer& L = kLayers[li];
        const std::string tag = layer_tag(n, L);
        std::unique_ptr<Operands> o;
        const uint64_t seed = 1000003ull * (li + 1) + n;
        try {
          o = std::make_unique<Operands>(make_problem(n, L), L, pool, seed);
        } catch (const std::exception& e) {
          std::printf(
              "| %d %s operands failed: %s |\n",
              li,
              layer_cells(L).c_str(),
              one_line(e.what()).c_str());
          cudaGetLastError();
          totals.add(L, LayerRun(), NAN); // counted as missing
          continue;
        }
        LayerRun r;
        run_layer(ctx, *o, enabled, finalize, seed, r);
        std::string plans;
        for (int k = 0; k < NKINDS; ++k) {
          if (!r.tried[k])
            continue;
          const Cell& c = r.cell[k];
          csv.row(n, L, kKey[k], c.ran ? c.us : NAN, c.plan_name);
          if (!c.ran)
            notes.push_back(tag + " " + kColumn[k] + ": did not run: " + c.why);
          else if (k != F4 || r.fin_new)
            plans += std::string(plans.empty() ? "" : "; ") + kColumn[k] + " " +
                c.plan;
        }
        notes.push_back(tag + " plans: " + plans);
        totals.add(L, r, dbn_us(dbn, n, L));
        std::printf(
            "| %d %s %s |%s\n",
            li,
            layer_cells(L).c_str(),
            after_name(L.after),
            cells_row(r).c_str());
        std::fflush(stdout);
        csv.flush();
        if (bi == 0 && li == opt.check_layer) {
          try {
            check(ctx, *o, r, n);
          } catch (const std::exception& e) {
            std::printf(
                "numerics check failed: %s\n", one_line(e.what()).c_str());
            cudaGetLastError();
          }
          std::printf("\n");
        }
      }
      print_totals(n, totals, !dbn.empty());
      std::printf("\nplans and failures, batch %d:\n", n);
      for (auto& s : notes)
        std::printf("  %s\n", s.c_str());
      std::printf("[%.0f s so far]\n", seconds_since(t_start));
      std::fflush(stdout);
    }
  });
}
