// The launchers lamp::dist reads: Open MPI, PMI (MPICH, Intel MPI) and
// Slurm. See Note [Launch environment] in launch.cpp.

#include "launchers.h"

#include "hostlist.h"

#include <c10/util/Exception.h>

namespace lamp::dist::detail {

std::string how_to_launch(Launcher launcher, int64_t world_size) {
  const auto n = std::to_string(world_size > 1 ? world_size : 2);
  switch (launcher) {
    case Launcher::kSlurm:
      return "start every task with srun, e.g. `srun --ntasks-per-node=<GPUs "
             "per node> ./program` in the batch script";
    case Launcher::kOpenMpi:
    case Launcher::kPmi:
      return "give every rank the store's address, e.g. `mpirun -np " + n +
          " -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ./program` "
          "(Open MPI; MPICH: -genv MASTER_ADDR <host> -genv MASTER_PORT "
          "29500)";
    default:
      return "launch with `torchrun --no-python --nproc_per_node=" + n +
          " ./program` (single host), or set RANK, WORLD_SIZE, LOCAL_RANK, "
          "MASTER_ADDR and MASTER_PORT for every process";
  }
}

namespace {

// The rank/size pair of one launcher: both or neither.
std::optional<Claim> read_pair(
    const Variables& v,
    Launcher launcher,
    const char* rank_name,
    const char* size_name,
    const char* local_rank_name,
    const char* local_size_name) {
  const auto rank = v.integer(rank_name);
  const auto size = v.integer(size_name);
  if (!rank && !size) {
    return std::nullopt;
  }
  TORCH_CHECK_VALUE(
      size,
      "lamp::dist: launched by ",
      to_string(launcher),
      "? ",
      rank_name,
      " is ",
      *rank,
      " but ",
      size_name,
      " is not set; ",
      how_to_launch(launcher, 0),
      ".");
  TORCH_CHECK_VALUE(
      rank,
      "lamp::dist: launched by ",
      to_string(launcher),
      "? ",
      size_name,
      " is ",
      *size,
      " but ",
      rank_name,
      " is not set; ",
      how_to_launch(launcher, *size),
      ".");
  Claim claim;
  claim.launcher = launcher;
  claim.rank = rank;
  claim.world_size = size;
  claim.rank_name = rank_name;
  claim.world_size_name = size_name;
  claim.local_rank = v.integer(local_rank_name);
  claim.local_rank_name = local_rank_name;
  claim.local_world_size = v.integer(local_size_name);
  claim.one_host = claim.local_world_size == size;
  return claim;
}

std::optional<Claim> read_slurm(const Variables& v) {
  const auto [ntasks, ntasks_name] =
      v.first_integer({"SLURM_NTASKS", "SLURM_NPROCS"});
  const auto procid = v.integer("SLURM_PROCID");
  const auto nprocs = v.integer("SLURM_NPROCS");
  TORCH_CHECK_VALUE(
      !ntasks || !nprocs || *ntasks == *nprocs,
      "lamp::dist: Slurm's SLURM_NTASKS=",
      *ntasks,
      " and SLURM_NPROCS=",
      nprocs.value_or(0),
      " disagree.");
  if (!ntasks) {
    // NOTE: a batch script has SLURM_PROCID=0 without a task count; only a
    // higher rank proves a world of several.
    TORCH_CHECK_VALUE(
        procid.value_or(0) == 0,
        "lamp::dist: launched by Slurm? SLURM_PROCID is ",
        *procid,
        " but SLURM_NTASKS is not set; ",
        how_to_launch(Launcher::kSlurm, 0),
        ".");
    return std::nullopt;
  }
  TORCH_CHECK_VALUE(
      procid || *ntasks <= 1,
      "lamp::dist: launched by Slurm? ",
      ntasks_name,
      " is ",
      *ntasks,
      " but SLURM_PROCID is not set; ",
      how_to_launch(Launcher::kSlurm, *ntasks),
      ".");
  Claim claim;
  claim.launcher = Launcher::kSlurm;
  claim.rank = procid.value_or(0);
  claim.world_size = ntasks;
  claim.rank_name = "SLURM_PROCID";
  claim.world_size_name = ntasks_name;
  claim.local_rank = v.integer("SLURM_LOCALID");
  claim.local_rank_name = "SLURM_LOCALID";
  const auto [nodes, nodes_name] = v.first_integer(
      {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  claim.one_host = nodes == 1;
  for (const char* name :
       {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"}) {
    if (const auto list = v.text(name)) {
      claim.master_addr = detail::expand_slurm_hostlist(*list, name).front();
      break;
    }
  }
  const auto [job, job_name] = v.first_integer({"SLURM_JOB_ID", "SLURM_JOBID"});
  if (job) {
    TORCH_CHECK_VALUE(
        *job >= 0, "lamp::dist: ", job_name, "=", *job, " is negative.");
    claim.master_port = 10000 + *job % 50000;
    claim.master_port_from = "10000 + " + job_name + " % 50000 (" + job_name +
        "=" + std::to_string(*job) + ")";
  }
  return claim;
}

} // namespace

// Source 2 of Note [Launch environment]: the first launcher present.
Claim read_launcher(const Variables& v) {
  auto ompi = read_pair(
      v,
      Launcher::kOpenMpi,
      "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE");
  auto pmi = read_pair(
      v,
      Launcher::kPmi,
      "PMI_RANK",
      "PMI_SIZE",
      "MPI_LOCALRANKID",
      "MPI_LOCALNRANKS");
  TORCH_CHECK_VALUE(
      !ompi || !pmi ||
          (ompi->rank == pmi->rank && ompi->world_size == pmi->world_size),
      "lamp::dist: conflicting launchers: Open MPI says rank ",
      *ompi->rank,
      " of ",
      *ompi->world_size,
      " (OMPI_COMM_WORLD_RANK/SIZE) but PMI says rank ",
      pmi->rank.value_or(0),
      " of ",
      pmi->world_size.value_or(0),
      " (PMI_RANK/SIZE); unset the stale ones.");
  if (ompi) {
    return *ompi;
  }
  if (pmi) {
    return *pmi;
  }
  if (auto slurm = read_slurm(v)) {
    return *slurm;
  }
  return Claim{};
}

} // namespace lamp::dist::detail
