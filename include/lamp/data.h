#pragma once

/// lamp::data: real images for training, as torchvision and
/// torch.utils.data do it in Python: ImageFolder (torchvision's folder
/// rules), DistributedSampler (Python's order), the CPU decoders,
/// torchvision's ImageNet transforms, and ImageLoader (decode threads, pinned
/// batches, GPU copy and normalisation, optional nvJPEG decode). This
/// umbrella header includes every public lamp::data header.

#include <lamp/data/distributed_sampler.h>
#include <lamp/data/image_decoder.h>
#include <lamp/data/image_folder.h>
#include <lamp/data/image_loader.h>
#include <lamp/data/token_dataset.h>
#include <lamp/data/transforms.h>
