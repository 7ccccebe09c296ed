#include "resize_batch.h"

#include "resize_kernel.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cstring>

namespace lamp::data::detail {
namespace {

// The kernel's description of image k; the checks of resized_crop and
// center_crop_box (lamp/data/transforms.h), which the per-image path makes.
ResizeJob job_for(
    const Recipe& recipe,
    const Placement& placement,
    const torch::Tensor& image,
    int64_t row) {
  TORCH_CHECK(
      image.dim() == 3 && image.size(2) == 3 &&
          image.scalar_type() == torch::kUInt8 && image.is_contiguous(),
      "resize_into_rows: expected a contiguous uint8 RGB image [height, "
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
  job.row = static_cast<int32_t>(row);
  if (recipe.train) {
    const CropBox& box = placement.box;
    check_box_inside(box, height, width, "resize_into_rows");
    job.region_top = static_cast<int32_t>(box.top);
    job.region_left = static_cast<int32_t>(box.left);
    job.region_height = static_cast<int32_t>(box.height);
    job.region_width = static_cast<int32_t>(box.width);
    job.resized_height = static_cast<int32_t>(size);
    job.resized_width = static_cast<int32_t>(size);
    job.flip = placement.flip ? 1 : 0;
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

} // namespace

void resize_into_rows(
    const Recipe& recipe,
    const std::vector<Placement>& placements,
    const std::vector<torch::Tensor>& images,
    const std::vector<int64_t>& rows,
    torch::Tensor& out) {
  const int64_t size = recipe.image_size;
  TORCH_CHECK(
      out.is_cuda() && out.scalar_type() == torch::kUInt8 &&
          out.is_contiguous() && out.dim() == 4 && out.size(1) == size &&
          out.size(2) == size && out.size(3) == 3,
      "resize_into_rows: the output must be a contiguous CUDA uint8 [N, ",
      size,
      ", ",
      size,
      ", 3] tensor, got ",
      out.scalar_type(),
      " ",
      out.sizes(),
      " on ",
      out.device());
  TORCH_CHECK(
      placements.size() == images.size() && rows.size() == images.size(),
      "resize_into_rows: ",
      images.size(),
      " images, ",
      placements.size(),
      " placements and ",
      rows.size(),
      " rows; pass one of each per image");
  if (images.empty()) {
    return;
  }
  const size_t bytes = images.size() * sizeof(ResizeJob);
  auto host = torch::empty(
      {static_cast<int64_t>(bytes)},
      torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  auto* jobs = reinterpret_cast<ResizeJob*>(host.data_ptr<uint8_t>());
  for (size_t k = 0; k < images.size(); ++k) {
    TORCH_CHECK(
        images[k].device() == out.device(),
        "resize_into_rows: image ",
        k,
        " is on ",
        images[k].device(),
        ", the output on ",
        out.device());
    TORCH_CHECK_INDEX(
        rows[k] >= 0 && rows[k] < out.size(0),
        "resize_into_rows: row ",
        rows[k],
        " is outside the output's ",
        out.size(0),
        " rows");
    const ResizeJob job = job_for(recipe, placements[k], images[k], rows[k]);
    std::memcpy(&jobs[k], &job, sizeof(job));
  }
  // NOTE: from pinned memory the copy is asynchronous; LibTorch's host
  // allocator keeps `host` from reuse until the copy has run.
  const auto device_jobs = host.to(out.device(), /*non_blocking=*/true);
  const auto stream = c10::cuda::getCurrentCUDAStream(out.device().index());
  C10_CUDA_CHECK(launch_resize_batch(
      reinterpret_cast<const ResizeJob*>(device_jobs.data_ptr<uint8_t>()),
      static_cast<int>(images.size()),
      static_cast<int>(size),
      out.data_ptr<uint8_t>(),
      stream.stream()));
}

} // namespace lamp::data::detail
