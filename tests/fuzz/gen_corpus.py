#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_validation (tests/fuzz/corpus/): one valid call per file for each entry
point and layout, in the byte format fuzz_validation.cpp decodes (a zero byte keeps the valid choice,
so only the leading bytes are written). Run from anywhere: python3 tests/fuzz/gen_corpus.py"""

import hashlib
import pathlib

OPS = {"forward": 0, "backward": 1, "kvcache": 2, "merge": 3}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "f64": 3, "e4m3": 4, "e4m3fnuz": 5, "e5m2": 6}
# Sizes in decode order; each 0..9 (a byte < 0xF0 decodes as byte % 10).
SIZE_NAMES = ["b", "sq", "sk", "hq", "hk", "d", "dv", "page", "blocks", "s_new"]
BASE = dict(b=2, sq=3, sk=5, hq=4, hk=2, d=8, dv=8, page=2, blocks=6, s_new=1)
TENSOR = [0]  # one mutation byte: 0 = the valid view
INDEX = [0, 0]  # mutation byte + "raw values" byte


def header(op, flags, dtype, sizes):
    return bytes([OPS[op], flags, DTYPES[dtype]] + [sizes[n] for n in SIZE_NAMES])


def options(causal=False, window=None, softcap=False, scale=False, dropout=False, deterministic=False):
    """The options byte and its operands (AttentionOptions in fuzz_validation.cpp)."""
    f = causal | (window is not None) << 1 | softcap << 2 | scale << 3 | dropout << 4 | deterministic << 5
    out = [f]
    if window is not None:
        out += [w + 1 for w in window]  # decoded as byte % 12 - 1
    out += [0] * (softcap + scale)  # 0: the valid value (30.0, 0.125)
    if dropout:
        out += [0] + [7, 0, 0, 0] + [1, 0, 0, 0]  # p = 0.25, seed, offset
    return out


def attention(op, dtype, s, varlen=False, paged=False, seqused=False, lse=True, opts=()):
    flags = varlen | paged << 1 | seqused << 2 | lse << 3 | (varlen and paged) << 4
    body = []
    len_k = []
    if varlen:
        len_q = [(i + 1) % (s["sq"] + 1) for i in range(s["b"])]
        len_k = [(i + 2) % (s["sk"] + 1) for i in range(s["b"])]
        body += len_q + len_k + INDEX + INDEX + TENSOR
    else:
        body += TENSOR
    if paged:
        cols = -(-s["sk"] // s["page"])
        body += TENSOR * 2 + [(i * 5 + 1) % s["blocks"] for i in range(s["b"] * cols)] + INDEX
    else:
        body += TENSOR * 2
    if seqused:
        if not len_k:
            body += [s["sk"]] * s["b"]
        body += [1] * s["b"] + INDEX
    body += TENSOR * 2  # out, lse
    if op == "backward":
        body += TENSOR * 4  # dout, dq, dk, dv
    return header(op, flags, dtype, s) + bytes(body + list(options(**dict(opts))))


def kvcache(dtype, s, append=True, paged=False, batch_idx=False, leftpad=False, rotary=False, lse=True):
    flags = append | paged << 1 | (not append) << 2 | lse << 3 | batch_idx << 4 | leftpad << 5 | rotary << 6
    capacity = s["page"] * s["blocks"] if paged else s["sk"]
    body = TENSOR * 4 + (TENSOR * 2 if append else [])
    seqlens = [min(2, capacity - s["s_new"])] * s["b"]
    body += seqlens + INDEX
    if paged:
        body += [(i * 3 + 1) % s["blocks"] for i in range(s["b"] * s["blocks"])] + INDEX
    if batch_idx:
        body += [s["b"] - 1 - i for i in range(s["b"])] + INDEX
    if leftpad:
        body += [1] * s["b"] + INDEX
    if rotary:
        body += TENSOR * 2 + [1]
    if lse:
        body += TENSOR
    body += [2]  # num_splits = 1
    return header("kvcache", flags, dtype, s) + bytes(body + [0])


def merge(dtype, s, in_place=False):
    return header("merge", in_place | 1 << 3, dtype, s)


def seeds():
    out = []
    for dt in DTYPES:
        out.append(attention("forward", dt, BASE))
    for dt in ("f32", "f16", "bf16", "f64"):
        out.append(attention("backward", dt, BASE))
        out.append(merge(dt, BASE))
    for op in ("forward", "backward"):
        out.append(attention(op, "f32", BASE, varlen=True))
        out.append(attention(op, "bf16", BASE, varlen=True, seqused=True))
        out.append(attention(op, "f16", BASE, opts={"causal": True}))
        out.append(attention(op, "f32", BASE, opts={"window": (2, 1), "softcap": True}))
        out.append(attention(op, "f32", BASE, opts={"dropout": True, "scale": True}))
        out.append(attention(op, "f32", dict(BASE, d=9, dv=7), opts={"deterministic": True}))
    out.append(attention("forward", "f32", BASE, paged=True))
    out.append(attention("forward", "bf16", BASE, varlen=True, paged=True))
    out.append(attention("forward", "f16", BASE, paged=True, seqused=True))
    out.append(attention("forward", "f32", dict(BASE, sq=1, sk=9)))
    out.append(attention("forward", "f32", dict(BASE, sq=9, sk=0), lse=True))
    for dt in ("f32", "f16", "bf16"):
        out.append(kvcache(dt, BASE))
    out.append(kvcache("f32", BASE, append=False))
    out.append(kvcache("f32", BASE, paged=True))
    out.append(kvcache("f32", dict(BASE, blocks=3), batch_idx=True))
    out.append(kvcache("f16", BASE, leftpad=True))
    out.append(kvcache("f32", BASE, rotary=True))
    out.append(kvcache("bf16", BASE, paged=True, rotary=True, leftpad=True))
    out.append(merge("f32", BASE, in_place=True))
    return out


def main():
    corpus = pathlib.Path(__file__).resolve().parent / "corpus"
    corpus.mkdir(exist_ok=True)
    for data in seeds():
        (corpus / ("seed-" + hashlib.sha1(data).hexdigest()[:16])).write_bytes(data)


if __name__ == "__main__":
    main()
