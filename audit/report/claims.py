"""From evidence to what the report says: headline, claims, methods, results, threats, boundary.

Every sentence with a number is built here from the evidence dicts (never typed), and every claim
carries the evidence file it rests on: `rendered_claims` drops a claim without evidence, so the
report cannot state what the bundle does not hold. Strings taken from evidence stay plain str
here; the template escapes them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from audit import __version__
from audit.report import plots

# Targets and what running them would need (for "built, never run").
AMD_PREFIX = "gfx"
NEVER_RUN_WHY = {
    "gfx": "no AMD GPU is available to this project: built and audited only",
    "sm_": "an NVIDIA target: not run on this machine",
}


@dataclass
class Claim:
    text: str
    evidence: list[str] = field(default_factory=list)  # bundle-relative files it rests on
    boundary: str = ""  # the short form for the claim boundary's "Proven"


@dataclass
class ReportModel:
    title: str
    device: str
    generated: str
    tool_version: str
    verdict: dict
    signing: dict
    abstract: list[str]
    claimed: list[Claim]
    not_claimed: list[str]
    methods: list[tuple[str, str]]
    targets: list[dict]
    results: list[dict]
    parity_head: list[str]
    parity_rows: list[dict]
    bench_head: list[str]
    bench_rows: list[dict]
    pipeline_rows: list[tuple[str, str]]
    other_rows: list[dict]
    charts: list[plots.Chart]
    sovereignty_summary: str
    sovereignty: list[dict]
    threats: list[str]
    boundary: dict
    reproducibility: dict
    stages: list[dict]
    warnings: list[str]
    headline: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["claimed"] = [asdict(c) for c in rendered_claims(self.claimed)]
        return d


def rendered_claims(claims: list[Claim]) -> list[Claim]:
    """A claim with no evidence behind it is not rendered."""
    return [c for c in claims if c.evidence and all(isinstance(e, str) and e for e in c.evidence)]


# --------------------------------------------------------------------------------------------
# small helpers


def g(d: Any, *path, default=None):
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


def num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def fx(x, digits: int = 2) -> str:
    v = num(x)
    return "n/a" if v is None else f"{v:.{digits}f}x"


def sci(x, digits: int = 2) -> str:
    v = num(x)
    return "n/a" if v is None else f"{v:.{digits}e}"


def fmt_cos(c) -> str:
    """Cosine with enough digits that 0.999995 never reads as 1.0, and 1-cos beside it."""
    v = num(c)
    if v is None:
        return "n/a"
    return f"{v:.7f} (1-cos {1.0 - v:.1e})"


def speed_phrase(ratio, lo=None, hi=None) -> str:
    """A ratio of times in words that never calls a slowdown or a tie a speedup."""
    r, lo, hi = num(ratio), num(lo), num(hi)
    if r is None:
        return "not measured"
    ci = f" (95% CI {lo:.2f}x to {hi:.2f}x)" if lo is not None and hi is not None else ""
    if lo is not None and hi is not None and lo <= 1.0 <= hi:
        return f"{r:.2f}x{ci}: no significant difference"
    return (f"{r:.2f}x faster" if r >= 1.0 else f"slower ({r:.2f}x)") + ci


def text(x, default: str = "not recorded") -> str:
    if x is None or x == "" or x == []:
        return default
    if isinstance(x, (list, tuple)):
        return ", ".join(str(v) for v in x)
    return " ".join(str(x).split())


def shape_label(s: dict) -> str:
    return str(g(s, "shape", "label") or g(s, "label") or "?")


def cell(t: str, css: str = "") -> dict:
    return {"text": t, "css": css}


# --------------------------------------------------------------------------------------------
# readers: one per evidence file


def device_name(ev: dict) -> str:
    for src in ("bench", "parity", "pipeline"):
        n = g(ev, src, "device_name")
        if n:
            return text(n)
    gpus = g(ev, "environment", "gpus")
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return text(gpus[0]["name"])
    cpu = g(ev, "environment", "cpu", "model") or g(ev, "run", "host", "processor")
    device = g(ev, "run", "device") or "cpu"
    return f"{text(cpu, 'an unidentified CPU')} (CPU)" if device == "cpu" else "an unidentified GPU"


def bench_shapes(ev: dict) -> list[dict]:
    return [s for s in g(ev, "bench", "shapes", default=[]) if isinstance(s, dict)]


def primary_name(ev: dict) -> str:
    return str(g(ev, "bench", "primary") or "flash")


def speedups(ev: dict, baseline: str) -> list[tuple[dict, dict]]:
    out = []
    for s in bench_shapes(ev):
        for sp in g(s, "speedups", default=[]):
            if isinstance(sp, dict) and sp.get("baseline") == baseline and num(sp.get("ratio")):
                out.append((s, sp))
    return out


def headline_op(ev: dict) -> tuple[dict, dict] | None:
    """Flash vs our naive pre-flash path on the largest timed shape (by FLOPs)."""
    rows = speedups(ev, "naive")
    if not rows:
        return None
    return max(rows, key=lambda r: num(g(r[0], "shape", "flops")) or 0)


def pipeline_comparison(ev: dict, attention: str = "flash") -> dict | None:
    for c in g(ev, "pipeline", "comparisons", default=[]):
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
    for s in g(ev, "parity", "shapes", default=[]):
        for key, src in (("rel_l2", "candidate_vs_reference"), ("max_abs", "candidate_vs_reference"),
                         ("one_minus_cos", "candidate_vs_oracle")):
            v = num(g(s, src, key))
            if v is not None and (worst[key] is None or v > worst[key]):
                worst[key] = v
    return worst


def linkage_files(ev: dict) -> list[dict]:
    files = g(ev, "linkage", "files", default=[])
    return [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []


def linkage_verdict(ev: dict) -> str | None:
    link = ev.get("linkage")
    if not isinstance(link, dict):
        return None
    files = linkage_files(ev)
    v = link.get("verdict")
    if isinstance(v, str):
        return v
    if isinstance(link.get("exit_code"), int):
        return "pass" if link["exit_code"] == 0 else "fail"
    if files:
        return "pass" if all(f.get("verdict") == "pass" for f in files) else "fail"
    return None


def build_targets(ev: dict) -> list[dict]:
    from audit.report.orchestrate import _build_targets

    return _build_targets(ev.get("build"))


def stage_records(ev: dict) -> list[dict]:
    return [s for s in g(ev, "run", "stages", default=[]) if isinstance(s, dict)]


# --------------------------------------------------------------------------------------------
# the model


def build_model(ev: dict, artifacts=(), signing=None, warnings=()) -> ReportModel:
    device = device_name(ev)
    run = ev.get("run") or {}
    op = headline_op(ev)
    e2e = pipeline_speedup(ev)
    sov = linkage_verdict(ev)
    ran_targets = [str(t) for t in g(run, "targets_run", default=[])]
    built = [t for t in build_targets(ev) if t.get("status") == "built"]
    never_run = [str(t.get("target")) for t in built if str(t.get("target")) not in ran_targets]

    title = _title(device, op, e2e, sov)
    claimed = _claims(ev, op, e2e, sov, device)
    not_claimed = _not_claimed(ev, never_run, run)
    stages = [dict(s, reason=s.get("reason"), notes=[str(n) for n in s.get("notes", []) or []],
                   verdict=s.get("verdict"), status=str(s.get("status")), seconds=num(s.get("seconds")))
              for s in stage_records(ev) if s.get("name") != "report"]
    failing = [s for s in stages if s["status"] == "failed" or s["verdict"] == "fail"]
    verdict = ({"css": "fail", "text": "the claim does not hold as stated: "
                + "; ".join(f"{s['name']} {'failed' if s['status'] == 'failed' else 'gate failed'}"
                            + (f" ({s['reason']})" if s['reason'] else "") for s in failing)}
               if failing else
               {"css": "pass", "text": "every stage that ran produced its evidence and every gate held"}
               if stages else {"css": "warn", "text": "no run record (run.json) in this evidence"})
    sig = asdict(signing) if signing is not None and hasattr(signing, "__dataclass_fields__") else \
        (dict(signing) if signing else {"available": False, "line": "signing: not available"})
    sig["css"] = "unsigned" if not sig.get("available") else ("ephemeral" if sig.get("ephemeral") else "")
    sig["detail"] = (f"DSSE envelopes (Ed25519 over the PAE) in attestations/, manifest.json signed in "
                     f"manifest.dsse.json, public key public.pem; keyid {sig.get('keyid')}. "
                     + ("The key was made for this run only: the signature proves the files were not "
                        "changed after signing (integrity), not who signed them (no identity)."
                        if sig.get("ephemeral") else "")
                     if sig.get("available") else "this bundle is not signed: " + text(sig.get("reason"), "signing not available"))
    charts = [c for c in (_speedup_chart(ev), _tflops_chart(ev)) if c is not None]
    parity_head, parity_rows = _parity_table(ev)
    bench_head, bench_rows = _bench_table(ev)
    return ReportModel(
        title=title, device=device,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), tool_version=__version__,
        verdict=verdict, signing=sig,
        abstract=_abstract(ev, device, op, e2e, sov, never_run, failing),
        claimed=claimed, not_claimed=not_claimed,
        methods=_methods(ev, device), targets=_targets_table(ev, ran_targets),
        results=_results(ev, op, e2e, sov),
        parity_head=parity_head, parity_rows=parity_rows, bench_head=bench_head, bench_rows=bench_rows,
        pipeline_rows=_pipeline_rows(ev), other_rows=_other_libraries(ev), charts=charts,
        sovereignty_summary=_sovereignty_summary(ev, sov), sovereignty=_sovereignty(ev, artifacts),
        threats=_threats(ev, never_run, run, failing),
        boundary=_boundary(claimed, not_claimed, ev, artifacts, device, never_run),
        reproducibility=_reproducibility(ev, artifacts),
        stages=stages, warnings=[str(w) for w in warnings],
        headline={"op": num(g(op[1], "ratio")) if op else None, "e2e": e2e["ratio"] if e2e else None,
                  "sovereign": sov},
    )


def _title(device: str, op, e2e, sov) -> str:
    lead = {"pass": "Sovereign flash attention", "fail": "Non-sovereign build: flash attention"}.get(
        sov or "", "Flash attention (sovereignty not checked)")
    op_t = f"{num(op[1]['ratio']):.1f}x op" if op else "op speedup not measured"
    e2e_t = f"{e2e['ratio']:.2f}x end-to-end" if e2e else "end-to-end not measured"
    return f"{lead} on {device}: {op_t}, {e2e_t}"


def _claims(ev, op, e2e, sov, device) -> list[Claim]:
    out: list[Claim] = []
    files = linkage_files(ev)
    if sov == "pass" and files:
        policy = text(g(ev, "linkage", "policy", "name") or g(ev, "linkage", "policy"), "the default policy")
        out.append(Claim(
            f"None of the {len(files)} audited object(s) links, loads or embeds a vendor BLAS/DNN/"
            f"attention library under {policy} (DT_NEEDED, transitive dependencies, versioned imports, "
            "static symbols, dlopen strings and embedded device kernels checked).",
            ["evidence/linkage.json"], f"sovereignty of the {len(files)} audited object(s), by digest"))
    if parity_passed(ev) is True:
        shapes = g(ev, "parity", "shapes", default=[])
        w = parity_worst(ev)
        out.append(Claim(
            f"The flash forward matches a float64 reference within the {text(g(ev, 'parity', 'dtype'))} "
            f"gates on all {len(shapes)} tested shape(s) on {device} (worst relative L2 {sci(w['rel_l2'])}; "
            f"worst 1-cos against our naive path {sci(w['one_minus_cos'])}), every output element written.",
            ["evidence/parity.json"], f"numerical parity on the {len(shapes)} listed shape(s)"))
    for s, sp in speedups(ev, "naive"):
        lo, hi = num(sp.get("ci_low")), num(sp.get("ci_high"))
        if lo is not None and lo > 1.0:
            out.append(Claim(
                f"On {device}, {primary_name(ev)} is {fx(sp['ratio'])} faster than our naive pre-flash "
                f"path on {shape_label(s)} (95% CI {fx(lo)} to {fx(hi)}, {g(ev, 'bench', 'repeats')} "
                f"repeats, {text(g(ev, 'bench', 'dtype'))}).",
                ["evidence/bench.json"], f"op speedup over the naive path on {shape_label(s)} on {device}"))
    for s, sp in speedups(ev, "eager"):
        lo = num(sp.get("ci_low"))
        if lo is not None and lo > 1.0:
            out.append(Claim(
                f"On {device}, {primary_name(ev)} is {fx(sp['ratio'])} faster than torch eager "
                f"softmax(QK^T)V on {shape_label(s)} (95% CI {fx(lo)} to {fx(sp.get('ci_high'))}).",
                ["evidence/bench.json"], f"op speedup over torch eager on {shape_label(s)}"))
    for s, sp in speedups(ev, "sdpa-flash") + speedups(ev, "sdpa-cudnn") + speedups(ev, "sdpa-efficient"):
        lo = num(sp.get("ci_low"))
        if lo is not None and lo > 1.0:
            out.append(Claim(
                f"On {device}, {primary_name(ev)} is {fx(sp['ratio'])} faster than vendor "
                f"{sp['baseline']} on {shape_label(s)} (95% CI from {fx(lo)}).",
                ["evidence/bench.json"], f"faster than {sp['baseline']} on {shape_label(s)}"))
    if e2e is not None:
        preset = text(g(ev, "pipeline", "preset"), "the recorded")
        pred = (f"; Amdahl predicted {fx(e2e['predicted'])} for the DiT loop from the measured attention "
                f"share {100 * (e2e['share'] or 0):.1f}% and op speedup {fx(e2e['op'])}" if e2e.get("predicted") else "")
        ok = e2e["lo"] is None or e2e["lo"] > 1.0
        if e2e["ratio"] > 1.0 and ok:
            out.append(Claim(
                f"The {preset} DiT pipeline (random weights) ran {fx(e2e['ratio'])} faster end to end "
                f"({e2e['what']}) with our flash self-attention than with our naive path on {device}; "
                f"DiT loop {fx(e2e['dit'])} (95% CI {fx(e2e['lo'])} to {fx(e2e['hi'])}){pred}.",
                ["evidence/pipeline.json"], f"end-to-end speedup of the {preset} pipeline on {device}"))
    return out


def _not_claimed(ev, never_run, run) -> list[str]:
    out = []
    for t in never_run:
        why = next((v for k, v in NEVER_RUN_WHY.items() if t.startswith(k)), "not run on this machine")
        out.append(f"Any correctness or speed figure for {t}: {why}.")
    if g(run, "device") == "cpu" or g(ev, "bench", "device") == "cpu":
        out.append("Any GPU speed: this run measured on a CPU; CPU timings do not predict GPU speed.")
    out.append("Output quality of a trained model: parity is agreement with a reference, not image or "
               "video quality.")
    if ev.get("pipeline") is not None:
        out.append("Anything about Wan2.1's trained weights: the pipeline used seeded random weights.")
    vendor_ok = [b for s in bench_shapes(ev) for b in g(s, "backends", default=[])
                 if isinstance(b, dict) and b.get("vendor") and b.get("status") == "ok"]
    if not vendor_ok:
        out.append("A comparison with vendor attention (cuDNN, FlashAttention-2 via SDPA): no vendor A/B ran.")
    for base in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"):
        for s, sp in speedups(ev, base):
            hi = num(sp.get("ci_high"))
            if hi is not None and hi < 1.0:
                out.append(f"Being faster than vendor {base} on {shape_label(s)}: ours is slower "
                           f"({fx(sp.get('ratio'))}, 95% CI {fx(sp.get('ci_low'))} to {fx(hi)}).")
    for s, sp in speedups(ev, "naive") + speedups(ev, "eager"):
        lo = num(sp.get("ci_low"))
        if lo is None or lo <= 1.0:
            out.append(f"A speedup over {sp['baseline']} on {shape_label(s)}: the 95% CI "
                       f"({fx(sp.get('ci_low'))} to {fx(sp.get('ci_high'))}) does not exclude 1.0.")
    e2e = pipeline_speedup(ev)
    if e2e is not None and not (e2e["ratio"] > 1.0 and (e2e["lo"] is None or e2e["lo"] > 1.0)):
        out.append(f"An end-to-end speedup: measured {fx(e2e['ratio'])} ({e2e['what']}), DiT loop "
                   f"{speed_phrase(e2e.get('dit'), e2e.get('lo'), e2e.get('hi'))}.")
    out.append("Shapes, dtypes, head dims, masks (causal), or the backward pass not listed in the evidence.")
    out.append("Any binary other than the objects listed by sha256 below (a rebuild is a different object).")
    return out


def _abstract(ev, device, op, e2e, sov, never_run, failing) -> list[str]:
    paras = []
    sov_t = {"pass": "passes the sovereignty policy (no vendor BLAS/DNN/attention library linked, "
                     "loaded or embedded)",
             "fail": "FAILS the sovereignty policy"}.get(sov or "", "was not checked for sovereignty")
    n_obj = len(linkage_files(ev))
    paras.append(f"We audit a hand-written flash-attention kernel build and measure it on {device}. "
                 f"The build ({n_obj} object(s) audited) {sov_t}.")
    bits = []
    pp = parity_passed(ev)
    if pp is not None:
        n = len(g(ev, "parity", "shapes", default=[]))
        bits.append(f"parity against a float64 reference {'holds' if pp else 'FAILS'} on {n} shape(s)")
    if op:
        s, sp = op
        bits.append(f"against our naive pre-flash path on {shape_label(s)} the flash forward is "
                    + speed_phrase(sp.get("ratio"), sp.get("ci_low"), sp.get("ci_high")))
    if e2e:
        bits.append(f"end to end ({e2e['what']}) the {text(g(ev, 'pipeline', 'preset'), '')} DiT pipeline with "
                    f"flash is {speed_phrase(e2e['ratio'], None, None)} than with the naive path; its DiT loop "
                    + speed_phrase(e2e.get("dit"), e2e.get("lo"), e2e.get("hi")))
    if bits:
        paras.append("Measured: " + "; ".join(bits) + ".")
    if never_run:
        paras.append("Built and audited but never run here: " + ", ".join(never_run) + ".")
    if failing:
        paras.append("Stages that failed: " + ", ".join(s["name"] for s in failing)
                     + " (see Reproducibility and provenance).")
    return paras


def _methods(ev, device) -> list[tuple[str, str]]:
    env = ev.get("environment") or {}
    torch = g(env, "torch") or {}
    gpus = g(env, "gpus") or []
    gpu_t = "; ".join(text(x.get("name") if isinstance(x, dict) else x) for x in gpus) if gpus else "none"
    hw = (f"{device}; CPU {text(g(env, 'cpu', 'model'))}, {text(g(env, 'cpu', 'logical_cores'))} logical "
          f"cores; GPUs: {gpu_t}")
    tv = torch.get("version") if isinstance(torch, dict) else torch
    stack = (f"torch {text(tv)}; python {text(str(g(env, 'python') or '').split(' ')[0])}; numpy {text(g(env, 'numpy'))}; "
             f"nvcc {text(g(env, 'toolchain', 'nvcc'))}; hipcc {text(g(env, 'toolchain', 'hipcc'))}; "
             f"gcc {text(g(env, 'toolchain', 'gcc'))}")
    if ev.get("pipeline") is not None:
        stack += f"; diffusers {text(g(ev, 'pipeline', 'versions', 'diffusers'))}"
    par = ev.get("parity") or {}
    bench = ev.get("bench") or {}
    gates = g(par, "gates") or {}
    shapes = [shape_label(s) for s in g(par, "shapes", default=[])] or [shape_label(s) for s in bench_shapes(ev)]
    rows = [("Hardware", hw), ("Stack and versions", stack),
            ("Oracle", f"{text(g(par, 'oracle'))}; reference: {text(g(par, 'reference'))}" if par else
             "not recorded (no parity evidence)"),
            ("Procedure", "; ".join(x for x in (
                f"parity: fresh seeded random inputs (seed {g(par, 'seed')} + shape index), outputs "
                "NaN-poisoned first so an unwritten element fails" if par else "",
                f"timing: {text(g(bench, 'timer'))}, {g(bench, 'warmup')} warm-up call(s), "
                f"{g(bench, 'repeats')} repeats per backend, {text(g(bench, 'order'))}, input sets rotated"
                if bench else "",
                "pipeline: " + ("; ".join(f"{k}: {text(v)}" for k, v in g(ev, 'pipeline', 'method').items()
                                          if k not in ("inputs", "parity"))
                                if isinstance(g(ev, 'pipeline', 'method'), dict) else "see pipeline.json")
                if ev.get("pipeline") is not None else "") if x) or "not recorded"),
            ("Precision", f"inputs {text(g(par, 'dtype') or g(bench, 'dtype'))}; accumulation and softmax "
                          "statistics fp32 (the kernel's C ABI)"),
            ("Metric and gate", ("parity gates: " + ", ".join(f"{k} {v}" for k, v in gates.items())
                                 if isinstance(gates, dict) and gates else "no parity gates recorded")
             + f"; speed: ratio of medians, {text(g(bench, 'flops'), '4*B*H*Nq*Nk*D')} FLOPs for TFLOP/s"),
            ("Stimulus", (", ".join(shapes) or "not recorded")
             + (f"; pipeline: {text(g(ev, 'pipeline', 'method', 'inputs'))}"
                if g(ev, "pipeline", "method", "inputs") else ""))]
    return rows


def _targets_table(ev, ran) -> list[dict]:
    rows = []
    for t in build_targets(ev):
        name = str(t.get("target"))
        status = str(t.get("status"))
        run_here = name in ran
        note = t.get("reason") or ""
        if status == "built" and not run_here:
            note = next((v for k, v in NEVER_RUN_WHY.items() if name.startswith(k)), "not run here")
        if name.endswith("-generic"):
            note = (note + "; " if note else "") + "the generic (RDNA2) logic forced on NVIDIA: a proxy, never an RDNA2 figure"
        rows.append({"target": name, "built": status, "built_css": {"built": "ok", "failed": "fail"}.get(status, "skipped"),
                     "run": "yes" if run_here else "no", "run_css": "ok" if run_here else "warn", "note": text(note, "")})
    return rows


def _results(ev, op, e2e, sov) -> list[dict]:
    rows = []
    if op:
        s, sp = op
        rows.append({"what": "Op", "value": fx(sp["ratio"]), "css": "",
                     "detail": f"{primary_name(ev)} vs our naive path on {shape_label(s)}; 95% CI "
                               f"{fx(sp.get('ci_low'))} to {fx(sp.get('ci_high'))}",
                     "evidence": "evidence/bench.json"})
    else:
        rows.append({"what": "Op", "value": "not measured", "css": "warn", "detail": "no bench evidence",
                     "evidence": ""})
    if e2e:
        pred = f"; Amdahl predicted {fx(e2e['predicted'])}" if e2e.get("predicted") else ""
        share = f"; attention share {100 * e2e['share']:.1f}% of the naive run" if e2e.get("share") is not None else ""
        rows.append({"what": "End to end", "value": fx(e2e["ratio"]), "css": "",
                     "detail": f"{text(g(ev, 'pipeline', 'preset'), '')} DiT pipeline, flash vs naive{pred}{share}",
                     "evidence": "evidence/pipeline.json"})
    else:
        rows.append({"what": "End to end", "value": "not measured", "css": "warn",
                     "detail": "no pipeline evidence", "evidence": ""})
    pp = parity_passed(ev)
    w = parity_worst(ev)
    rows.append({"what": "Parity", "value": {True: "pass", False: "FAIL", None: "not checked"}[pp],
                 "css": {True: "pass", False: "fail", None: "warn"}[pp],
                 "detail": (f"worst relative L2 vs float64 {sci(w['rel_l2'])}; worst 1-cos vs naive "
                            f"{sci(w['one_minus_cos'])}; worst max abs {sci(w['max_abs'])}"
                            + ("; " + "; ".join(text(f) for f in g(ev, 'parity', 'failures', default=[])[:5])
                               if pp is False else "")) if pp is not None else "no parity evidence",
                 "evidence": "evidence/parity.json" if pp is not None else ""})
    n = len(linkage_files(ev))
    rows.append({"what": "Sovereignty", "value": {"pass": "pass", "fail": "FAIL"}.get(sov or "", "not checked"),
                 "css": {"pass": "pass", "fail": "fail"}.get(sov or "", "warn"),
                 "detail": f"{n} object(s) audited, {_finding_count(ev)} finding(s)" if sov else "no linkage evidence",
                 "evidence": "evidence/linkage.json" if sov else ""})
    return rows


def _finding_count(ev) -> int:
    return sum(len(f.get("findings") or []) for f in linkage_files(ev))


def _parity_table(ev) -> tuple[list[str], list[dict]]:
    head = ["shape", "status", "rel L2 vs float64", "cosine vs naive", "max abs", "NaN/Inf", "seed"]
    rows = []
    for s in g(ev, "parity", "shapes", default=[]):
        if not isinstance(s, dict):
            continue
        ref = g(s, "candidate_vs_reference") or {}
        ora = g(s, "candidate_vs_oracle") or {}
        st = str(s.get("status"))
        rows.append({"cells": [cell(shape_label(s)), cell(st, "pass" if st == "passed" else "fail"),
                               cell(sci(ref.get("rel_l2"))), cell(fmt_cos(ora.get("cosine")) if ora else "n/a"),
                               cell(sci(ref.get("max_abs"))),
                               cell(f"{int(ref.get('nan') or 0) + int(ref.get('inf') or 0)}" if ref else "n/a"),
                               cell(str(s.get("seed")))]})
    return head, rows


def _bench_table(ev) -> tuple[list[str], list[dict]]:
    head = ["shape", "backend", "status", "median ms", "IQR ms", "min-max ms", "n", "TFLOP/s", "speedup of ours (95% CI)"]
    rows = []
    prim = primary_name(ev)
    for s in bench_shapes(ev):
        sps = {sp.get("baseline"): sp for sp in g(s, "speedups", default=[]) if isinstance(sp, dict)}
        for b in g(s, "backends", default=[]):
            if not isinstance(b, dict):
                continue
            t = b.get("timing") or {}
            name = str(b.get("name")) + (" (vendor)" if b.get("vendor") else "") + (" (ours)" if b.get("name") == prim else "")
            sp = sps.get(b.get("name"))
            sp_t = (f"{fx(sp.get('ratio'))} ({fx(sp.get('ci_low'))} to {fx(sp.get('ci_high'))})" if sp else "")
            ok = b.get("status") == "ok"
            rows.append({"cells": [cell(shape_label(s)), cell(name),
                                   cell(str(b.get("status")) + ("" if ok else f": {text(b.get('reason'), '')}"),
                                        "ok" if ok else "skipped"),
                                   cell(f"{num(t.get('median')):.4g}" if num(t.get("median")) else "n/a"),
                                   cell(f"{num(t.get('iqr')):.3g}" if num(t.get("iqr")) is not None else "n/a"),
                                   cell(f"{num(t.get('min')):.4g} to {num(t.get('max')):.4g}"
                                        if num(t.get("min")) and num(t.get("max")) else "n/a"),
                                   cell(str(t.get("n", ""))),
                                   cell(f"{num(b.get('tflops')):.3g}" if num(b.get("tflops")) is not None else "n/a"),
                                   cell(sp_t)]})
    return head, rows


def _pipeline_rows(ev) -> list[tuple[str, str]]:
    p = ev.get("pipeline")
    if not isinstance(p, dict):
        return []
    cfg = p.get("config") or {}
    rows = [("preset", f"{text(p.get('preset'))}: {text(g(cfg, 'preset', 'about'), '')}"),
            ("steps, guidance", f"{text(cfg.get('steps'))} steps, {text(cfg.get('cfg'))}, guidance {text(cfg.get('guidance_scale'))}"),
            ("device, dtype", f"{text(cfg.get('device'))}, {text(cfg.get('dtype'))}"),
            ("attention cores", text(cfg.get("attention"))),
            ("complete", text(p.get("complete")))]
    for r in p.get("runs") or []:
        if isinstance(r, dict):
            inst = r.get("instrumented_step") or {}
            rows.append((f"run: {text(r.get('attention'))}",
                         f"{text(r.get('status'))}{': ' + text(r.get('reason')) if r.get('reason') else ''}; "
                         f"DiT loop {_sec(r.get('dit_loop_s'))}, VAE decode {_sec(r.get('vae_decode_s'))}, "
                         f"attention share {_pct(inst.get('attention_share'))}"))
    e2e = pipeline_speedup(ev)
    if e2e:
        rows.append(("measured speedup, flash vs naive", f"{fx(e2e['ratio'])} ({e2e['what']}); DiT loop "
                     f"{fx(e2e['dit'])} (95% CI {fx(e2e['lo'])} to {fx(e2e['hi'])})"))
        rows.append(("Amdahl-predicted (DiT loop)", f"{fx(e2e['predicted'])} = 1 / ((1 - p) + p / s_op), "
                     f"p {_pct(e2e['share'])}, s_op {fx(e2e['op'])}"))
        for key in ("latents", "frames"):
            m = e2e.get(key)
            if isinstance(m, dict):
                rows.append((f"{key}: flash vs naive", _metrics_line(m)))
    cal = p.get("calibration")
    if isinstance(cal, dict):
        rows.append(("calibration", f"a {text(cal.get('relative_perturbation'))} relative perturbation of the "
                     "attention output gives: " + "; ".join(f"{k} {_metrics_line(cal[k])}" for k in ("latents", "frames")
                                                            if isinstance(cal.get(k), dict))))
    return rows


def _other_libraries(ev) -> list[dict]:
    """Parity and bench of the other libraries a run checked (other targets, --artifact objects)."""
    rows = []
    for stem in sorted(ev):
        stage, _, which = stem.partition(".")
        if stage not in ("parity", "bench") or not which or not isinstance(ev[stem], dict):
            continue
        d = ev[stem]
        lib = text(g(d, "selection", "library", "path") or g(d, "selection", "spec"), which)
        if stage == "parity":
            passed = d.get("passed")
            rows.append({"evidence": f"evidence/{stem}.json", "library": lib, "what": "parity",
                         "value": {True: "pass", False: "FAIL"}.get(passed, "n/a"),
                         "css": {True: "pass", False: "fail"}.get(passed, "warn"),
                         "detail": "; ".join(text(f) for f in d.get("failures") or [])[:600]})
        else:
            sub = {"bench": d}
            best = headline_op(sub)
            rows.append({"evidence": f"evidence/{stem}.json", "library": lib, "what": "op vs its naive path",
                         "value": fx(best[1].get("ratio")) if best else "n/a", "css": "",
                         "detail": (f"on {shape_label(best[0])}: "
                                    + speed_phrase(best[1].get("ratio"), best[1].get("ci_low"), best[1].get("ci_high"))
                                    if best else "no timing")})
    return rows


def _sec(x) -> str:
    v = num(x)
    return "n/a" if v is None else f"{v:.3g} s"


def _pct(x) -> str:
    v = num(x)
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _metrics_line(m: dict) -> str:
    return (f"cosine {fmt_cos(m.get('cosine'))}, rel L2 {sci(m.get('rel_l2'))}, PSNR "
            f"{'n/a' if num(m.get('psnr_db')) is None else format(num(m.get('psnr_db')), '.1f') + ' dB'}")


def _kv_line(d: dict) -> str:
    parts = []
    for k, v in d.items():
        if isinstance(v, dict):
            parts.append(f"{k}: {_kv_line(v)}")
        elif isinstance(v, float):
            parts.append(f"{k} {fmt_cos(v) if 'cos' in k else f'{v:.4g}'}")
        elif isinstance(v, (int, str)):
            parts.append(f"{k} {v}")
    return "; ".join(parts)


def _sovereignty_summary(ev, sov) -> str:
    if sov is None:
        return "No linkage evidence in this bundle: sovereignty was not checked."
    pol = text(g(ev, "linkage", "policy", "name") or g(ev, "linkage", "policy"), "the default policy")
    return (f"Policy {pol}: {len(linkage_files(ev))} object(s), verdict {sov}, {_finding_count(ev)} finding(s). "
            "Each object is identified by its sha256; the verdict applies to exactly those bytes.")


def _sovereignty(ev, artifacts) -> list[dict]:
    rows = []
    for f in linkage_files(ev):
        findings = [x for x in f.get("findings") or [] if isinstance(x, dict)]
        needed = [str(n) for n in f.get("needed") or []]
        transitive = _transitive(f, needed)
        static = [str(x.get("subject")) for x in findings if x.get("kind") == "static-symbol"]
        dl = [str(x.get("subject")) for x in findings if x.get("kind") == "dlopen-string"]
        strings = [str(s.get("text")) if isinstance(s, dict) else str(s) for s in f.get("library_strings") or []]
        dev = f.get("device_targets") or [d.get("target") for d in f.get("device_code") or [] if isinstance(d, dict)]
        v = str(f.get("verdict") or "?")
        rows.append({
            "object": bundle_relative(ev, str(f.get("path"))), "sha256": str(f.get("sha256") or "not recorded"),
            "verdict": v, "verdict_css": {"pass": "pass", "fail": "fail"}.get(v, "warn"),
            "needed": needed, "transitive": transitive,
            "static_symbols": ", ".join(static) if static else "no vendor symbol flagged",
            "dlopen_strings": dl or strings, "device_targets": sorted({str(d) for d in dev if d}),
            "findings": [{"css": "fail" if x.get("severity", "fail") == "fail" and not x.get("excepted") else "warn",
                          "text": _finding_text(x)} for x in findings]
            + [{"css": "warn", "text": f"warning: {text(w)}"} for w in f.get("warnings") or []],
        })
    return rows


def bundle_relative(ev: dict, path: str) -> str:
    """An audited path inside the run's bundle folder, shown relative to the bundle."""
    root = str(g(ev, "run", "bundle_dir") or "")
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return path


def _transitive(f: dict, needed: list[str]) -> list[str]:
    out: list[str] = []

    def walk(node, depth):
        if depth > 64 or not isinstance(node, (dict, list)):
            return
        if isinstance(node, list):
            for n in node:
                walk(n, depth + 1)
            return
        name = node.get("name") or node.get("soname")
        if isinstance(name, str) and name not in needed and name not in out and depth > 1:
            out.append(name)
        for key in ("children", "deps", "dependencies", "needed"):
            if isinstance(node.get(key), list):
                walk(node[key], depth + 1)

    tree = f.get("resolved") or f.get("tree") or f.get("dependencies")
    walk(tree, 1 if isinstance(tree, list) else 0)
    if not out:
        for key in ("transitive",):
            out += [str(x) for x in f.get(key) or []]
    return out


def _finding_text(x: dict) -> str:
    t = f"[{text(x.get('rule'), '?')}] {text(x.get('kind'), '')} {text(x.get('subject'), '')} ({text(x.get('where'), '')})"
    if x.get("in_file"):
        t += f" in {text(x.get('in_file'))}"
    chain = x.get("chain")
    if isinstance(chain, list) and len(chain) > 1:
        t += " via " + " -> ".join(str(c) for c in chain)
    if x.get("reason"):
        t += f": {text(x.get('reason'))}"
    if x.get("use_instead"):
        t += f" (use instead: {text(x.get('use_instead'))})"
    if x.get("excepted"):
        t += f" [waived: {text(x.get('excepted'))}]"
    if x.get("severity") == "warn":
        t += " [warning]"
    return t


def _threats(ev, never_run, run, failing) -> list[str]:
    out = []
    bench = ev.get("bench")
    if isinstance(bench, dict):
        worst = None
        for s in bench_shapes(ev):
            for b in g(s, "backends", default=[]):
                t = b.get("timing") or {} if isinstance(b, dict) else {}
                med, iqr = num(t.get("median")), num(t.get("iqr"))
                if med and iqr is not None:
                    spread = iqr / med
                    if worst is None or spread > worst[0]:
                        worst = (spread, str(b.get("name")), shape_label(s))
        r = g(bench, "repeats")
        line = f"Repeats and spread: {r} timed repeats per backend and shape"
        if worst:
            line += f"; the widest spread is IQR/median {100 * worst[0]:.1f}% ({worst[1]} on {worst[2]})"
        if isinstance(r, int) and r < 10:
            line += "; fewer than 10 repeats: the CIs are wide and the medians unstable"
        out.append(line + ".")
        if g(bench, "device") == "cpu":
            out.append("CPU timing (perf_counter) on a shared machine is noisy and says nothing about a GPU; "
                       "the CPU path is a different code path from the GPU kernels.")
    else:
        out.append("No timing evidence: no speed is claimed.")
    if never_run:
        out.append("Targets built and audited but never run: " + ", ".join(never_run)
                   + ". Their correctness and speed are untested; in particular no RDNA2 (gfx1030) figure "
                     "exists: an NVIDIA run of the generic path is a proxy, not an RDNA2 measurement.")
    out.append("Parity is not quality: agreement with a float64 reference on random inputs bounds numerical "
               "error on those inputs only.")
    steps = g(ev, "pipeline", "config", "steps")
    if isinstance(steps, int) and steps < 5:
        out.append(f"The pipeline timings rest on {steps} timed step(s) per attention core: its speedup CI "
                   "is degenerate with so few samples, and one disturbance on a shared machine moves it.")
    if ev.get("pipeline") is not None:
        cal = g(ev, "pipeline", "calibration")
        out.append("Random-weight pipeline: with default random init attention errors are heavily damped, so "
                   "latent agreement near 1.0 means little on its own"
                   + (f"; the calibration (a {text(cal.get('relative_perturbation'))} relative perturbation of "
                      f"the attention output) moves the latents to {_metrics_line(cal.get('latents') or {})}"
                      if isinstance(cal, dict) else "; no calibration is recorded") + ".")
    vendor = [(str(b.get("name")), b.get("status"), text(b.get("reason"), "")) for s in bench_shapes(ev)
              for b in g(s, "backends", default=[]) if isinstance(b, dict) and b.get("vendor")]
    if any(st == "ok" for _, st, _ in vendor):
        out.append("A vendor A/B ran (PyTorch SDPA backends, not sovereign): see the timing table.")
    else:
        why = "; ".join(sorted({f"{n}: {r}" for n, st, r in vendor if r}))[:400]
        out.append("No vendor A/B ran" + (f" ({why})" if why else "") + ": nothing here compares us with cuDNN "
                   "or FlashAttention-2.")
    for s in failing:
        out.append(f"Stage {s['name']} {'failed' if s['status'] == 'failed' else 'failed its gate'}: "
                   f"{text(s['reason'], 'no reason recorded')}. What depends on it is missing from this report.")
    for s in stage_records(ev):
        if s.get("status") == "skipped":
            out.append(f"Stage {s.get('name')} was skipped: {text(s.get('reason'), 'no reason recorded')}.")
    return out


def _boundary(claimed, not_claimed, ev, artifacts, device, never_run) -> dict:
    applies = []
    for a in artifacts:
        applies.append(f"{a.label}: {a.path} (sha256 {a.sha256})")
    if ev.get("bench") is not None or ev.get("parity") is not None:
        applies.append(f"the device {device}")
    shapes = sorted({shape_label(s) for s in g(ev, "parity", "shapes", default=[])}
                    | {shape_label(s) for s in bench_shapes(ev)})
    if shapes:
        applies.append("the shapes " + ", ".join(shapes))
    dtypes = sorted({str(x) for x in (g(ev, "parity", "dtype"), g(ev, "bench", "dtype")) if x})
    if dtypes:
        applies.append("the dtype(s) " + ", ".join(dtypes))
    does_not = ["any other binary (a different sha256), including a rebuild of the same source"]
    does_not += [f"target {t} (never run)" for t in never_run]
    does_not += ["other shapes, dtypes, head dims, masks, the backward pass", "other devices or drivers",
                 "model quality (trained weights were never used)"]
    return {"proven": [c.boundary or c.text for c in rendered_claims(claimed)],
            "not_proven": list(not_claimed), "applies_to": applies, "does_not_apply_to": does_not}


def _reproducibility(ev, artifacts) -> dict:
    run = ev.get("run") or {}
    cmds = []
    if run.get("command_line"):
        cmds.append(str(run["command_line"]))
    import shlex

    for t in build_targets(ev):
        c = g(t, "provenance", "command") or t.get("command")
        if isinstance(c, list):
            cwd = g(t, "provenance", "cwd")
            cmds.append((f"(cd {shlex.quote(str(cwd))} && " if cwd else "(") + shlex.join(str(x) for x in c) + ")")
        elif c:
            cmds.append(str(c))
    cmds.append("sovereign-audit verify BUNDLE_DIR   # check every signature, digest and the manifest")
    cmds.append("sovereign-audit report BUNDLE_DIR/evidence --out NEW_DIR   # rebuild this report")
    env = ev.get("environment") or {}
    torch = g(env, "torch") or {}
    versions = [("sovereign-audit", text(g(run, "tool", "version"), __version__)),
                ("python", text(g(env, "python"))), ("os", text(g(env, "os"))),
                ("torch", text(torch.get("version") if isinstance(torch, dict) else torch))]
    if isinstance(torch, dict):
        for k in ("cuda", "hip", "cudnn"):
            if k in torch:
                versions.append((f"torch {k}", text(torch.get(k), "none (this torch build has no such runtime)")))
    for k, v in (g(env, "toolchain") or {}).items():
        versions.append((str(k), text(v, "not found on this machine")))
    if ev.get("pipeline") is not None:
        for k, v in (g(ev, "pipeline", "versions") or {}).items():
            versions.append((f"pipeline {k}", text(v, "none (not in this torch build)")))
    for t in build_targets(ev):
        comp = g(t, "provenance", "compiler") or {}
        if comp:
            pk = comp.get("packages") or {}
            versions.append((f"{t.get('target')} compiler", f"{text(comp.get('name'))} {text(comp.get('version'))}"
                             + (" (" + ", ".join(f"{k} {v}" for k, v in pk.items()) + ")" if pk else "")))
    digests = [{"name": a.path, "sha256": a.sha256, "size": a.size} for a in artifacts]
    return {"commands": cmds, "versions": versions, "digests": digests}


def _speedup_chart(ev) -> plots.Chart | None:
    rows = []
    baselines = []
    for s in bench_shapes(ev):
        for sp in g(s, "speedups", default=[]):
            if not isinstance(sp, dict):
                continue
            b = str(sp.get("baseline"))
            if b not in baselines:
                baselines.append(b)
            rows.append({"label": f"vs {b}, {shape_label(s)}", "ratio": num(sp.get("ratio")),
                         "lo": num(sp.get("ci_low")), "hi": num(sp.get("ci_high")),
                         "series": baselines.index(b)})
    return plots.speedup_chart(rows)


def _tflops_chart(ev) -> plots.Chart | None:
    groups = []
    for s in bench_shapes(ev):
        items = [(str(b.get("name")), num(b.get("tflops")), bool(b.get("vendor")))
                 for b in g(s, "backends", default=[]) if isinstance(b, dict) and num(b.get("tflops")) is not None]
        groups.append((shape_label(s), items))
    return plots.grouped_chart(groups, "tflops", "TFLOP/s per backend and shape (at the median)",
                               "4·B·H·Nq·Nk·D FLOPs per call divided by the median time; vendor backends "
                               "(not sovereign) dashed.", "TFLOP/s")
