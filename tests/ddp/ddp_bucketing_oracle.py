"""PyTorch's reducer bucketing for the random cases of tests/ddp_test.cpp.

Usage: ddp_bucketing_oracle.py CASES_FILE
Input, one case a line: "ID LIMITS DTYPES NUMELS [INDICES]", each field a
comma-separated list (limits in bytes; dtypes as torch attribute names;
INDICES only for the indexed mode).
Output, one line a case: "ID BUCKETS LIMITS" with buckets as
"0,2;1" (";" between buckets) and their size limits comma-separated.
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import torch
import torch.distributed as dist


def main(path):
    for line in open(path):
        fields = line.split()
        if not fields:
            continue
        case, limits, dtypes, numels = fields[:4]
        indices = [int(i) for i in fields[4].split(",")] if len(fields) > 4 else []
        tensors = [
            torch.empty(int(n), dtype=getattr(torch, d), device="meta")
            for d, n in zip(dtypes.split(","), numels.split(","))
        ]
        buckets, sizes = dist._compute_bucket_assignment_by_size(
            tensors, [int(x) for x in limits.split(",")], [], indices)
        print(case,
              ";".join(",".join(str(i) for i in b) for b in buckets),
              ",".join(str(s) for s in sizes))


if __name__ == "__main__":
    main(sys.argv[1])
