"""Runs the cases of tests/distributed_sampler_test.cpp with Python's
torch.utils.data.DistributedSampler and prints what the C++ test compares.

Usage:
  distributed_sampler_oracle.py CASE...
    CASE is SIZE:RANK:WORLD_SIZE:SHUFFLE:SEED:DROP_LAST:EPOCH (SHUFFLE and
    DROP_LAST 0 or 1). Prints one line per case:
    "case I NUM_SAMPLES TOTAL_SIZE INDEX..." (the indices of list(sampler)
    after set_epoch(EPOCH)), or "case I error TYPE MESSAGE" when Python
    raises.
"""

import sys

from torch.utils.data import DistributedSampler


class Sized:
    """A dataset of which the sampler reads only len()."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size


def run_case(spec):
    size, rank, world, shuffle, seed, drop_last, epoch = (
        int(v) for v in spec.split(":"))
    try:
        sampler = DistributedSampler(
            Sized(size), num_replicas=world, rank=rank, shuffle=shuffle == 1,
            seed=seed, drop_last=drop_last == 1)
    except ValueError as e:
        return f"error ValueError {e}"
    sampler.set_epoch(epoch)
    indices = list(sampler)
    assert len(indices) == len(sampler) == sampler.num_samples
    return " ".join(str(v) for v in
                    [sampler.num_samples, sampler.total_size] + indices)


if __name__ == "__main__":
    for i, spec in enumerate(sys.argv[1:]):
        print("case", i, run_case(spec))
