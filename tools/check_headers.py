"""Checks that every public header (include/lamp/**/*.h) is reachable from
the umbrella header lamp/lamp.h through #include <lamp/...> lines, as
lamp.h promises. Headers made at configure time (config.h, export.h) are
not in the tree and are skipped. Exits 1 listing the unreachable ones.

Usage: python3 tools/check_headers.py [INCLUDE_DIR]   (default: include)
"""

import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*<(lamp/[^>]+)>', re.M)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "include")
    headers = set()
    for dirpath, _, files in os.walk(os.path.join(root, "lamp")):
        for f in files:
            if f.endswith(".h"):
                headers.add(os.path.relpath(os.path.join(dirpath, f), root))
    seen, todo = set(), ["lamp/lamp.h"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = os.path.join(root, name)
        if os.path.exists(path):
            with open(path) as f:
                todo.extend(INCLUDE.findall(f.read()))
    missing = sorted(headers - seen)
    if missing:
        print("not reachable from lamp/lamp.h: " + ", ".join(missing))
        return 1
    print(f"all {len(headers)} public headers are reachable from lamp/lamp.h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
