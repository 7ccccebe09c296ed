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
// Build (see tools/gpu/cudnn_probe.sh, PROBE=dbn_weight_probe; the harness
// is benchmarks/cudnn_probe.h):
//   g++ -std=c++17 -O2 -isystem <cudnn-frontend>/include -I<cudnn>/include
//       -I<cuda>/include benchmarks/dbn_weight_probe.cpp -L<cudnn>/lib
//       -l:libcudnn.so.9 -L<cuda>/lib64 -lcudart -lnvrtc -ldl -pthread
// Usage:
//   dbn_weight_probe [--batch-sizes 64,256] [--iters 20] [--plans 8]
//       [--check-layer 0] [--layers 0,3] [--csv FILE] [--gate-ms 5]

#include "cudnn_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace cudnn_probe;

// ------------------------------------------------------------- one layer

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
    w_host = random_weights(r, p);

    const size_t xb = X * 2, cb = C * 4;
    random_fill(pool, r, dy, p.dy_elems());
    upload(w, w_host.data(), w_host.size() * 2);
    upload(x, x_host.data(), xb);
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

// Builds graph `kind` of the layer as dgrads.cpp does, builds its first
// ctx.plans plans and keeps the fastest.
std::unique_ptr<Built> build(const Ctx& ctx, Kind kind, Operands& o) {
  const Problem& p = o.p;
  GraphBuilder gb(fe::DataType_t::HALF, fe::DataType_t::FLOAT);
  const auto F = fe::DataType_t::FLOAT;

  if (kind == DXPASS) {
    auto DR = x_tensor(gb, "dr", p, o.dr_dbn.p);
    auto X = x_tensor(gb, "x", p, o.x.p);
    auto A = gb.channels("eq_scale_dy", p.cin, o.eq_dy.p, F);
    auto B = gb.channels("eq_scale_x", p.cin, o.eq_x.p, F);
    auto C = gb.channels("eq_bias", p.cin, o.eq_bias.p, F);
    auto t1 = gb.pw("dr_scale", fe::PointwiseMode_t::MUL, DR, A);
    auto t2 = gb.pw("x_scale", fe::PointwiseMode_t::MUL, X, B);
    auto t3 = gb.pw("sum", fe::PointwiseMode_t::ADD, t1, t2);
    auto DX = gb.pw("dx", fe::PointwiseMode_t::ADD, t3, C);
    gb.output(DX, o.dx_pass.p);
  } else {
    auto DZ = conv_dgrad(gb, p, o.dy.p, o.w.p);
    if (kind == DGRAD) {
      gb.output(DZ, o.dx_dgrad.p);
    } else if (kind == DRELU_Z) {
      auto Z = x_tensor(gb, "relu_input", p, o.x.p);
      auto DR = gb.pw("drelu", fe::PointwiseMode_t::RELU_BWD, DZ, Z);
      gb.output(DR, o.dr_z.p);
    } else {
      auto X = x_tensor(gb, "image", p, o.x.p);
      auto M = gb.channels("mean", p.cin, o.mean.p, F);
      auto V = gb.channels("inv_variance", p.cin, o.inv.p, F);
      auto S = gb.channels("scale", p.cin, o.scale.p, F);
      auto Bi = gb.channels("bias", p.cin, o.bias.p, F);
      auto centred = gb.pw("mean_sub", fe::PointwiseMode_t::SUB, X, M);
      auto norm = gb.pw("inv_var_mul", fe::PointwiseMode_t::MUL, centred, V);
      auto scaled = gb.pw("scale_mul", fe::PointwiseMode_t::MUL, norm, S);
      auto bn = gb.pw("bias_add", fe::PointwiseMode_t::ADD, scaled, Bi);
      auto DR = gb.pw("drelu", fe::PointwiseMode_t::RELU_BWD, DZ, bn);
      gb.output(DR, kind == DBN ? o.dr_dbn.p : o.dr_bn.p);
      if (kind == DBN) {
        auto [dscale, dbias, eq_dy, eq_x, eq_bias] = gb.graph().dbn_weight(
            DR,
            X,
            M,
            V,
            S,
            fe::graph::DBN_weight_attributes().set_name("dbn_weight"));
        gb.output(dscale, o.dscale.p, F);
        gb.output(dbias, o.dbias.p, F);
        gb.output(eq_dy, o.eq_dy.p, F);
        gb.output(eq_x, o.eq_x.p, F);
        gb.output(eq_bias, o.eq_bias.p, F);
      }
    }
  }
  return gb.finish(ctx);
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
  print_err_header();
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
          compare(to_host_float(b, C), ref).print("dbn", what);
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
    std::vector<double> ref(X);
    for (size_t i = 0; i < X; ++i) {
      size_t c = i % C;
      ref[i] = r_eqdy[c] * dr_ref[i] + r_eqx[c] * h2f(o.x_host[i]) + r_eqb[c];
    }
    compare(widen(to_host_half(o.dx_pass, X)), ref)
        .print("dbn -> dx pass", "dx (BatchNorm backward)");
  }
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  Options opt;
  Ctx ctx;
  parse_args(
      argc,
      argv,
      "[--batch-sizes 64,256] [--iters 20] [--plans 8] [--check-layer 0 (-1: none)] "
      "[--layers i,j (indices into the 11 shapes)] [--csv FILE] [--gate-ms 5]",
      opt,
      ctx);

  std::vector<Layer> layers;
  for (const Layer& l : kLayers)
    if (l.bn_relu_input)
      layers.push_back(l);

  Csv csv;
  return run_main([&] {
    open_device(ctx);
    csv.open(opt.csv_path);
    const Pool pool;
    auto t_start = std::chrono::steady_clock::now();
    for (size_t bi = 0; bi < opt.batches.size(); ++bi) {
      const int n = opt.batches[bi];
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
        if (!selected(opt, (int)li))
          continue;
        const Layer& L = layers[li];
        const bool checking = bi == 0 && (int)li == opt.check_layer;
        const Problem p = make_problem(n, L);
        double us[NKINDS];
        bool ran[NKINDS] = {};
        std::string plan_line;
        const std::string tag = layer_tag(n, L);
        std::unique_ptr<Operands> o;
        try {
          o = std::make_unique<Operands>(
              p, pool, 1000003ull * (li + 1) + n, checking);
        } catch (const std::exception& e) {
          std::printf(
              "%s operands failed: %s |\n",
              layer_cells(L).c_str(),
              one_line(e.what()).c_str());
          cudaGetLastError();
          continue;
        }
        for (int k = 0; k < NKINDS; ++k) {
          Cell c = attempt(ctx, [&] {
            auto b = build(ctx, static_cast<Kind>(k), *o);
            return timed(ctx, *b);
          });
          us[k] = c.us;
          ran[k] = c.ran;
          if (ran[k]) {
            plan_line += std::string(plan_line.empty() ? "" : "; ") +
                kKindName[k] + " " + c.plan;
            csv.row(n, L, kKindKey[k], c.us, c.plan_name);
            total[k] += us[k] * L.count / 1000.0;
            shapes[k] += 1;
            convs[k] += L.count;
          } else {
            notes.push_back(
                tag + " " + kKindName[k] + ": not supported: " + c.why);
            csv.row(n, L, kKindKey[k], NAN, "");
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
            "%s %s | %s | %s | %s | %s | %s |\n",
            layer_cells(L).c_str(),
            fmt_us(us[DGRAD]).c_str(),
            fmt_us(us[DRELU_Z]).c_str(),
            fmt_us(us[DRELU]).c_str(),
            fmt_us(us[DBN]).c_str(),
            fmt_us(us[DXPASS]).c_str(),
            fmt_us(dbn_dx).c_str());
        notes.push_back(tag + " plans: " + plan_line);
        std::fflush(stdout);
        csv.flush();
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
      int all_convs = 0;
      for (size_t li = 0; li < layers.size(); ++li)
        if (selected(opt, (int)li))
          all_convs += layers[li].count;
      const int all_shapes =
          opt.layers.empty() ? (int)layers.size() : (int)opt.layers.size();
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
      std::printf("[%.0f s so far]\n", seconds_since(t_start));
      std::fflush(stdout);
    }
  });
}
