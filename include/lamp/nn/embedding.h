#pragma once

#include <lamp/export.h>

#include <torch/types.h>

#include <cstdint>
#include <optional>

namespace lamp::nn {

/// Python's `F.embedding(input, weight, padding_idx)`: the rows of `weight`
/// (V, C) at `input`'s indices (any shape, int64 or int32), (..., C).
/// Forward values are ATen's; the weight's gradient is ATen's, bit for bit
/// on CUDA where at least 3,072 indices are looked up (below that ATen
/// sums in another order: equal within rounding), and always a dense
/// tensor.
///
/// Why: GPT-2 ties its LM head to the token embedding. With ATen's
/// embedding the weight gets two dense (V, C) gradients a step, the
/// embedding's (zeroed, then its looked-up rows written) and the head's,
/// which autograd then adds: for GPT-2 three more passes over a 154 MB
/// fp32 tensor and a sort-and-scatter of five kernels. Where the same
/// weight, unchanged, is the weight of `lamp::nn::linear_cross_entropy`
/// called after this in the forward pass, lamp's embedding adds its rows
/// into the head's gradient in place instead (one kernel after the sort,
/// on CUDA), and the weight receives that one gradient: the same values as
/// ATen's sum. In any other case (no such head, the head's backward not
/// yet run when the embedding's runs, a third use of the weight whose
/// gradient autograd has already summed with the head's) the embedding
/// returns its own gradient as ATen's does.
///
/// \param input indices in [0, V).
/// \param weight (V, C), floating point.
/// \param padding_idx an index whose row gets no gradient (negative:
///   counted from V, as Python's); none by default.
///
/// Example (GPT-2's tied embedding and head):
/// \code
///   auto x = lamp::nn::embedding(idx, wte->weight) + wpe(pos);
///   // ... the blocks ...
///   auto loss = lamp::nn::linear_cross_entropy(ln_f(x), wte->weight, y);
/// \endcode
LAMP_API torch::Tensor embedding(
    const torch::Tensor& input,
    const torch::Tensor& weight,
    std::optional<int64_t> padding_idx = std::nullopt);

} // namespace lamp::nn
