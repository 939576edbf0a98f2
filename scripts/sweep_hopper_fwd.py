"""Times the Hopper forward at one problem under each launch setting (FLASHPORT_HOPPER_TILE and
FLASHPORT_HOPPER_PERSISTENT, read once per process, so one subprocess per setting), beside SDPA cuDNN:
which tile and schedule a training shape wants.

  python3 scripts/sweep_hopper_fwd.py --shape 8,1024,12,64 [--causal] [--settings "64:128:2/2,64:128:2:0:192/2"]
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, torch, flashport
import torch.nn.functional as F
b, s, h, d, causal, peer = json.loads(sys.argv[1])
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if peer:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    def fn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
else:
    fn = lambda: flashport.flash_attn_func(q, k, v, causal=causal)
for _ in range(10): fn()
times = []
for _ in range(15):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20): fn()
    stop.record(); stop.synchronize()
    times.append(start.elapsed_time(stop) / 20 * 1e3)
times.sort()
print(json.dumps(times[len(times) // 2]))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8,1024,12,64", help="batch,seqlen,heads,head_dim")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--settings", default="rule,64:128:2/2,64:128:2/0,64:128:2:0:192/2,64:128:2:0:192/0,"
                    "64:128:3/2,64:128:2:2/2,64:192:2/0,64:192:2:2/2,64:176:2/2,64:112:2/2",
                    help="comma list of TILE/PERSISTENT ('rule': neither set); TILE is FLASHPORT_HOPPER_TILE's "
                         "d:block_n:stages[:exp_emu[:block_m]]")
    args = ap.parse_args()
    b, s, h, d = map(int, args.shape.split(","))
    flops = 4 * b * h * s * s * d / (2 if args.causal else 1)

    def run(env_extra, peer=False):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHPORT_HOPPER")}
        env.update(env_extra)
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([b, s, h, d, args.causal, peer])], env=env,
                             capture_output=True, text=True)
        if out.returncode:
            return None, out.stderr.strip().splitlines()[-1:]
        return json.loads(out.stdout.strip().splitlines()[-1]), None

    us, err = run({}, peer=True)
    print(f"shape {args.shape} causal={args.causal}: SDPA cuDNN {us:.1f} us ({flops / us / 1e6:.0f} TFLOPS)", flush=True)
    for setting in args.settings.split(","):
        env = {}
        if setting != "rule":
            tile, persistent = setting.split("/")
            env = {"FLASHPORT_HOPPER_TILE": tile, "FLASHPORT_HOPPER_PERSISTENT": persistent}
        us, err = run(env)
        if us is None:
            print(f"  {setting:16s} failed: {err}", flush=True)
        else:
            print(f"  {setting:16s} {us:7.1f} us  {flops / us / 1e6:5.0f} TFLOPS", flush=True)


if __name__ == "__main__":
    main()
