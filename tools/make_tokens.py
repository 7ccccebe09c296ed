"""Turns a local text corpus into token files for examples/gpt_amp and
benchmarks/gpt2.py, in llm.c's (and nanoGPT's) .bin layout: a header of 256
little-endian int32 (magic 20240520, version 1, the number of tokens, then
zeros), then the tokens as little-endian uint16.

The corpus is every file named and every *.txt under the folders named
(recursively, in sorted order), as one stream: the last --val-fraction of it
becomes val.bin, the rest train.bin. Tokenizers:
  byte  each UTF-8 byte is a token (vocabulary 256); the default;
  bpe   a byte-level BPE (GPT-2's pre-tokenizer) trained here on the corpus
        with the `tokenizers` package, written as tokenizer.json; each file
        starts with <|endoftext|> (token 0), as llm.c's GPT-2 files do.
Nothing is downloaded.

Examples:
  python3 tools/make_tokens.py corpus/ --out-dir out/tok
  python3 tools/make_tokens.py a.txt b.txt --out-dir out/tok --tokenizer bpe \\
      --vocab-size 8192
  python3 tools/make_tokens.py --check out/tok/train.bin
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
EOT = "<|endoftext|>"


def fail(message):
    print(f"make_tokens.py: {message}", file=sys.stderr)
    sys.exit(1)


def corpus_files(paths):
    files = []
    for arg in paths:
        path = Path(arg)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.txt") if p.is_file())
            if not found:
                fail(f"no *.txt files under {arg}")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            fail(f"no such file or folder: {arg}")
    return files


def read_bytes(path):
    try:
        return path.read_bytes()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def write_bin(path, tokens):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, len(tokens)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:  # then renamed: no half-written file on failure
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())
    os.replace(tmp, path)


def check(path):
    """Validates a .bin file; returns (number of tokens, largest token)."""
    try:
        size = os.path.getsize(path)
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if len(header) < HEADER_INTS or header[0] != MAGIC:
        fail(f"{path}: not a token file (no {MAGIC} magic in a 1 KiB header)")
    if header[1] != VERSION:
        fail(f"{path}: version {header[1]}, expected {VERSION}")
    count = int(header[2])
    held = (size - HEADER_INTS * 4) / 2
    if count < 1 or held != count:
        fail(f"{path}: header says {count} tokens, file holds {held:g}")
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_INTS * 4)
    return count, int(tokens.max())


def byte_tokens(files):
    data = b"".join(read_bytes(f) for f in files)
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16), 256, None


def bpe_tokens(files, vocab_size):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        fail("--tokenizer bpe needs the Python package 'tokenizers' "
             "(pip install tokenizers)")
    texts = []
    for f in files:
        try:
            texts.append(read_bytes(f).decode("utf-8"))
        except UnicodeDecodeError as e:
            fail(f"{f} is not UTF-8 text (byte {e.start}); --tokenizer byte takes any bytes")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    eot = tokenizer.token_to_id(EOT)
    encoded = tokenizer.encode_batch(texts)
    tokens = np.concatenate([np.array([eot] + e.ids, dtype=np.uint16) for e in encoded])
    return tokens, tokenizer.get_vocab_size(), tokenizer


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="text files, or folders of *.txt")
    p.add_argument("--out-dir", help="writes train.bin, val.bin (and tokenizer.json)")
    p.add_argument("--tokenizer", default="byte", choices=["byte", "bpe"])
    p.add_argument("--vocab-size", type=int, default=8192,
                   help="BPE vocabulary, 257..65535 (default 8192)")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="the last part of the stream kept for val.bin")
    p.add_argument("--check", metavar="FILE", help="validate a .bin file, print its tokens")
    args = p.parse_args()

    if args.check:
        count, top = check(args.check)
        print(f"{args.check}: {count} tokens, largest token {top}")
        return
    if not args.paths or not args.out_dir:
        fail("give text files or folders and --out-dir (or --check FILE)")
    if not 0 <= args.val_fraction < 1:
        fail("--val-fraction must be in [0, 1)")
    if args.tokenizer == "bpe" and not 257 <= args.vocab_size <= 65535:
        fail("--vocab-size must be in 257..65535 (256 bytes, <|endoftext|>, "
                "and tokens stored as uint16)")

    files = corpus_files(args.paths)
    if args.tokenizer == "byte":
        tokens, vocab, tokenizer = byte_tokens(files)
    else:
        tokens, vocab, tokenizer = bpe_tokens(files, args.vocab_size)
    n = len(tokens)
    n_val = max(1, int(n * args.val_fraction))
    if n - n_val < 1:
        fail(f"the corpus gives {n} token(s): too few for a train and a val split")
    if n >= 2**31:
        fail(f"the corpus gives {n} tokens, more than a .bin header counts (2^31 - 1)")

    out = Path(args.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_bin(out / "train.bin", tokens[:n - n_val])
        write_bin(out / "val.bin", tokens[n - n_val:])
        if tokenizer:
            tokenizer.save(str(out / "tokenizer.json"))
    except OSError as e:
        fail(f"cannot write to {out}: {e.strerror}")
    size = sum(f.stat().st_size for f in files)
    print(f"read {len(files)} file(s), {size:,} bytes; tokenizer {args.tokenizer}, "
          f"vocab {vocab} (pass --vocab-size {vocab} to the model)")
    print(f"wrote {out / 'train.bin'}: {n - n_val:,} tokens")
    print(f"wrote {out / 'val.bin'}: {n_val:,} tokens")
    if tokenizer:
        print(f"wrote {out / 'tokenizer.json'}")
    elif (out / "tokenizer.json").exists():
        print(f"note: {out / 'tokenizer.json'} is from an earlier BPE run; "
              "these files are bytes")


if __name__ == "__main__":
    main()
