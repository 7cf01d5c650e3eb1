"""Context parallelism on several GPUs: one Wan DiT forward split by diffusers (Ulysses, ring),
our kernel against SDPA's cuDNN backend under the same split, against one GPU.

Launched by torchrun, one process a GPU (NCCL):

    torchrun --nproc-per-node 2 bench/context_parallel.py --json OUT.json

Builds diffusers' WanTransformer3DModel at the Wan2.1-T2V-14B shape (40 heads x 128, 40 layers;
random weights in bf16, nothing downloaded) once per rank, and times one DiT forward at 720p
(1280x720, 81 frames: 75600 tokens) for every (split, attention) pair, the attentions taking turns
within a split:
  - split "one GPU": rank 0 alone runs the unsplit model (the other ranks wait);
  - "ulysses N" and "ring N" (N = the world size), and, on 4 GPUs, "ulysses 2 x ring 2": a copy of
    the model with `enable_parallelism(ContextParallelConfig(...))`;
  - attention "ours" (flash_kernel.diffusers_backend.flash_attention_backend, every call counted:
    all must be served) and "sdpa-cudnn" (diffusers' own _native_cudnn backend, the vendor A/B).
Reported per pair: median forward time over --repeats (synchronised perf_counter, every rank
barriered before each forward), speedup over the same attention on one GPU, scaling efficiency
(speedup / GPUs), ours over cuDNN under the same split, and, from one profiled forward, the share
of the forward's GPU time spent in NCCL kernels (the all-to-all / K/V all-gather; overlap with
compute not subtracted). --layers fewer than 40 makes a quicker, smaller run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audit.evidence.pipeline.options import WAN_14B  # noqa: E402
LATENTS_720P = (1, 16, 21, 90, 160)  # 81 frames at 1280x720 through Wan's VAE (4x time, 8x space)


def splits(world: int) -> list[tuple[int, int]]:
    """(ulysses, ring) degrees timed at this world size (besides one GPU)."""
    out = [(world, 1), (1, world)]
    if world == 4:
        out.append((2, 2))
    return out


def name_of(u: int, r: int) -> str:
    return " x ".join(f"{n} {k}" for n, k in (("ulysses", u), ("ring", r)) if k > 1) or "one GPU"


def forward(model, latents, text):
    with torch.no_grad():
        return model(hidden_states=latents, timestep=torch.tensor([700], device=latents.device),
                     encoder_hidden_states=text, return_dict=False)[0]


def attention_context(attention: str):
    """The diffusers attention backend of `attention`, and the counts ours keeps (None for cuDNN)."""
    from diffusers.models.attention_dispatch import attention_backend

    if attention == "ours":
        from flash_kernel.diffusers_backend import flash_attention_backend

        return flash_attention_backend()
    return attention_backend("_native_cudnn")


def timed(model, latents, text, attention: str, repeats: int, active: bool) -> dict:
    """One warm-up and `repeats` timed forwards (every rank barriered before each; ranks not
    `active` only take part in the barriers), then one profiled forward for the NCCL share."""
    times, counts, nccl = [], None, None
    with attention_context(attention) as c:
        for i in range(repeats + 1):
            dist.barrier()
            if not active:
                continue
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward(model, latents, text)
            torch.cuda.synchronize()
            if i > 0:
                times.append(time.perf_counter() - t0)
        dist.barrier()
        if active:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                forward(model, latents, text)
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
            total = sum(e.self_device_time_total for e in events)
            comm = sum(e.self_device_time_total for e in events if "nccl" in e.key.lower())
            nccl = comm / total if total else None
        if c is not None:
            counts = c.to_dict()
    return {"attention": attention, "times_s": times, "median_s": statistics.median(times) if times else None,
            "nccl_share_of_gpu_time": nccl, "counts": counts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=WAN_14B["num_layers"], help="transformer blocks (40: Wan2.1-14B)")
    ap.add_argument("--repeats", type=int, default=2, help="timed forwards per (split, attention)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        print("error: launch with torchrun, one process a GPU (torchrun --nproc-per-node 2 "
              "bench/context_parallel.py)", file=sys.stderr)
        return 2
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    from diffusers import ContextParallelConfig
    from diffusers.models.transformers.transformer_wan import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        base = WanTransformer3DModel(**dict(WAN_14B, num_layers=args.layers)).to(torch.bfloat16).eval()
    gen = torch.Generator(device="cuda").manual_seed(1)
    latents = torch.randn(LATENTS_720P, generator=gen, device="cuda", dtype=torch.bfloat16)
    text = torch.randn(1, 512, 4096, generator=gen, device="cuda", dtype=torch.bfloat16)
    tokens = LATENTS_720P[2] * (LATENTS_720P[3] // 2) * (LATENTS_720P[4] // 2)
    rows = []
    for attention in ("sdpa-cudnn", "ours"):  # one GPU: rank 0 alone
        rows.append({"split": "one GPU", "gpus": 1, **timed(base, latents, text, attention, args.repeats, rank == 0)})
    for j, (u, r) in enumerate(splits(world)):
        model = copy.deepcopy(base)
        # Wan's plan without its "" entry (a Wan 2.2 per-token timestep; Wan 2.1's (B,) timestep makes
        # diffusers 0.42.1 call a logger.warning_once its logger lacks)
        plan = {k: v for k, v in model._cp_plan.items() if k != ""}
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=u, ring_degree=r), cp_plan=plan)
        for attention in ("ours", "sdpa-cudnn") if j % 2 == 0 else ("sdpa-cudnn", "ours"):  # orders alternate
            rows.append({"split": name_of(u, r), "gpus": world, **timed(model, latents, text, attention, args.repeats,
                                                                        True)})
        del model
        torch.cuda.empty_cache()
    if rank == 0:
        one = {row["attention"]: row["median_s"] for row in rows if row["split"] == "one GPU"}
        for row in rows:
            base_s = one.get(row["attention"])
            if row["median_s"] and base_s:
                row["speedup_over_one_gpu"] = base_s / row["median_s"]
                row["scaling_efficiency"] = row["speedup_over_one_gpu"] / row["gpus"]
            peer = [x for x in rows if x["split"] == row["split"] and x["attention"] == "sdpa-cudnn"]
            if row["attention"] == "ours" and peer and peer[0]["median_s"] and row["median_s"]:
                row["ours_over_cudnn"] = peer[0]["median_s"] / row["median_s"]
        result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": torch.cuda.get_device_name(0),
                  "gpus": world, "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                  "shape": {"model": "Wan2.1-T2V-14B", "layers": args.layers, "latents": list(LATENTS_720P),
                            "tokens": tokens, "text_tokens": 512}, "rows": rows}
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        print(f"# {result['device']} x {world}, Wan2.1-14B {args.layers} layers, 720p ({tokens} tokens), "
              f"one DiT forward, median of {args.repeats}")
        print(f"{'split':<22}{'attention':<12}{'s':>9}{'x 1 GPU':>9}{'eff.':>7}{'x cuDNN':>9}{'NCCL share':>12}  served")
        for row in rows:
            c = row["counts"]
            served = f"{c['served']} served, {sum(c['passed_on'].values())} passed on" if c else "-"
            print(f"{row['split']:<22}{row['attention']:<12}{row['median_s'] or float('nan'):9.3f}"
                  f"{row.get('speedup_over_one_gpu', float('nan')):9.2f}{row.get('scaling_efficiency', float('nan')):7.2f}"
                  f"{row.get('ours_over_cudnn', float('nan')):9.2f}{row['nccl_share_of_gpu_time'] or 0:12.3f}  {served}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
