#!/usr/bin/env python3
"""Train a GPT-2-small-class byte-level decoder with flashport or one of PyTorch SDPA's backends.

Every --attn gets the same initial weights (--seed) and the same batches (a seeded sampler), so loss
curves of different attention implementations are directly comparable; only the attention call differs.

Data: the Python standard library's own sources (*.py under sysconfig's stdlib path, site-packages left
out, sorted), read as bytes: a real text corpus present on every machine, no download. Byte vocabulary
(256) padded to 320 for tensor-core friendly shapes; the first 95% is train, the last 5% validation.

  python3 examples/train_gpt.py --attn flashport --log runs/flashport.jsonl           # GPT-2 small, 300 steps
  python3 examples/train_gpt.py --attn sdpa-cudnn --log runs/cudnn.jsonl
  python3 examples/train_gpt.py --plot runs/flashport.jsonl runs/cudnn.jsonl --out docs/train_gpt_loss.png
  python3 examples/train_gpt.py --layers 2 --width 64 --heads 4 --seq 64 --batch 4 --steps 20   # CPU smoke run

The log is JSON lines: one "config" record, one "step" record per step (train loss, lr), one "eval" record
every --eval-every steps (train/val loss, tokens/s so far) and one "final" record.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

VOCAB = 320  # 256 byte values padded to a multiple of 64


# ---------------------------------------------------------------------------------------------
# Data.


def stdlib_corpus() -> bytes:
    """The stdlib's *.py files concatenated in sorted relative-path order. site-/dist-packages live under the
    same root on many installs; they are left out so the corpus depends on the Python version only."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    paths.sort(key=lambda p: os.path.relpath(p, root))
    chunks = []
    for p in paths:
        with open(p, "rb") as f:
            chunks.append(f.read())
    return b"".join(chunks)


class Batches:
    """Random windows of the train split from a seeded generator, so every run sees the same batches in the
    same order; a fixed set of validation windows, so every evaluation scores the same text."""

    def __init__(self, data, seq: int, batch: int, seed: int, eval_batches: int):
        import torch

        n_train = len(data) * 95 // 100
        self.train, self.val = data[:n_train], data[n_train:]
        if len(self.val) <= seq + 1:
            raise SystemExit(f"corpus too small for --seq {seq}")
        self.seq, self.batch = seq, batch
        self.gen = torch.Generator().manual_seed(seed)
        val_gen = torch.Generator().manual_seed(seed + 1)
        self.val_starts = torch.randint(0, len(self.val) - seq - 1, (eval_batches, batch), generator=val_gen)

    def _windows(self, split, starts):
        import torch

        idx = starts[:, None] + torch.arange(self.seq + 1)
        xy = split[idx].long()
        return xy[:, :-1], xy[:, 1:]

    def next_train(self):
        import torch

        starts = torch.randint(0, len(self.train) - self.seq - 1, (self.batch,), generator=self.gen)
        return self._windows(self.train, starts)

    def val_batches(self):
        for starts in self.val_starts:
            yield self._windows(self.val, starts)


# ---------------------------------------------------------------------------------------------
# Model.


def attention_fn(name: str, dropout: float = 0.0):
    """(qkv, training) with qkv in (batch, seqlen, 3, heads, head_dim) -> causal attention output in
    (batch, seqlen, heads, head_dim), with attention dropout `dropout` while training (each backend draws
    its own mask). flashport takes the packed tensor as flash-attn's GPT models do
    (flash_attn_qkvpacked_func: one packed gradient); flashport-unpacked passes its three slices to
    flash_attn_func, as SDPA gets them (flash_attn_func finds that they tile qkv and writes one gradient
    too; a model's views that do not tile one tensor get theirs stacked by autograd)."""
    import torch.nn.functional as F

    p = lambda training: dropout if training else 0.0
    if name == "flashport":
        import flashport

        return lambda qkv, training: flashport.flash_attn_qkvpacked_func(qkv, dropout_p=p(training), causal=True)
    if name == "flashport-unpacked":
        import flashport

        return lambda qkv, training: flashport.flash_attn_func(*qkv.unbind(2), dropout_p=p(training), causal=True)
    # SDPA wants (b, h, s, d); the backend itself is chosen by sdpa_context around the step, which also
    # holds under torch.compile (the compiled graph is traced inside that context).
    return lambda qkv, training: F.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in qkv.unbind(2)), dropout_p=p(training), is_causal=True).transpose(1, 2)


def sdpa_context(name: str):
    if not name.startswith("sdpa-"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa-math": SDPBackend.MATH}[name]
    return sdpa_kernel([backend])  # one backend only: SDPA raises rather than silently falling back


def build_model(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    attend = attention_fn(args.attn, args.attn_dropout)
    width, heads = args.width, args.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, s, _ = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, s, 3, heads, width // heads)
            x = x + self.proj(attend(qkv, self.training).reshape(b, s, width))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, width), nn.Embedding(args.seq, width)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(width)
            self.head = nn.Linear(width, VOCAB, bias=False)
            self.head.weight = self.wte.weight  # weight tying
            self.apply(self._init)
            # GPT-2: residual projections scaled by 1/sqrt(2 * layers) so the residual stream's variance
            # does not grow with depth.
            for blk in self.blocks:
                for lin in (blk.proj, blk.out):
                    nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * args.layers))

        @staticmethod
        def _init(m):
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))

    if width % heads:
        raise SystemExit(f"--width {width} is not a multiple of --heads {heads}")
    return GPT()


def make_optimizer(model, args, cuda: bool):
    import torch

    # No weight decay on biases, LayerNorm gains and the position table (1-D params or embeddings' rows
    # other than the tied token table), the usual GPT recipe.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n != "wpe.weight"]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n != "wpe.weight")]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)


def lr_at(step: int, args) -> float:
    """Linear warm-up over the first 10% of steps (at most 100), then cosine down to 10% of --lr."""
    warm = max(1, min(100, args.steps // 10))
    if step < warm:
        return args.lr * (step + 1) / warm
    frac = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ---------------------------------------------------------------------------------------------
# Training.


class Trainer:
    """One attention backend's run: model, optimizer, batches, log. step() trains one step without
    synchronising; evaluate() scores the validation windows and logs the steps since the last one."""

    def __init__(self, args, attn: str, log_path, corpus):
        import torch

        self.args, self.attn = args, attn
        self.device = device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.cuda = cuda = device.type == "cuda"
        self.dtype = dtype = args.dtype or ("bf16" if cuda else "fp32")
        if attn in ("sdpa-flash", "sdpa-cudnn") and not cuda:
            raise SystemExit(f"--attn {attn} needs a CUDA device (use sdpa-math or flashport on the CPU)")
        data, digest = corpus
        self.batches = Batches(data, args.seq, args.batch, args.seed, args.eval_batches)
        torch.manual_seed(args.seed)  # the weights depend on the seed alone, never on --attn
        self.model = build_model(argparse.Namespace(**{**vars(args), "attn": attn})).to(device)
        self.opt = make_optimizer(self.model, args, cuda)
        self.step_fn = torch.compile(self.model) if args.compile else self.model
        self.autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bf16"
                         else contextlib.nullcontext())
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.log = open(log_path, "w") if log_path else None
        config = {k: v for k, v in vars(args).items() if k not in ("plot", "out")}
        config.update(attn=attn, device=str(device), dtype=dtype, params=self.n_params, corpus_bytes=len(data),
                      corpus_sha256=digest, python=sys.version.split()[0], torch=torch.__version__,
                      gpu=torch.cuda.get_device_name(device) if cuda else None)
        self.emit(dict(kind="config", **config))
        self.header = (f"{attn}: {self.n_params / 1e6:.1f}M params, {args.layers}x{args.width} ({args.heads} "
                       f"heads), batch {args.batch} x {args.seq}, {dtype} on {device}; corpus "
                       f"{len(data) / 1e6:.1f} MB ({digest})")
        self.pending = []  # per-step losses stay on the device until the next evaluation: no sync per step
        self.timed_s, self.timed_tokens, self.last = 0.0, 0, {}
        self.segments = []  # tokens/s of each timed segment (side-by-side mode)

    def sync(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def emit(self, rec):
        if self.log:
            self.log.write(json.dumps(rec) + "\n")
            self.log.flush()

    def step(self, step: int):
        import torch

        lr = lr_at(step, self.args)
        for g in self.opt.param_groups:
            g["lr"] = lr
        x, y = self.batches.next_train()
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with self.autocast, sdpa_context(self.attn):
            loss = self.step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.pending.append((step, loss.detach(), lr))

    def evaluate(self, step: int) -> str:
        """Logs the pending steps and an eval record; returns the progress line."""
        import torch

        losses = [(s, l.item(), lr) for s, l, lr in self.pending]
        for s, l, lr in losses:
            self.emit(dict(kind="step", step=s, loss=l, lr=lr))
        self.pending = []
        self.model.eval()
        total = torch.zeros((), device=self.device)
        with torch.no_grad(), self.autocast, sdpa_context(self.attn):
            for x, y in self.batches.val_batches():
                total += self.step_fn(x.to(self.device), y.to(self.device))
        self.model.train()
        val = total.item() / self.args.eval_batches
        train_loss = sum(l for _, l, _ in losses) / len(losses) if losses else None
        tps = self.timed_tokens / self.timed_s if self.timed_s > 0 else None
        self.last = dict(kind="eval", step=step, train_loss=train_loss, val_loss=val, tokens_per_s=tps)
        self.emit(self.last)
        tl = f"{train_loss:.4f}" if train_loss is not None else "-"
        return f"step {step:5d}  train {tl}  val {val:.4f}  " + (f"{tps:,.0f} tok/s" if tps else "")

    def timed(self, steps, timed: bool):
        """Trains `steps` (a range); when `timed`, their wall time between two synchronisations counts."""
        if timed:
            self.sync()
            t0 = time.perf_counter()
        for step in steps:
            self.step(step)
        if timed:
            self.sync()
            dt = time.perf_counter() - t0
            tokens = len(steps) * self.args.batch * self.args.seq
            self.timed_s += dt
            self.timed_tokens += tokens
            self.segments.append(tokens / dt)

    def final(self) -> dict:
        import statistics

        import torch

        rec = dict(kind="final", attn=self.attn, steps=self.args.steps, train_loss=self.last["train_loss"],
                   val_loss=self.last["val_loss"], tokens_per_s=self.last["tokens_per_s"],
                   timed_steps=self.timed_tokens // (self.args.batch * self.args.seq),
                   median_segment_tokens_per_s=statistics.median(self.segments) if self.segments else None,
                   # the process's peak: with several --attn, every model's memory together
                   peak_mem_gib=torch.cuda.max_memory_allocated(self.device) / 2**30 if self.cuda else None)
        self.emit(rec)
        if self.log:
            self.log.close()
        return rec


def log_path(args, attn: str, several: bool):
    """--log as given for one backend; with several, '{attn}' in it is replaced, or _<attn> is added."""
    if not args.log:
        return None
    if "{attn}" in args.log:
        return args.log.replace("{attn}", attn)
    if not several:
        return args.log
    root, ext = os.path.splitext(args.log)
    return f"{root}_{attn}{ext or '.jsonl'}"


def segments(args):
    """The training steps cut at evaluations and (after warm-up) into --segment-steps pieces:
    (first step, end, timed)."""
    warmup = min(args.warmup_steps, max(0, args.steps - 1))  # at least one timed step
    cuts = sorted({0, args.steps, warmup, *range(0, args.steps, args.eval_every),
                   *range(warmup, args.steps, args.segment_steps)})
    return [(a, b, a >= warmup) for a, b in zip(cuts, cuts[1:])]


def train(args) -> list:
    """Trains every backend of --attn. Several train side by side in one process: each trains the same
    steps in turn, segment by segment (every backend sees the same batches), so a slow phase of the host
    or GPU hits them all alike and their tokens/s compare within one run."""
    import torch

    several = len(args.attn) > 1
    data_bytes = stdlib_corpus()  # read once: every backend trains on the same tensor
    corpus = (torch.frombuffer(bytearray(data_bytes), dtype=torch.uint8), hashlib.sha256(data_bytes).hexdigest()[:16])
    trainers = [Trainer(args, attn, log_path(args, attn, several), corpus) for attn in args.attn]
    bar = None
    if args.steps >= 50 and not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=args.steps, unit="step", dynamic_ncols=True)
        except ImportError:
            pass
    say = bar.write if bar else print
    for t in trainers:
        say(t.header)
    if trainers[0].cuda:
        torch.cuda.reset_peak_memory_stats(trainers[0].device)
    for a, b, timed in segments(args):
        if a % args.eval_every == 0:
            for t in trainers:
                say(("  " + t.attn + ": " if several else "") + t.evaluate(a))
        for t in trainers:
            t.timed(range(a, b), timed)
        if bar:
            bar.update(b - a)
    for t in trainers:
        say(("  " + t.attn + ": " if several else "") + t.evaluate(args.steps))
    if bar:
        bar.close()
    return [t.final() for t in trainers]


# ---------------------------------------------------------------------------------------------
# Plot mode.


def read_log(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    by = {}
    for r in recs:
        by.setdefault(r["kind"], []).append(r)
    return by


def plot(paths, out) -> int:
    runs = [(p, read_log(p)) for p in paths]
    print("| run | attn | steps | train loss | val loss | tokens/s | peak GiB |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda x, spec: format(x, spec) if x is not None else "-"
    for p, r in runs:
        cfg, fin = r["config"][0], (r.get("final") or r["eval"])[-1]
        print(f"| {os.path.basename(p)} | {cfg['attn']} | {fin['step'] if 'step' in fin else fin['steps']} | "
              f"{fmt(fin['train_loss'], '.4f')} | {fmt(fin['val_loss'], '.4f')} | {fmt(fin['tokens_per_s'], ',.0f')} | "
              f"{fmt(fin.get('peak_mem_gib'), '.1f')} |")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: table only, no plot")
        return 0
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p, r in runs:
        ev = r.get("eval", [])
        ax.plot([e["step"] for e in ev], [e["val_loss"] for e in ev], marker="o", markersize=3,
                label=r["config"][0]["attn"])
    cfg = runs[0][1]["config"][0]
    ax.set_title(f"{cfg['layers']}x{cfg['width']}, batch {cfg['batch']} x {cfg['seq']}, {cfg['dtype']}, "
                 f"{cfg.get('gpu') or cfg['device']}", fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats / byte)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    print(os.path.abspath(out))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attn", nargs="+", default=["flashport"],
                    choices=["flashport", "flashport-unpacked", "sdpa-flash", "sdpa-cudnn", "sdpa-math"],
                    help="one backend, or several trained side by side in one process (segments in turn)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--attn-dropout", type=float, default=0.0,
                    help="attention dropout while training (flashport: SPEC's Philox mask; SDPA: its own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--warmup-steps", type=int, default=10, help="first steps left out of tokens/s")
    ap.add_argument("--segment-steps", type=int, default=10,
                    help="timed steps per segment: with several --attn, each trains a segment in turn")
    ap.add_argument("--device", help="default: cuda when available, else cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], help="default: bf16 autocast on CUDA, fp32 on the CPU")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--log", help="JSON lines log path")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--plot", nargs="+", metavar="JSONL", help="plot mode: validation loss vs step of these logs")
    ap.add_argument("--out", default="docs/train_gpt_loss.png", help="plot mode: PNG path")
    args = ap.parse_args(argv)
    if args.plot:
        return plot(args.plot, args.out)
    for name in ("segment_steps", "eval_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.log:
        os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    finals = train(args)
    best_sdpa = max((f["tokens_per_s"] or 0 for f in finals if f["attn"].startswith("sdpa-")), default=0)
    for f in finals:
        tps, med = f["tokens_per_s"], f["median_segment_tokens_per_s"]
        vs = f"  {tps / best_sdpa:.3f}x the best SDPA" if tps and best_sdpa and len(finals) > 1 else ""
        print(f"final{' ' + f['attn'] if len(finals) > 1 else ''}: train {f['train_loss']:.4f}  val "
              f"{f['val_loss']:.4f}  " + (f"{tps:,.0f} tokens/s over {f['timed_steps']} steps (median segment "
                                          f"{med:,.0f}){vs}" if tps else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
