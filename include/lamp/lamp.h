#pragma once

/// lamp: automatic mixed precision and data-parallel training for LibTorch.
/// This umbrella header includes every public lamp header.

#include <lamp/activation_checkpoint.h>
#include <lamp/autocast.h>
#include <lamp/build_info.h>
#include <lamp/cast_weights.h>
#include <lamp/checkpoint.h>
#include <lamp/clip_grad.h>
#include <lamp/config.h>
#include <lamp/cuda_graph.h>
#include <lamp/data.h>
#include <lamp/distributed.h>
#include <lamp/fp8.h>
#include <lamp/grad_scaler.h>
#include <lamp/lr_scheduler.h>
#include <lamp/nn.h>
#include <lamp/optim.h>
#include <lamp/state_dict.h>
