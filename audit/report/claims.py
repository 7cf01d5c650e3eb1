"""What the report claims, what it does not, the threats to validity and the claim boundary.

Every claim carries the evidence file it rests on: `rendered_claims` drops a claim without
evidence, so the report cannot state what the bundle does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from audit.report.readers import (bench_shapes, dig, linkage_files, parity_passed, parity_worst, pipeline_swapped,
                                  pipeline_speedup, primary_name, shape_label, speedups, stage_records)
from audit.report.wording import (FP8_LABEL, NEVER_RUN_WHY, baseline_name, e2e_phrase, is_level, kernel_name,
                                  metrics_line, num, plain, precision_of, sci, short_reason, speed_phrase, times)


@dataclass
class Claim:
    text: str
    evidence: list[str] = field(default_factory=list)  # bundle-relative files it rests on
    boundary: str = ""  # the short form for the claim boundary's "Proven"


def rendered_claims(claims: list[Claim]) -> list[Claim]:
    """A claim with no evidence behind it is not rendered."""
    return [c for c in claims if c.evidence and all(isinstance(e, str) and e for e in c.evidence)]


def claimed(ev, op, e2e, sov, device) -> list[Claim]:
    out: list[Claim] = []
    fp8 = precision_of(ev) == "fp8"
    who = f"{primary_name(ev)} ({FP8_LABEL})" if fp8 else primary_name(ev)
    files = linkage_files(ev)
    if sov == "pass" and files:
        policy = plain(dig(ev, "linkage", "policy", "name") or dig(ev, "linkage", "policy"), "the default policy")
        out.append(Claim(
            f"None of the {len(files)} audited object(s) links, loads or embeds a vendor BLAS/DNN/"
            f"attention library under {policy} (DT_NEEDED, transitive dependencies, versioned imports, "
            "static symbols, dlopen strings and embedded device kernels checked).",
            ["evidence/linkage.json"], f"sovereignty of the {len(files)} audited object(s), by digest"))
    if parity_passed(ev) is True and fp8:
        shapes = dig(ev, "parity", "shapes", default=[])
        w = parity_worst(ev)
        g = dig(ev, "parity", "gates", default={}) or {}
        out.append(Claim(
            f"The {FP8_LABEL} flash forward stays within the fp8 gates (relative L2 <= {sci(g.get('rel_l2'))}, "
            f"cosine >= {plain(g.get('cosine'))}) against a float64 reference on all {len(shapes)} tested "
            f"shape(s) on {device} (worst relative L2 {sci(w['rel_l2'])}; worst 1-cos against our exact naive "
            f"path {sci(w['one_minus_cos'])}); it is quantized attention, not exact.",
            ["evidence/parity.json"], f"FP8 parity within the fp8 gates on the {len(shapes)} listed shape(s)"))
    elif parity_passed(ev) is True:
        shapes = dig(ev, "parity", "shapes", default=[])
        w = parity_worst(ev)
        out.append(Claim(
            f"The flash forward matches a float64 reference within the {plain(dig(ev, 'parity', 'dtype'))} "
            f"gates on all {len(shapes)} tested shape(s) on {device} (worst relative L2 {sci(w['rel_l2'])}; "
            f"worst 1-cos against our naive path {sci(w['one_minus_cos'])}), every output element written.",
            ["evidence/parity.json"], f"numerical parity on the {len(shapes)} listed shape(s)"))
    for s, sp in speedups(ev, "naive"):
        lo, hi = num(sp.get("ci_low")), num(sp.get("ci_high"))
        if lo is not None and lo > 1.0:
            out.append(Claim(
                f"On {device}, {who} is {times(sp['ratio'])} faster than our naive pre-flash "
                f"path on {shape_label(s)} (95% CI {times(lo)} to {times(hi)}, {dig(ev, 'bench', 'repeats')} "
                f"repeats, {plain(dig(ev, 'bench', 'dtype'))}).",
                ["evidence/bench.json"], f"op speedup over the naive path on {shape_label(s)} on {device}"))
    for s, sp in speedups(ev, "eager"):
        lo = num(sp.get("ci_low"))
        if lo is not None and lo > 1.0:
            out.append(Claim(
                f"On {device}, {who} is {times(sp['ratio'])} faster than torch eager "
                f"softmax(QK^T)V on {shape_label(s)} (95% CI {times(lo)} to {times(sp.get('ci_high'))}).",
                ["evidence/bench.json"], f"op speedup over torch eager on {shape_label(s)}"))
    for s, sp in speedups(ev, "sdpa-flash") + speedups(ev, "sdpa-cudnn") + speedups(ev, "sdpa-efficient"):
        lo = num(sp.get("ci_low"))
        if lo is not None and lo > 1.0:
            out.append(Claim(
                f"On {device}, {who} is {times(sp['ratio'])} faster than vendor "
                f"{sp['baseline']} on {shape_label(s)} (95% CI from {times(lo)}).",
                ["evidence/bench.json"], f"faster than {sp['baseline']} on {shape_label(s)}"))
    fig = e2e["figure"] if e2e is not None else None
    if fig is not None and fig.low > 1.0 and not e2e["figure_level"]:
        preset = plain(dig(ev, "pipeline", "preset"), "the recorded")
        k = e2e["checks"][e2e["headline"]]
        out.append(Claim(
            f"The {preset} DiT pipeline (random weights) ran {times(fig.value)} faster ({e2e['headline_what']}, "
            f"95% CI {times(fig.low)} to {times(fig.high)}) with our {kernel_name(ev, 'flash kernel')} in every "
            f"{pipeline_swapped(ev)} than with "
            f"{baseline_name(e2e['reference'])} on {device}; {k.sentence()}.",
            ["evidence/pipeline.json"],
            f"{e2e['headline_what']} speedup of the {preset} pipeline over {baseline_name(e2e['reference'])} "
            f"on {device}"))
    return out


def not_claimed(ev, never_run, run) -> list[str]:
    out = []
    for t in never_run:
        why = next((v for k, v in NEVER_RUN_WHY.items() if t.startswith(k)), "not run on this machine")
        out.append(f"Any correctness or speed figure for {t}: {why}.")
    if dig(run, "device") == "cpu" or dig(ev, "bench", "device") == "cpu":
        out.append("Any GPU speed: this run measured on a CPU; CPU timings do not predict GPU speed.")
    out.append("Output quality of a trained model: parity is agreement with a reference, not image or "
               "video quality.")
    if precision_of(ev) == "fp8":
        out.append("Exact attention: this run measured the opt-in FP8 path (INT8 Q K^T, FP8 P V, quantized "
                   "inside the call); its figures hold for FP8 only, within the fp8 gates, and say nothing "
                   "about the exact kernel.")
    if ev.get("pipeline") is not None:
        out.append("Anything about Wan2.1's trained weights: the pipeline used seeded random weights.")
    vendor_ok = [b for s in bench_shapes(ev) for b in dig(s, "backends", default=[])
                 if isinstance(b, dict) and b.get("vendor") and b.get("status") == "ok"]
    if not vendor_ok:
        out.append("A comparison with vendor attention (cuDNN, FlashAttention-2 via SDPA): no vendor A/B ran.")
    for base in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"):
        for s, sp in speedups(ev, base):
            hi = num(sp.get("ci_high"))
            if hi is not None and hi < 1.0:
                out.append(f"Being faster than vendor {base} on {shape_label(s)}: ours is slower "
                           f"({times(sp.get('ratio'))}, 95% CI {times(sp.get('ci_low'))} to {times(hi)}).")
    for s, sp in speedups(ev, "naive") + speedups(ev, "eager"):
        lo = num(sp.get("ci_low"))
        if lo is None or lo <= 1.0:
            out.append(f"A speedup over {baseline_name(sp['baseline'])} on {shape_label(s)}: "
                       + (f"level, the 95% CI ({times(sp.get('ci_low'))} to {times(sp.get('ci_high'))}) "
                          "spans 1.0." if is_level(sp.get("ci_low"), sp.get("ci_high"))
                          else f"{speed_phrase(sp.get('ratio'), sp.get('ci_low'), sp.get('ci_high'))}."))
    e2e = pipeline_speedup(ev)
    if e2e is not None:
        for k in e2e["inconsistent"]:
            out.append(f"An end-to-end speedup from the {k.what}: {k.sentence()}.")
        fig = e2e["figure"]
        if fig is not None and (e2e["figure_level"] or not fig.low > 1.0):
            out.append(f"An end-to-end speedup ({e2e['headline_what']}): {e2e_phrase(e2e)}.")
    out.append("Shapes, dtypes, head dims, masks (causal), or the backward pass not listed in the evidence.")
    out.append("Any binary other than the objects listed by sha256 below (a rebuild is a different object).")
    return out


def boundary(claimed, not_claimed, ev, artifacts, device, never_run) -> dict:
    applies = []
    for a in artifacts:
        applies.append(f"{a.label}: {a.path} (sha256 {a.sha256})")
    if ev.get("bench") is not None or ev.get("parity") is not None:
        applies.append(f"the device {device}")
    shapes = sorted({shape_label(s) for s in dig(ev, "parity", "shapes", default=[])}
                    | {shape_label(s) for s in bench_shapes(ev)})
    if shapes:
        applies.append("the shapes " + ", ".join(shapes))
    dtypes = sorted({str(x) for x in (dig(ev, "parity", "dtype"), dig(ev, "bench", "dtype")) if x})
    if dtypes:
        applies.append("the dtype(s) " + ", ".join(dtypes))
    if precision_of(ev) == "fp8":
        applies.append(f"precision {FP8_LABEL}")
    does_not = ["any other binary (a different sha256), including a rebuild of the same source"]
    does_not += [f"target {t} (never run)" for t in never_run]
    does_not += ["other shapes, dtypes, head dims, masks, the backward pass", "other devices or drivers",
                 "model quality (trained weights were never used)"]
    # "Not proven" is the Not claimed list above: the boundary points to it rather than repeat it.
    return {"proven": [{"what": c.boundary or c.text, "evidence": list(c.evidence)}
                       for c in rendered_claims(claimed)],
            "not_proven_count": len(not_claimed), "applies_to": applies, "does_not_apply_to": does_not}


def threats(ev, never_run, run, failing) -> list[str]:
    out = []
    bench = ev.get("bench")
    if isinstance(bench, dict):
        worst = None
        for s in bench_shapes(ev):
            for b in dig(s, "backends", default=[]):
                t = b.get("timing") or {} if isinstance(b, dict) else {}
                med, iqr = num(t.get("median")), num(t.get("iqr"))
                if med and iqr is not None:
                    spread = iqr / med
                    if worst is None or spread > worst[0]:
                        worst = (spread, str(b.get("name")), shape_label(s))
        r = dig(bench, "repeats")
        line = f"Repeats and spread: {r} timed repeats per backend and shape"
        if worst:
            line += f"; the widest spread is IQR/median {100 * worst[0]:.1f}% ({worst[1]} on {worst[2]})"
        if isinstance(r, int) and r < 10:
            line += "; fewer than 10 repeats: the CIs are wide and the medians unstable"
        out.append(line + ".")
        if dig(bench, "device") == "cpu":
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
    steps = dig(ev, "pipeline", "config", "steps")
    if isinstance(steps, int) and steps < 5:
        out.append(f"The pipeline timings rest on {steps} timed step(s) per attention core: its speedup CI "
                   "is degenerate with so few samples, and one disturbance on a shared machine moves it.")
    if ev.get("pipeline") is not None:
        cal = dig(ev, "pipeline", "calibration")
        out.append("Random-weight pipeline: with default random init attention errors are heavily damped, so "
                   "latent agreement near 1.0 means little on its own"
                   + (f"; the calibration (a {plain(cal.get('relative_perturbation'))} relative perturbation of "
                      f"the attention output) moves the latents to {metrics_line(cal.get('latents') or {})}"
                      if isinstance(cal, dict) else "; no calibration is recorded") + ".")
    vendor = [(str(b.get("name")), b.get("status"), short_reason(b.get("reason"))) for s in bench_shapes(ev)
              for b in dig(s, "backends", default=[]) if isinstance(b, dict) and b.get("vendor")]
    if any(st == "ok" for _, st, _ in vendor):
        out.append("A vendor A/B ran (PyTorch SDPA backends, not sovereign): see the timing table.")
    else:
        why = "; ".join(sorted({f"{n}: {r}" for n, st, r in vendor if r}))[:400]
        out.append("No vendor A/B ran" + (f" ({why})" if why else "") + ": nothing here compares us with cuDNN "
                   "or FlashAttention-2.")
    for s in failing:
        out.append(f"Stage {s['name']} {'failed' if s['status'] == 'failed' else 'failed its gate'}: "
                   f"{plain(s['reason'], 'no reason recorded')}. What depends on it is missing from this report.")
    for s in stage_records(ev):
        if s.get("status") == "skipped":
            out.append(f"Stage {s.get('name')} was skipped: {plain(s.get('reason'), 'no reason recorded')}.")
    return out
