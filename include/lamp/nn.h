#pragma once

/// lamp's layers and functional ops (lamp::nn): every header of
/// include/lamp/nn/. lamp/lamp.h includes it.

#include <lamp/nn/add_layer_norm.h>
#include <lamp/nn/avg_pool.h>
#include <lamp/nn/batch_count.h>
#include <lamp/nn/batch_norm_act.h>
#include <lamp/nn/conv_bn_add_relu.h>
#include <lamp/nn/conv_shortcut.h>
#include <lamp/nn/diagnostics.h>
#include <lamp/nn/embedding.h>
#include <lamp/nn/gelu_mlp.h>
#include <lamp/nn/linear.h>
#include <lamp/nn/linear_cross_entropy.h>
#include <lamp/nn/max_pool.h>
#include <lamp/nn/qkv_attention.h>
#include <lamp/nn/space_to_depth_conv.h>
