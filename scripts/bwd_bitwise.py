"""Whether a knob changes the backward's results: gradients of flashport.flash_attn_func on fixed-seed
inputs (96 cells: d 64 / 96 / 128, causal and not, 2 x 1000, 113 x 203 with GQA 7:1, 4096 with GQA 4:1,
3 x 257 with GQA 2:1, softcap 0 / 30, deterministic or not; bf16, CUDA), saved by one process and compared
with another's. dK and dV must be equal bit for bit, and dQ too where deterministic; elsewhere dQ depends on
the order of atomic adds, so its largest difference is printed (compare it with two runs of one setting).

    FLASHPORT_HOPPER_BWD_ORDER=0 python3 scripts/bwd_bitwise.py save /tmp/g0.pt
    FLASHPORT_HOPPER_BWD_ORDER=1 python3 scripts/bwd_bitwise.py save /tmp/g1.pt
    python3 scripts/bwd_bitwise.py cmp /tmp/g0.pt /tmp/g1.pt    # exit status 1 if a cell differs
"""
import sys

import torch


def cells():
    for d in (64, 96, 128):
        for causal in (False, True):
            for b, sq, sk, hq, hk in ((2, 1000, 1000, 8, 8), (1, 113, 203, 7, 1), (1, 4096, 4096, 16, 4),
                                      (3, 257, 257, 4, 2)):
                for softcap in (0.0, 30.0):
                    for deterministic in (False, True):
                        yield d, causal, b, sq, sk, hq, hk, softcap, deterministic


def save(path):
    import flashport

    grads = {}
    for cell in cells():
        d, causal, b, sq, sk, hq, hk, softcap, deterministic = cell
        gen = torch.Generator(device="cuda").manual_seed(hash(cell) % 2**31)  # numbers only: stable hash
        make = lambda s, h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        q, k, v = (t.requires_grad_() for t in (make(sq, hq), make(sk, hk), make(sk, hk)))
        dout = make(sq, hq)
        out = flashport.flash_attn_func(q, k, v, causal=causal, softcap=softcap, deterministic=deterministic)
        grads[str(cell)] = [g.cpu() for g in torch.autograd.grad(out, (q, k, v), dout)]
    torch.save(grads, path)
    print(f"bwd_bitwise: saved {len(grads)} cells to {path}")


def compare(path_a, path_b):
    a, b = torch.load(path_a), torch.load(path_b)
    differing = 0
    for key in a:
        same = [torch.equal(x, y) for x, y in zip(a[key], b[key])]
        deterministic = key.endswith("True)")
        if not all(same[1:]) or (deterministic and not same[0]):
            differing += 1
            diff = [float((x.float() - y.float()).abs().max()) for x, y in zip(a[key], b[key])]
            print(f"DIFFERS {key}: equal dq/dk/dv {same}, max |difference| {diff}")
    dq = max(float((a[k][0].float() - b[k][0].float()).abs().max()) for k in a)
    print(f"bwd_bitwise: largest dQ difference {dq:.3e} (atomic order where not deterministic)")
    print(f"bwd_bitwise: {len(a) - differing} of {len(a)} cells equal")
    return differing == 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "save":
        save(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "cmp":
        sys.exit(0 if compare(sys.argv[2], sys.argv[3]) else 1)
    else:
        sys.exit(__doc__)
