#pragma once

// Data-parallel training over NCCL (umbrella header): how a process finds
// its place in the job (`lamp/dist/launch.h`: torchrun, Slurm, Open MPI,
// MPICH), the process group (`lamp/dist/process_group.h`,
// `lamp::dist::init_process_group`) and `lamp::DistributedDataParallel`
// (`lamp/ddp.h`), which averages gradients across ranks while backward
// runs.

#include <lamp/ddp.h>
#include <lamp/dist/launch.h>
#include <lamp/dist/process_group.h>
