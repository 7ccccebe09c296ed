#!/usr/bin/env bash
# Real text for the GPT benchmarks on a GPU host without network: the
# Markdown, reStructuredText and plain-text files of the host's Python
# packages (documentation, READMEs, licences: English prose and code), up to
# MB megabytes, made into GPT-2-sized BPE tokens (vocabulary 50,257, trained
# on that text by tools/make_tokens.py) in $DIR/train.bin and $DIR/val.bin.
#   DIR=<dir> [MB=40] tools/gpu/gpt2_corpus.sh
set -euo pipefail
DIR=${DIR:?set DIR to the folder for the token files}
MB=${MB:-40}
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$DIR/text"
find "$SITE" /usr/share/doc -type f \( -name '*.md' -o -name '*.rst' -o -name '*.txt' \) \
  -size +2k -size -2M 2> /dev/null | sort |
  python3 -c '
import sys
limit, total, out = int(sys.argv[1]) << 20, 0, open(sys.argv[2], "w")
for path in sys.stdin:
    try:
        text = open(path.strip(), encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    out.write(text + "\n\n")
    total += len(text)
    if total > limit:
        break
print(f"corpus: {total >> 20} MB of text")
' "$MB" "$DIR/text/corpus.txt"
python3 tools/make_tokens.py "$DIR/text/corpus.txt" --out-dir "$DIR" \
  --tokenizer bpe --vocab-size 50257 ||
  python3 tools/make_tokens.py "$DIR/text/corpus.txt" --out-dir "$DIR" # bytes
