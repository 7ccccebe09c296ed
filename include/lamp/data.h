#pragma once

/// lamp::data: datasets and samplers for training from files, as
/// torchvision and torch.utils.data do it in Python. This umbrella header
/// includes every public lamp::data header.

#include <lamp/data/distributed_sampler.h>
#include <lamp/data/image_folder.h>
