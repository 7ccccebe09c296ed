"""Lists a folder tree with torchvision's ImageFolder (or DatasetFolder, for
other extensions) and prints what tests/image_folder_test.cpp compares.

Usage:
  image_folder_oracle.py CASE [:: CASE ...]
    CASE is ROOT [--extensions=EXT,...] [--allow-empty]
    [--valid-substring=TEXT]; each case's lines follow a line "case I".
    --extensions: DatasetFolder(ROOT, loader, extensions=(EXT, ...)) instead
      of ImageFolder(ROOT) ("--extensions=" is the empty tuple).
    --valid-substring: ImageFolder(ROOT, is_valid_file=...) keeping the
      paths that contain TEXT.
    Prints tab-separated lines, names as the raw bytes of the file system
    (undecodable names included): "root ROOT", one "class INDEX NAME" per
    class, one "sample TARGET PATH" per sample; or "error TYPE MESSAGE"
    when torchvision raises. No image is opened. Prints only
    "no torchvision" when torchvision cannot be imported.
"""

import os
import sys

try:
    from torchvision.datasets import DatasetFolder, ImageFolder
except ImportError:
    # The C++ test reads this line and skips.
    print("no torchvision")
    sys.exit(0)


def write(*fields):
    sys.stdout.buffer.write(
        b"\t".join(os.fsencode(str(f)) for f in fields) + b"\n")


def run_case(argv):
    root = argv[0]
    extensions = None
    allow_empty = False
    valid = None
    for arg in argv[1:]:
        if arg.startswith("--extensions="):
            value = arg.removeprefix("--extensions=")
            extensions = tuple(value.split(",")) if value else ()
        elif arg == "--allow-empty":
            allow_empty = True
        elif arg.startswith("--valid-substring="):
            text = arg.removeprefix("--valid-substring=")
            valid = lambda path: text in path  # noqa: E731
        else:
            raise SystemExit(f"unknown argument {arg}")
    try:
        if extensions is not None:
            dataset = DatasetFolder(root, loader=lambda path: path,
                                    extensions=extensions,
                                    allow_empty=allow_empty)
        else:
            dataset = ImageFolder(root, is_valid_file=valid,
                                  allow_empty=allow_empty)
    except OSError as e:
        write("error", type(e).__name__, e.strerror if e.filename else e)
        return
    write("root", dataset.root)
    for name in dataset.classes:
        write("class", dataset.class_to_idx[name], name)
    assert dataset.targets == [t for _, t in dataset.samples]
    for path, target in dataset.samples:
        write("sample", target, path)


if __name__ == "__main__":
    cases = [[]]
    for arg in sys.argv[1:]:
        if arg == "::":
            cases.append([])
        else:
            cases[-1].append(arg)
    for i, case in enumerate(cases):
        write("case", i)
        run_case(case)
