#include "resize_batch.h"

#include "resize_kernel.h"
#include "transforms_detail.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cstring>

namespace lamp::data::detail {
namespace {

// The kernel's description of one row; the checks of resized_crop and
// center_crop_box (lamp/data/transforms.h), which the per-image path makes.
ResizeJob job_for(const Recipe& recipe, const RowSource& source) {
  const torch::Tensor& image = source.image;
  TORCH_CHECK(
      image.dim() == 3 && image.size(2) == 3 &&
          image.scalar_type() == torch::kUInt8 && image.is_contiguous(),
      "write_rows: expected a contiguous uint8 RGB image [height, "
      "width, 3], got ",
      image.scalar_type(),
      " ",
      image.sizes());
  const int64_t height = image.size(0);
  const int64_t width = image.size(1);
  const int64_t size = recipe.image_size;
  ResizeJob job{};
  job.src = image.data_ptr<uint8_t>();
  job.src_pitch = width * 3;
  job.row = static_cast<int32_t>(source.row);
  if (source.as_is) {
    TORCH_CHECK(
        height == size && width == size,
        "write_rows: a row taken as it is must be ",
        size,
        "x",
        size,
        ", got ",
        height,
        "x",
        width);
    job.region_height = job.region_width = static_cast<int32_t>(size);
    job.resized_height = job.resized_width = static_cast<int32_t>(size);
  } else if (recipe.train) {
    const CropBox& box = source.placement.box;
    check_box_inside(box, height, width, "write_rows");
    job.region_top = static_cast<int32_t>(box.top);
    job.region_left = static_cast<int32_t>(box.left);
    job.region_height = static_cast<int32_t>(box.height);
    job.region_width = static_cast<int32_t>(box.width);
    job.resized_height = static_cast<int32_t>(size);
    job.resized_width = static_cast<int32_t>(size);
    job.flip = source.placement.flip ? 1 : 0;
  } else {
    // Resize(resize_size) of the whole image, then CenterCrop(image_size).
    const auto resized = resize_shorter_side(height, width, recipe.resize_size);
    const CropBox window = center_crop_box(resized[0], resized[1], size, size);
    job.region_height = static_cast<int32_t>(height);
    job.region_width = static_cast<int32_t>(width);
    job.resized_height = static_cast<int32_t>(resized[0]);
    job.resized_width = static_cast<int32_t>(resized[1]);
    job.out_top = static_cast<int32_t>(window.top);
    job.out_left = static_cast<int32_t>(window.left);
  }
  return job;
}

ResizeOutput output_for(
    const Recipe& recipe,
    const Normalization* normalization,
    const torch::Tensor& out) {
  const int64_t size = recipe.image_size;
  ResizeOutput o{};
  o.data = out.data_ptr();
  if (normalization == nullptr) {
    TORCH_CHECK(
        out.is_cuda() && out.scalar_type() == torch::kUInt8 &&
            out.is_contiguous() && out.dim() == 4 && out.size(1) == size &&
            out.size(2) == size && out.size(3) == 3,
        "write_rows: the output must be a contiguous CUDA uint8 [N, ",
        size,
        ", ",
        size,
        ", 3] tensor, got ",
        out.scalar_type(),
        " ",
        out.sizes(),
        " on ",
        out.device());
    o.type = ResizeOutputType::kUInt8;
    o.stride_n = out.stride(0);
    o.stride_y = out.stride(1);
    o.stride_x = out.stride(2);
    o.stride_c = out.stride(3);
    return o;
  }
  TORCH_CHECK(
      out.is_cuda() && out.dim() == 4 && out.size(1) == 3 &&
          out.size(2) == size && out.size(3) == size,
      "write_rows: the output must be a CUDA [N, 3, ",
      size,
      ", ",
      size,
      "] tensor, got ",
      out.sizes(),
      " on ",
      out.device());
  switch (out.scalar_type()) {
    case torch::kFloat:
      o.type = ResizeOutputType::kFloat;
      break;
    case torch::kHalf:
      o.type = ResizeOutputType::kHalf;
      break;
    case torch::kBFloat16:
      o.type = ResizeOutputType::kBFloat16;
      break;
    default:
      TORCH_CHECK(
          false,
          "write_rows: normalised output must be float, half or bfloat16, "
          "got ",
          out.scalar_type());
  }
  o.stride_n = out.stride(0);
  o.stride_c = out.stride(1);
  o.stride_y = out.stride(2);
  o.stride_x = out.stride(3);
  for (int c = 0; c < 3; ++c) {
    // As torch::tensor(double) -> float32: rounded to nearest.
    o.mean[c] = static_cast<float>(normalization->mean[c]);
    o.std[c] = static_cast<float>(normalization->std[c]);
  }
  return o;
}

} // namespace

void write_rows(
    const Recipe& recipe,
    const std::vector<RowSource>& sources,
    const Normalization* normalization,
    torch::Tensor& out) {
  const ResizeOutput output = output_for(recipe, normalization, out);
  if (sources.empty()) {
    return;
  }
  const size_t bytes = sources.size() * sizeof(ResizeJob);
  auto host = torch::empty(
      {static_cast<int64_t>(bytes)},
      torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  auto* jobs = reinterpret_cast<ResizeJob*>(host.data_ptr<uint8_t>());
  for (size_t k = 0; k < sources.size(); ++k) {
    TORCH_CHECK(
        sources[k].image.device() == out.device(),
        "write_rows: image ",
        k,
        " is on ",
        sources[k].image.device(),
        ", the output on ",
        out.device());
    TORCH_CHECK_INDEX(
        sources[k].row >= 0 && sources[k].row < out.size(0),
        "write_rows: row ",
        sources[k].row,
        " is outside the output's ",
        out.size(0),
        " rows");
    const ResizeJob job = job_for(recipe, sources[k]);
    std::memcpy(&jobs[k], &job, sizeof(job));
  }
  // NOTE: from pinned memory the copy is asynchronous; LibTorch's host
  // allocator keeps `host` from reuse until the copy has run.
  const auto device_jobs = host.to(out.device(), /*non_blocking=*/true);
  const auto stream = c10::cuda::getCurrentCUDAStream(out.device().index());
  C10_CUDA_CHECK(launch_resize_batch(
      reinterpret_cast<const ResizeJob*>(device_jobs.data_ptr<uint8_t>()),
      static_cast<int>(sources.size()),
      static_cast<int>(recipe.image_size),
      output,
      stream.stream()));
}

void resize_into_rows(
    const Recipe& recipe,
    const std::vector<Placement>& placements,
    const std::vector<torch::Tensor>& images,
    const std::vector<int64_t>& rows,
    torch::Tensor& out) {
  TORCH_CHECK(
      placements.size() == images.size() && rows.size() == images.size(),
      "resize_into_rows: ",
      images.size(),
      " images, ",
      placements.size(),
      " placements and ",
      rows.size(),
      " rows; pass one of each per image");
  std::vector<RowSource> sources(images.size());
  for (size_t k = 0; k < images.size(); ++k) {
    sources[k].image = images[k];
    sources[k].placement = placements[k];
    sources[k].row = rows[k];
  }
  write_rows(recipe, sources, nullptr, out);
}

} // namespace lamp::data::detail
