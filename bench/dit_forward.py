"""One diffusers DiT forward, end to end, with each attention in turn: where an attention speed-up
shows up in a whole model, and whether it is what the attention's share predicts (Amdahl).

    python3 bench/dit_forward.py --model wan-1.3b --size 720p [--attention sdpa-cudnn,ours,ours-fp8]
        [--layers N] [--repeats 3] [--fp8-min-keys N] [--json OUT.json]
    python3 bench/dit_forward.py --model tiny --size tiny --device cpu     # a dry run on a CPU
                                       # (ours through the CPU library, fp8 through its reference)

Builds diffusers' WanTransformer3DModel at the model's shape (random weights in bf16, nothing
downloaded) and times one forward (one denoising step's DiT pass, one CFG branch) per repeat, the
attentions taking turns forward by forward after one warm-up forward each. Attentions: "sdpa-cudnn"
(diffusers' own _native_cudnn backend, the vendor reference), "ours" and "ours-fp8"
(flash_kernel.diffusers_backend.flash_attention_backend at precision exact and fp8: every call
counted, all must be served; --fp8-min-keys N keeps ours-fp8's calls with fewer keys exact, e.g.
the 512-key text cross-attention). Reported per attention: median forward time, its speed over
sdpa-cudnn, the output's relative L2 from sdpa-cudnn's, and, from one profiled forward, the share
of the forward's GPU time spent in attention kernels; for ours, the speed-up Amdahl's law predicts
from that share and the attention kernels' own speed-up, beside the one measured.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from audit.evidence.pipeline.model import cast_like_from_pretrained  # noqa: E402
from audit.evidence.pipeline.options import TEXT_SHAPE, WAN_1_3B, WAN_14B  # noqa: E402

# The pipeline's Wan2.1-T2V transformer configs.
MODELS = {
    "wan-1.3b": dict(WAN_1_3B),
    "wan-14b": dict(WAN_14B),
    # a few thousand parameters: checks the script, not a measurement
    "tiny": dict(WAN_1_3B, num_attention_heads=2, attention_head_dim=32, in_channels=4, out_channels=4,
                 text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2),
}
# latents (frames, height, width) after Wan's VAE (81 frames -> 21, 8x space); tokens = f * h/2 * w/2
SIZES = {"480p": (21, 60, 104), "720p": (21, 90, 160), "tiny": (2, 8, 8)}
TEXT_TOKENS = TEXT_SHAPE[1]  # umT5's tokens for one prompt
ATTENTIONS = ("sdpa-cudnn", "ours", "ours-fp8")
# GPU kernels that are attention: ours (fk::), cuDNN's fused attention, PyTorch's flash/efficient
ATTENTION_KERNEL = re.compile(r"fk::|sdpa|fmha|flash|attention", re.IGNORECASE)


def attention_context(attention: str, fp8_min_keys: int = 0):
    """The diffusers attention backend of `attention` (a context manager)."""
    if attention == "sdpa-cudnn":
        from diffusers.models.attention_dispatch import attention_backend

        return attention_backend("_native_cudnn")
    from flash_kernel.diffusers_backend import flash_attention_backend

    if attention == "ours-fp8":
        return flash_attention_backend(precision="fp8", fp8_min_keys=fp8_min_keys)
    return flash_attention_backend()


def forward(model, latents, text):
    with torch.no_grad():
        return model(hidden_states=latents, timestep=torch.tensor([700], device=latents.device),
                     encoder_hidden_states=text, return_dict=False)[0]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def attention_share(model, latents, text, attention: str, fp8_min_keys: int) -> tuple[float | None, float | None]:
    """(attention kernels' GPU time, the forward's GPU time), seconds, from one profiled forward."""
    if latents.device.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity, profile

    with attention_context(attention, fp8_min_keys):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            forward(model, latents, text)
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    attn = sum(e.self_device_time_total for e in events if ATTENTION_KERNEL.search(e.key))
    return attn / 1e6, total / 1e6


def rel_l2(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def parse_attentions(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in ATTENTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"attentions are a comma list of {', '.join(ATTENTIONS)}; not {text!r}")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="wan-1.3b")
    ap.add_argument("--size", choices=sorted(SIZES), default="720p")
    ap.add_argument("--attention", type=parse_attentions,
                    help=f"comma list of {', '.join(ATTENTIONS)} (default: all; on a CPU, no sdpa-cudnn)")
    ap.add_argument("--layers", type=int, help="transformer blocks (default: the model's)")
    ap.add_argument("--repeats", type=int, default=3, help="timed forwards per attention")
    ap.add_argument("--fp8-min-keys", type=int, default=0, help="ours-fp8: calls with fewer keys run exact")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.repeats < 1 or (args.layers is not None and args.layers < 1) or args.fp8_min_keys < 0:
        ap.error("--repeats and --layers must be at least 1, --fp8-min-keys at least 0")
    if args.attention is None:
        args.attention = [a for a in ATTENTIONS if args.device == "cuda" or a != "sdpa-cudnn"]
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (--device cpu runs the tiny model as a dry run)", file=sys.stderr)
        return 2
    try:
        from diffusers.models.transformers.transformer_wan import WanTransformer3DModel
    except ImportError as exc:
        print(f"error: diffusers is needed ({exc})", file=sys.stderr)
        return 2

    cfg = dict(MODELS[args.model], patch_size=tuple(MODELS[args.model]["patch_size"]))
    if args.layers:
        cfg["num_layers"] = args.layers
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(args.device):
        model = WanTransformer3DModel(**cfg).eval()
        cast_like_from_pretrained(model, dtype)  # as from_pretrained(torch_dtype=...): its float32 modules kept
        f, h, w = SIZES[args.size]
        latents = torch.randn(1, cfg["in_channels"], f, h, w, dtype=dtype)
        text = torch.randn(1, TEXT_TOKENS, cfg["text_dim"], dtype=dtype)
    tokens = f * (h // 2) * (w // 2)
    print(f"model {args.model} ({cfg['num_layers']} layers, {cfg['num_attention_heads']} heads x "
          f"{cfg['attention_head_dim']}), {args.size}: {tokens} tokens, device {args.device}, {dtype}")

    outputs, counts = {}, {}
    for attention in args.attention:  # a warm-up forward each (FP8 workspace, cuDNN plans)
        with attention_context(attention, args.fp8_min_keys) as c:
            outputs[attention] = forward(model, latents, text).float().cpu()
        sync(args.device)
        if c is not None:
            counts[attention] = c.to_dict()
    times = {a: [] for a in args.attention}
    for i in range(args.repeats):
        order = args.attention if i % 2 == 0 else list(reversed(args.attention))
        for attention in order:
            with attention_context(attention, args.fp8_min_keys):
                sync(args.device)
                t0 = time.perf_counter()
                forward(model, latents, text)
                sync(args.device)
                times[attention].append(time.perf_counter() - t0)

    ref = "sdpa-cudnn" if "sdpa-cudnn" in args.attention else args.attention[0]
    rows = []
    for attention in args.attention:
        attn_s, total_s = attention_share(model, latents, text, attention, args.fp8_min_keys)
        rows.append({"attention": attention, "times_s": times[attention], "median_s": statistics.median(times[attention]),
                     "rel_l2_vs_" + ref: rel_l2(outputs[attention], outputs[ref]),
                     "attention_gpu_s": attn_s, "forward_gpu_s": total_s, "counts": counts.get(attention)})
    base = next(r for r in rows if r["attention"] == ref)
    print(f"{'attention':12s}{'median s':>10s}{'x ' + ref:>16s}{'attn s':>9s}{'share':>7s}{'attn x':>8s}"
          f"{'Amdahl x':>10s}  rel-L2 vs {ref}")
    for r in rows:
        r["speedup"] = base["median_s"] / r["median_s"]
        a_x = amdahl = None
        if r["attention_gpu_s"] and base["attention_gpu_s"] and base["forward_gpu_s"]:
            # the reference's forward with its attention kernels swapped for these: the rest as it was
            a_x = base["attention_gpu_s"] / r["attention_gpu_s"]
            share = base["attention_gpu_s"] / base["forward_gpu_s"]
            amdahl = 1.0 / ((1.0 - share) + share / a_x)
        r["attention_speedup"], r["amdahl_speedup"] = a_x, amdahl
        share_r = r["attention_gpu_s"] / r["forward_gpu_s"] if r["forward_gpu_s"] else None
        fmt = lambda x, spec: format(x, spec) if x is not None else format("-", ">" + spec.split(".")[0])
        print(f"{r['attention']:12s}{r['median_s']:10.3f}{r['speedup']:16.3f}{fmt(r['attention_gpu_s'], '9.3f')}"
              f"{fmt(share_r, '7.2f')}{fmt(a_x, '8.3f')}{fmt(amdahl, '10.3f')}  {r['rel_l2_vs_' + ref]:.2e}")
    if args.json:
        env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
        args.json.write_text(json.dumps({"model": args.model, "size": args.size, "tokens": tokens,
                                         "fp8_min_keys": args.fp8_min_keys,
                                         "layers": cfg["num_layers"], "env": env, "rows": rows}, indent=1))
    unserved = [a for a, c in counts.items() if c.get("passed_on") or not c.get("served")]
    if unserved:
        print(f"error: calls not served by our kernel: {', '.join(unserved)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
