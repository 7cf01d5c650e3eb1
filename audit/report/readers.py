"""Readers: one named accessor per figure the report takes from the evidence dicts.

Evidence may come from elsewhere (`sovereign-audit report DIR`), so every reader tolerates a
missing key or a wrong type and answers None or an empty list rather than raising.
"""

from __future__ import annotations

from typing import Any

from audit.evidence import consistency as K
from audit.evidence.stats import bootstrap_ratio_ci, bootstrap_total_ratio_ci
from audit.report.layout import build_targets
from audit.report.wording import num, plain


def dig(d: Any, *path, default=None):
    """d[path0][path1]... tolerating missing keys, wrong types and list indices."""
    cur = d
    for p in path:
        if isinstance(cur, dict):
            cur = cur.get(p)
        elif isinstance(cur, list) and isinstance(p, int) and -len(cur) <= p < len(cur):
            cur = cur[p]
        else:
            return default
        if cur is None:
            return default
    return cur


def shape_label(s: dict) -> str:
    return str(dig(s, "shape", "label") or dig(s, "label") or "?")


CPU_ONLY = "CPU only (no GPU)"


def run_device(ev: dict) -> str | None:
    """The device the kernel ran on ("cpu", "cuda"), from the run record or a stage's evidence."""
    for d in (dig(ev, "run", "device"), dig(ev, "bench", "device"), dig(ev, "parity", "device"),
              dig(ev, "pipeline", "config", "device")):
        if isinstance(d, str) and d:
            return d
    return None


def gpu_name(ev: dict) -> str | None:
    for src in ("bench", "parity", "pipeline"):
        n = dig(ev, src, "device_name")
        if n:
            return plain(n)
    gpus = dig(ev, "environment", "gpus")
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return plain(gpus[0]["name"])
    return None


def accelerator(ev: dict) -> str:
    """What ran the kernel, as the title names it: the GPU, or "CPU only (no GPU)" (never a CPU
    model, which a reader could take for a GPU of the same maker)."""
    device = run_device(ev)
    if device is None:
        return "no kernel run recorded"
    if device == "cpu":
        return CPU_ONLY
    return gpu_name(ev) or "an unidentified GPU"


def device_name(ev: dict) -> str:
    """The device in sentences: the GPU's name, or the CPU with its model and "no GPU"."""
    if run_device(ev) not in (None, "cpu"):
        return gpu_name(ev) or "an unidentified GPU"
    cpu = dig(ev, "environment", "cpu", "model") or dig(ev, "run", "host", "processor")
    return f"the CPU ({plain(cpu, 'model not recorded')}; no GPU)"


def bench_shapes(ev: dict) -> list[dict]:
    return [s for s in dig(ev, "bench", "shapes", default=[]) if isinstance(s, dict)]


def primary_name(ev: dict) -> str:
    return str(dig(ev, "bench", "primary") or "flash")


def speedups(ev: dict, baseline: str) -> list[tuple[dict, dict]]:
    out = []
    for s in bench_shapes(ev):
        for sp in dig(s, "speedups", default=[]):
            if isinstance(sp, dict) and sp.get("baseline") == baseline and num(sp.get("ratio")):
                out.append((s, sp))
    return out


def headline_op(ev: dict) -> tuple[dict, dict] | None:
    """Flash vs our naive pre-flash path on the largest timed shape (by FLOPs)."""
    rows = speedups(ev, "naive")
    if not rows:
        return None
    return max(rows, key=lambda r: num(dig(r[0], "shape", "flops")) or 0)


VENDOR_BASELINES = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")


def vendor_beside(ev: dict, shape: dict) -> dict | None:
    """The comparison with the strongest vendor backend that ran on `shape` (the smallest ratio
    of ours to it): what a headline against our own naive path is shown beside."""
    label = shape_label(shape)
    rows = [sp for base in VENDOR_BASELINES for s, sp in speedups(ev, base) if shape_label(s) == label]
    return min(rows, key=lambda sp: num(sp.get("ratio"))) if rows else None


def pipeline_comparison(ev: dict, attention: str = "flash") -> dict | None:
    for c in dig(ev, "pipeline", "comparisons", default=[]):
        if isinstance(c, dict) and c.get("attention") == attention:
            return c
    return None


def pipeline_run(ev: dict, attention: str) -> dict:
    for r in dig(ev, "pipeline", "runs", default=[]):
        if isinstance(r, dict) and r.get("attention") == attention:
            return r
    return {}


def _samples(x) -> list[float]:
    return [float(v) for v in x if num(v) is not None and v > 0] if isinstance(x, list) else []


def _interval(value, ci: Any, recompute) -> K.Interval:
    """The recorded interval of a ratio, or one bootstrapped from the raw samples when the
    evidence predates it; nan ends when neither exists."""
    nan = float("nan")
    v = num(value)
    if v is None:
        return K.Interval(nan, nan, nan)
    lo, hi = num(dig(ci, "ci_low")), num(dig(ci, "ci_high"))
    if lo is None or hi is None:
        try:
            got = recompute()
        except ValueError:  # no samples
            got = None
        lo, hi = (got.low, got.high) if got is not None else (nan, nan)
    return K.Interval(v, lo, hi)


def pipeline_speedup(ev: dict, attention: str = "flash") -> dict | None:
    """The end-to-end figures of `attention` against the pipeline's reference run, and whether
    each agrees with its Amdahl prediction (audit.evidence.consistency), when the evidence has them.

    The check is made here from the recorded figures and samples, for evidence of any age.
    "headline" names the figure the title and abstract may state: DiT loop + VAE decode when it
    is consistent, else the DiT loop when that is; None when neither may be claimed.
    """
    c = pipeline_comparison(ev, attention)
    if c is None:
        return None
    ref, run = pipeline_run(ev, str(c.get("reference"))), pipeline_run(ev, attention)
    ref_steps, run_steps = _samples(ref.get("step_s")), _samples(run.get("step_s"))

    def vae(r):
        return _samples(r.get("vae_decode_samples_s")) or _samples([r.get("vae_decode_s")])

    dit = _interval(c.get("speedup_dit_measured"), c.get("speedup_dit_ci"),
                    lambda: bootstrap_total_ratio_ci([(ref_steps, "sum")], [(run_steps, "sum")]))
    full = _interval(c.get("speedup_dit_vae_measured"), c.get("speedup_dit_vae_ci"),
                     lambda: bootstrap_total_ratio_ci([(ref_steps, "sum"), (vae(ref), "median")],
                                                      [(run_steps, "sum"), (vae(run), "median")], seed=1))
    ref_calls = _samples(dig(ref, "instrumented_step", "attention_ms_samples", default=[]))
    run_calls = _samples(dig(run, "instrumented_step", "attention_ms_samples", default=[]))
    ref_kinds = dig(ref, "instrumented_step", "attention_ms_by_kind", default={}) or {}
    run_kinds = dig(run, "instrumented_step", "attention_ms_by_kind", default={}) or {}

    def op_ci():  # as the pipeline computes it: summed core times when two kinds were swapped
        kinds = [k for k in ("self", "cross") if _samples(ref_kinds.get(k)) and _samples(run_kinds.get(k))]
        if len(kinds) > 1:
            return bootstrap_total_ratio_ci([(_samples(ref_kinds[k]), "sum") for k in kinds],
                                            [(_samples(run_kinds[k]), "sum") for k in kinds], seed=2)
        return bootstrap_ratio_ci(ref_calls, run_calls, seed=2)

    op = _interval(c.get("op_speedup"), c.get("op_speedup_ci"), op_ci)
    share = num(c.get("reference_attention_share"))
    if num(dit.value) is None and num(full.value) is None:
        return None
    checks = {"dit": K.check_dit(dit, share, op)}
    if num(full.value) is not None:
        checks["full"] = K.check_dit_vae(full, share, op, num(ref.get("dit_loop_s")),
                                         num(ref.get("vae_decode_s")), num(run.get("vae_decode_s")),
                                         dit=checks["dit"])
    headline = next((k for k in ("full", "dit") if k in checks and not checks[k].inconsistent
                     and checks[k].measured.known), None)
    figure = checks[headline].measured if headline else None
    # Level when the figure's interval, widened by the gate's noise allowance, spans 1.0.
    figure_level = figure is not None and K.level_within_noise(figure)
    return {"ratio": full.value if num(full.value) is not None else dit.value,
            "what": "DiT loop + VAE decode" if num(full.value) is not None else "DiT loop",
            "dit": dit.value, "lo": dit.low, "hi": dit.high,
            "full": full.value, "full_lo": full.low, "full_hi": full.high,
            "predicted": num(c.get("amdahl_predicted_dit")), "share": share,
            "op": op.value, "op_lo": op.low, "op_hi": op.high,
            "checks": checks, "inconsistent": [k for k in checks.values() if k.inconsistent],
            "headline": headline, "figure": figure, "figure_level": figure_level,
            "tolerance": K.TOLERANCE,
            "headline_what": {"full": "DiT loop + VAE decode", "dit": "DiT loop"}.get(headline or "", ""),
            "reference": plain(c.get("reference")), "attention": attention,
            "latents": c.get("latents"), "frames": c.get("frames")}


def pipeline_swapped(ev: dict) -> str:
    """Which attention the pipeline swapped, in words (evidence from before --swap: self only)."""
    swap = dig(ev, "pipeline", "config", "swap", default=None)
    kinds = [k for k in ("self", "cross") if k in swap] if isinstance(swap, list) else ["self"]
    return {("self",): "self-attention", ("cross",): "cross-attention"}.get(tuple(kinds),
                                                                             "self- and cross-attention")


def parity_passed(ev: dict) -> bool | None:
    p = ev.get("parity")
    return p.get("passed") if isinstance(p, dict) and isinstance(p.get("passed"), bool) else None


def parity_worst(ev: dict) -> dict:
    worst = {"rel_l2": None, "one_minus_cos": None, "max_abs": None}
    for s in dig(ev, "parity", "shapes", default=[]):
        for key, src in (("rel_l2", "candidate_vs_reference"), ("max_abs", "candidate_vs_reference"),
                         ("one_minus_cos", "candidate_vs_oracle")):
            v = num(dig(s, src, key))
            if v is not None and (worst[key] is None or v > worst[key]):
                worst[key] = v
    return worst


def linkage_files(ev: dict) -> list[dict]:
    files = dig(ev, "linkage", "files", default=[])
    return [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []


def linkage_verdict(ev: dict) -> str | None:
    """linkage.json's overall verdict: "pass", "fail" or "error"; None without linkage evidence."""
    v = dig(ev, "linkage", "verdict")
    return v if isinstance(v, str) else None


def target_records(ev: dict) -> list[dict]:
    """build.json's per-target records."""
    return build_targets(ev.get("build"))


def stage_records(ev: dict) -> list[dict]:
    return [s for s in dig(ev, "run", "stages", default=[]) if isinstance(s, dict)]


def bundle_relative(ev: dict, path: str) -> str:
    """An audited path inside the run's bundle folder, shown relative to the bundle."""
    root = str(dig(ev, "run", "bundle_dir") or "")
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return path


def finding_count(ev) -> int:
    return sum(len(f.get("findings") or []) for f in linkage_files(ev))
