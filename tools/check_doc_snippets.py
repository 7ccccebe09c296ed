"""Keeps the code in lamp's Markdown docs equal to code that CI compiles.

A fenced code block is quoted from a source file when the line before its
opening fence is

    <!-- snippet: PATH -->         the whole file, or
    <!-- snippet: PATH NAME -->    the lines between the comment lines
                                   `[snippet NAME]` and `[end snippet]` in
                                   PATH, less their common indentation.

PATH is relative to the repository root. Every C++ block must be quoted.
Without --write, prints every
block that differs from its source and exits 1 (CTest: docs.snippets);
with --write, rewrites those blocks from their sources.

  python3 tools/check_doc_snippets.py [--write] [FILE.md ...]
"""

import argparse
import glob
import os
import re
import sys
import textwrap

MARKER = re.compile(r"^<!-- snippet: (\S+)(?: (\S+))? -->$")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def region(path, name):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    if name is None:
        return lines
    begin = [i for i, l in enumerate(lines)
             if l.strip().endswith(f"[snippet {name}]")]
    if len(begin) != 1:
        raise ValueError(f"{path}: {len(begin)} '[snippet {name}]' lines")
    end = next((i for i in range(begin[0] + 1, len(lines))
                if lines[i].strip().endswith("[end snippet]")), None)
    if end is None:
        raise ValueError(f"{path}: '[snippet {name}]' without '[end snippet]'")
    body = "\n".join(lines[begin[0] + 1:end])
    return textwrap.dedent(body).splitlines()


def check(md, write):
    with open(md, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, problems, i = [], [], 0
    while i < len(lines):
        out.append(lines[i])
        m = MARKER.match(lines[i])
        if not m:
            if lines[i].startswith("```cpp") and (
                    i == 0 or not MARKER.match(lines[i - 1])):
                problems.append(f"{md}:{i + 1}: C++ that no compiled file "
                                "holds: quote it with a snippet marker")
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            problems.append(f"{md}:{i + 1}: a snippet marker without a code "
                            "block after it")
            i += 1
            continue
        close = next((k for k in range(i + 2, len(lines))
                      if lines[k].startswith("```")), None)
        if close is None:
            problems.append(f"{md}:{i + 2}: an unclosed code block")
            break
        try:
            want = region(m.group(1), m.group(2))
        except (OSError, ValueError) as e:
            problems.append(f"{md}:{i + 1}: {e}")
            want = lines[i + 2:close]
        if lines[i + 2:close] != want:
            problems.append(f"{md}:{i + 2}: differs from {m.group(1)}"
                            + (f" [{m.group(2)}]" if m.group(2) else ""))
        out.append(lines[i + 1])
        out.extend(want)
        out.append(lines[close])
        i = close + 1
    if write and out != lines:
        with open(md, "w", encoding="utf-8") as f:
            f.write("\n".join(out) + "\n")
        return []
    return problems


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--write", action="store_true")
    p.add_argument("files", nargs="*")
    a = p.parse_args()
    files = a.files or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "*.md")))
    problems = [p for md in files for p in check(md, a.write)]
    for p in problems:
        print(p)
    if problems:
        print("Update the docs from the code: python3 "
              "tools/check_doc_snippets.py --write")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
