#pragma once

/// Learning-rate schedulers that reproduce torch.optim.lr_scheduler step for
/// step: the same formulas in the same floating-point operations (bit-equal
/// learning rates), the same initial step, and the same `state_dict()`, which
/// moves between C++ and Python. See `lamp::optim::LRScheduler` for what they
/// share (initial_lr, state, CUDA graphs).
///
/// - factor.h: LambdaLR, MultiplicativeLR, ConstantLR, LinearLR
/// - decay.h: StepLR, MultiStepLR, ExponentialLR, PolynomialLR,
///   CosineAnnealingLR
/// - cyclic.h: CosineAnnealingWarmRestarts, OneCycleLR
/// - composite.h: SequentialLR, ChainedScheduler
/// - plateau.h: ReduceLROnPlateau

#include <lamp/lr_scheduler/base.h>
#include <lamp/lr_scheduler/composite.h>
#include <lamp/lr_scheduler/cyclic.h>
#include <lamp/lr_scheduler/decay.h>
#include <lamp/lr_scheduler/factor.h>
#include <lamp/lr_scheduler/plateau.h>
