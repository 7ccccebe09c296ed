"""Python twin of examples/gpt_amp: GPT-2 as in nanoGPT's model.py, trained
with PyTorch eager or torch.compile, timed the way the C++ example times it,
so the two run on one GPU in the same call and compare as a ratio.

The model is nanoGPT's GPT-2 (pre-LN blocks, LayerNorm with bias, fused QKV
projection with causal scaled_dot_product_attention, GELU(tanh) MLP, lm_head
tied to wte, GPT-2's initialisation), with its modules at the top level so that
the state_dict keys match lamp's checkpoints (`wte.weight`,
`h.0.attn.c_attn.weight`, `lm_head.weight`). The optimizer is AdamW (fused on
CUDA) with weight decay on the matrices only and lamp's examples' schedule (linear
warm-up, then cosine to 0).

Steps are timed as gpt_amp times them: the device is waited for only where
a window of steps ends (a logged step, the end of the warm-up, the last
step), so the host queues the next step while one runs, and each step of a
window counts as the window's mean, batch sampling included; ms_per_step is
the median over the --steps timed steps after --warmup untimed ones (where
torch.compile compiles). Peak memory is
torch.cuda.max_memory_allocated since just before the warm-up.

Examples, from the repository root (tools/gpu/gpt2_bench.sh runs lamp and
the three PyTorch variants in one go):
  python3 benchmarks/gpt2.py --model gpt2 --batch-size 16 --precision bf16
  python3 benchmarks/gpt2.py --model gpt2 --compile default --metrics out/c.jsonl
  python3 benchmarks/gpt2.py --model gpt2 --init lamp.pt  # lamp's weights
  python3 benchmarks/gpt2.py --model gpt2-xl --batch-size 8 --precision fp8 --compile default

--precision fp8 is gpt_amp's --precision fp8 in Python: bf16 autocast with
the blocks' Linear layers in FP8 through torchao's float8 training
(`convert_to_float8_training`, --fp8-recipe tensorwise as torchao's default,
or rowwise); the LM head stays bf16, as lamp's does. It needs torchao
importable (tools/gpu/deps.sh puts its wheel in .deps/; gpt2_bench.sh
unpacks it) and is meant with --compile, as torchao is.
  python3 tools/make_tokens.py corpus/ --out-dir out/tok
  python3 benchmarks/gpt2.py --model tiny --device cpu --data out/tok/train.bin
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# (n_layer, n_head, n_embd, vocab_size, block_size). 50304 is GPT-2's 50257
# padded up to a multiple of 64, as nanoGPT does, for faster matmuls.
CONFIGS = {
    "gpt2": (12, 12, 768, 50304, 1024),
    "gpt2-medium": (24, 16, 1024, 50304, 1024),
    "gpt2-large": (36, 20, 1280, 50304, 1024),
    "gpt2-xl": (48, 25, 1600, 50304, 1024),
    "tiny": (2, 2, 64, 256, 64),  # byte-level: tools/make_tokens.py's default
}
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1  # llm.c's .bin header


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0,
            is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        # NOTE: GPT-2's (and llm.c's) tanh approximation; nanoGPT uses the
        # exact GELU, which lamp does not match.
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg, checkpointing=False):
        super().__init__()
        self.cfg, self.checkpointing = cfg, checkpointing
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, one parameter
        self.apply(self._init_weights)
        # GPT-2 scales the projections into the residual stream by
        # 1/sqrt(number of residual additions).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            if self.checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)),
                               targets.view(-1), ignore_index=-1)

    def flops_per_token(self, seq_len):
        """nanoGPT's estimate_mfu: 6N for the matmuls over the weights (N
        without the position embedding, which is a lookup), plus attention's
        QK^T and AV over the sequence."""
        c = self.cfg
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * seq_len


def fail(message):
    print(f"gpt2.py: {message}", file=sys.stderr)
    sys.exit(1)


def load_tokens(path, vocab_size):
    """The tokens of an llm.c .bin file (tools/make_tokens.py writes them)."""
    try:
        size = os.path.getsize(path)
        header = np.fromfile(path, dtype="<i4", count=256)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if len(header) < 256 or header[0] != TOKENS_MAGIC or header[1] != TOKENS_VERSION:
        fail(f"{path}: not a token file (llm.c .bin layout, version {TOKENS_VERSION})")
    if size != 256 * 4 + 2 * int(header[2]) or header[2] < 1:
        fail(f"{path}: header says {header[2]} tokens, file holds "
             f"{(size - 256 * 4) / 2:g}")
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=256 * 4)
    top = int(tokens.max())
    if top >= vocab_size:
        fail(f"{path} holds token {top}, outside the model's vocabulary of "
             f"{vocab_size}; pass --vocab-size")
    return tokens


def make_schedule(optimizer, warmup_steps, total):
    """lamp's examples' --lr-schedule cosine (examples/training.h): a linear
    warm-up, then cosine annealing to 0, as Python's own schedulers."""
    S = torch.optim.lr_scheduler
    if warmup_steps <= 0:
        return S.CosineAnnealingLR(optimizer, T_max=total)
    w = min(warmup_steps, total)
    return S.SequentialLR(optimizer, [
        S.LinearLR(optimizer, 1.0 / w, 1.0, w),
        S.CosineAnnealingLR(optimizer, T_max=max(total - w, 1))], milestones=[w])


def to_float8(model, recipe):
    """The blocks' Linear layers in FP8 (torchao's float8 training), in place;
    the LM head, tied to the embedding, stays as it is (lamp's stays bf16)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        fail(f"--precision fp8 needs torchao ({e}); tools/gpu/deps.sh downloads its "
             "wheel to .deps/, tools/gpu/gpt2_bench.sh puts it on PYTHONPATH")
    convert_to_float8_training(
        model, config=Float8LinearConfig.from_recipe_name(recipe),
        module_filter_fn=lambda module, fqn: fqn.startswith("h."))
    n = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    print(f"torchao float8 ({recipe}): {n} Linear layers in FP8", flush=True)


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--model", default="gpt2", choices=list(CONFIGS))
    a("--vocab-size", type=int, help="default: 50304, or 256 for tiny")
    a("--dropout", type=float, default=0.0)
    a("--batch-size", type=int, default=16, help="sequences per micro-batch")
    a("--seq-len", type=int, help="default: the block size (1024; tiny: 64)")
    a("--grad-accum", type=int, default=1, help="micro-batches per step")
    a("--steps", type=int, default=50, help="timed steps")
    a("--warmup", type=int, default=10, help="untimed steps before them")
    a("--precision", default="bf16", choices=["bf16", "fp16", "fp32", "fp8"])
    a("--fp8-recipe", default="tensorwise", choices=["tensorwise", "rowwise"],
      help="--precision fp8: torchao's float8 recipe")
    a("--compile", default="none",
      choices=["none", "default", "max-autotune-no-cudagraphs"])
    a("--device", default="auto", choices=["auto", "cpu", "cuda"])
    a("--checkpointing", action="store_true",
      help="recompute each block in the backward pass (activation checkpointing)")
    a("--lr", type=float, default=6e-4)
    a("--warmup-steps", type=int, default=0,
      help="linear learning-rate warm-up before the cosine schedule")
    a("--weight-decay", type=float, default=0.1)
    a("--clip-grad-norm", type=float, default=1.0, help="0: off")
    a("--data", help="tokens in llm.c's .bin layout (default: random tokens)")
    a("--init", help="a lamp checkpoint whose 'model' entry holds the weights")
    a("--seed", type=int, default=0)
    a("--metrics", help="write JSON lines here")
    a("--trace", help="write a Chrome trace of the last 3 steps here (torch.profiler), "
                      "as lamp's --trace does")
    a("--log-every", type=int, default=10)
    a("--peak-tflops", type=float, default=989.0,
      help="the device's dense peak for MFU (H100/H200 bf16: 989)")
    args = p.parse_args()
    n_layer, n_head, n_embd, vocab, block = CONFIGS[args.model]
    args.vocab_size = vocab if args.vocab_size is None else args.vocab_size
    args.cfg = GPTConfig(n_layer, n_head, n_embd, args.vocab_size, block, args.dropout)
    args.seq_len = args.seq_len or block
    if not 1 <= args.seq_len <= block:
        p.error(f"--seq-len must be in 1..{block} (the block size of {args.model})")
    for name in ("vocab_size", "batch_size", "grad_accum", "steps", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be at least 0")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but CUDA is not available here")
    return args


def main():
    args = parse_args()
    cfg, device = args.cfg, torch.device(args.device)
    cuda = device.type == "cuda"
    impl = "pytorch-eager" if args.compile == "none" else f"pytorch-compile-{args.compile}"
    B, T = args.batch_size, args.seq_len

    # NOTE: built on the CPU so that a seed gives the same weights on any
    # device; --init gives lamp's.
    torch.manual_seed(args.seed)
    model = GPT(cfg, args.checkpointing)
    if args.init:
        try:
            state = torch.load(args.init, map_location="cpu", weights_only=True)["model"]
        except Exception as e:  # torch.load raises many kinds; the first line says why
            fail(f"cannot read the weights in {args.init}: {str(e).splitlines()[0]}")
        # Delayed FP8 scaling's buffers (gpt_amp --precision fp8) have no
        # place in this model.
        state = {k: v for k, v in state.items()
                 if not k.endswith(("fp8_amax_history", "fp8_scale"))}
        # A checkpoint may name the tied weight once.
        for a, b in (("wte.weight", "lm_head.weight"), ("lm_head.weight", "wte.weight")):
            if a in state and b not in state:
                state[b] = state[a]
        if "wte.weight" in state and not torch.equal(state["wte.weight"],
                                                     state["lm_head.weight"]):
            fail(f"{args.init}: wte.weight and lm_head.weight differ, but they are tied")
        want = model.state_dict()
        wrong = ([f"{k} is {tuple(state[k].shape)}, not {tuple(v.shape)}"
                  for k, v in want.items() if k in state and state[k].shape != v.shape] +
                 [f"missing {k}" for k in want if k not in state] +
                 [f"unexpected {k}" for k in state if k not in want])
        if wrong:
            fail(f"{args.init} does not fit --model {args.model} (vocab {cfg.vocab_size}): "
                 + "; ".join(wrong[:3]) + (f"; {len(wrong) - 3} more" if len(wrong) > 3 else ""))
        model.load_state_dict(state, strict=True)
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = model.flops_per_token(T)

    # Weight decay on matrices and embeddings, not on biases and LayerNorms.
    params = list(model.parameters())  # each tied tensor once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  fused=cuda or None)
    if args.precision == "fp8":
        to_float8(model, args.fp8_recipe)
    amp = args.precision != "fp32"
    dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    step_model = model if args.compile == "none" else torch.compile(model, mode=args.compile)

    data = load_tokens(args.data, cfg.vocab_size) if args.data else None
    if data is not None and len(data) < T + 1:
        fail(f"{args.data} holds {len(data)} tokens, fewer than --seq-len + 1 = {T + 1}")
    A = args.grad_accum
    windows = (len(data) - 1) // T if data is not None else 0
    per_epoch = windows // (B * A)
    if data is not None and per_epoch < 1:
        fail(f"{args.data}: {windows} windows of {T + 1} tokens, fewer than a batch of {B * A}")
    order = {}

    def batch_at(step):
        """lamp::data::TokenDataset's batch `step` (examples/gpt_amp): window
        w is tokens [w T, w T + T], the windows of an epoch in the order of
        torch.randperm seeded with seed + epoch (DistributedSampler, one
        rank); or lamp's random tokens for that step."""
        if data is None:
            g = torch.Generator().manual_seed(args.seed * 1000003 + step)
            xy = torch.randint(cfg.vocab_size, (B * A, T + 1), generator=g)
        else:
            epoch, index = divmod(step, per_epoch)
            if epoch not in order:
                g = torch.Generator().manual_seed(args.seed + epoch)
                order.clear()
                order[epoch] = torch.randperm(windows, generator=g).tolist()
            starts = order[epoch][index * B * A:(index + 1) * B * A]
            xy = torch.from_numpy(
                np.stack([data[w * T:w * T + T + 1] for w in starts]).astype(np.int64))
        if cuda:  # as nanoGPT: pinned, copied without waiting for the stream
            xy = xy.pin_memory().to(device, non_blocking=True)
        return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()

    schedule = make_schedule(optimizer, args.warmup_steps, args.warmup + args.steps)

    def train_step(it):
        lr = optimizer.param_groups[0]["lr"]
        total = torch.zeros((), device=device)
        x_all, y_all = batch_at(it)
        for a in range(A):
            x, y = x_all[a * B:(a + 1) * B], y_all[a * B:(a + 1) * B]
            with torch.autocast(device.type, dtype=dtype, enabled=amp):
                loss = step_model(x, y) / A
            scaler.scale(loss).backward()
            total += loss.detach()
        if args.clip_grad_norm > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, args.clip_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        return total, lr

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    if args.metrics:
        os.makedirs(os.path.dirname(os.path.abspath(args.metrics)), exist_ok=True)
    metrics = open(args.metrics, "w") if args.metrics else None

    def record(obj):
        if metrics:
            metrics.write(json.dumps(obj) + "\n")
            metrics.flush()

    tokens_per_step = B * T * args.grad_accum
    print(f"[{impl}] {args.model}: {n_params / 1e6:.1f}M parameters, "
          f"{cfg.n_layer} layers, {cfg.n_head} heads, {cfg.n_embd} wide, vocab "
          f"{cfg.vocab_size}; batch {B}x{args.grad_accum} x {T} tokens, "
          f"{args.precision}, {device}, torch {torch.__version__}", flush=True)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    total_steps = args.warmup + args.steps
    times, last, last_step = [], time.perf_counter(), 0
    profiler = None
    # As gpt_amp (Note [timing steps without a sync a step] in
    # examples/common.h): a sync only where a window of steps ends (a logged
    # step, the end of the warm-up, the last step), each step of a window
    # timed as the window's mean.
    sync()
    window_start, window_steps = time.perf_counter(), 0
    for step in range(1, total_steps + 1):
        if args.trace and step == max(args.warmup + 1, total_steps - 2):
            sync()
            window_start, window_steps = time.perf_counter(), 0
            profiler = torch.profiler.profile(activities=[
                torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            profiler.start()
        loss, lr = train_step(step - 1)
        window_steps += 1
        if step == args.warmup or step % args.log_every == 0 or step == total_steps:
            sync()
            now = time.perf_counter()
            if step - window_steps >= args.warmup:
                times += [(now - window_start) * 1e3 / window_steps] * window_steps
            window_start, window_steps = now, 0
        if step % args.log_every == 0 or step == total_steps:
            loss_value = loss.item()
            now = time.perf_counter()
            rate = (step - last_step) / (now - last)
            last, last_step = now, step
            scale = f"  scale {scaler.get_scale():g}" if scaler.is_enabled() else ""
            print(f"[{impl}] step {step}/{total_steps}  {rate:.2f} steps/s  "
                  f"loss {loss_value:.4f}  lr {lr:.3e}{scale}", flush=True)
            record({"kind": "step", "step": step, "loss": loss_value, "lr": lr})
    final_loss = loss.item()
    if profiler is not None:
        profiler.stop()
        profiler.export_chrome_trace(args.trace)

    ms = statistics.median(times)
    tokens_per_s = tokens_per_step / (ms / 1e3)
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    mfu = flops_per_token * tokens_per_s / (args.peak_tflops * 1e12)
    record({"kind": "summary", "impl": impl, "model": args.model,
            "precision": args.precision, "batch_size": B, "seq_len": T,
            "grad_accum": args.grad_accum, "checkpointing": args.checkpointing,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "steps": args.steps, "ms_per_step": ms, "tokens_per_s": tokens_per_s,
            "peak_memory_gib": peak_gib, "mfu": mfu, "final_loss": final_loss})
    if metrics:
        metrics.close()
    peak = f"{peak_gib:.2f} GiB peak" if peak_gib is not None else "peak n/a (cpu)"
    print(f"[{impl}] {args.model} {args.precision} bs{B} seq{T}: {ms:.2f} ms/step "
          f"(median of {args.steps}), {tokens_per_s:,.0f} tokens/s, {peak}, "
          f"MFU {100 * mfu:.1f}% of {args.peak_tflops:g} TFLOP/s, final loss {final_loss:.4f}")


if __name__ == "__main__":
    main()
