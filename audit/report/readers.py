"""Readers: one named accessor per figure the report takes from the evidence dicts.

Evidence may come from elsewhere (`sovereign-audit report DIR`), so every reader tolerates a
missing key or a wrong type and answers None or an empty list rather than raising.
"""

from __future__ import annotations

from typing import Any

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


def device_name(ev: dict) -> str:
    for src in ("bench", "parity", "pipeline"):
        n = dig(ev, src, "device_name")
        if n:
            return plain(n)
    gpus = dig(ev, "environment", "gpus")
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return plain(gpus[0]["name"])
    cpu = dig(ev, "environment", "cpu", "model") or dig(ev, "run", "host", "processor")
    device = dig(ev, "run", "device") or "cpu"
    return f"{plain(cpu, 'an unidentified CPU')} (CPU)" if device == "cpu" else "an unidentified GPU"


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


def pipeline_comparison(ev: dict, attention: str = "flash") -> dict | None:
    for c in dig(ev, "pipeline", "comparisons", default=[]):
        if isinstance(c, dict) and c.get("attention") == attention:
            return c
    return None


def pipeline_speedup(ev: dict) -> dict | None:
    """The end-to-end figures of flash against the naive reference run, when the evidence has them.

    "ratio" is DiT loop + VAE decode (the whole generation) when measured, else the DiT loop.
    """
    c = pipeline_comparison(ev)
    if c is None:
        return None
    dit = num(c.get("speedup_dit_measured"))
    full = num(c.get("speedup_dit_vae_measured"))
    ratio = full if full is not None else dit
    if ratio is None:
        return None
    ci = c.get("speedup_dit_ci") or {}
    return {"ratio": ratio, "what": "DiT loop + VAE decode" if full is not None else "DiT loop",
            "dit": dit, "lo": num(ci.get("ci_low")), "hi": num(ci.get("ci_high")),
            "predicted": num(c.get("amdahl_predicted_dit")), "share": num(c.get("reference_attention_share")),
            "op": num(c.get("op_speedup")), "latents": c.get("latents"), "frames": c.get("frames")}


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
