"""The report's tables and charts, each built from the evidence dicts (never typed by hand)."""

from __future__ import annotations

import shlex

from audit import __version__
from audit.report import plots
from audit.report.readers import (bench_shapes, bundle_relative, dig, finding_count, headline_op, pipeline_swapped,
                                  linkage_files, parity_passed, parity_worst, pipeline_speedup, primary_name,
                                  shape_label, target_records)
from audit.report.wording import (FP8_LABEL, NEVER_RUN_WHY, baseline_name, finding_text, fmt_cos, is_level, metrics_line,
                                  num, percent, plain, precision_of, sci, seconds, short_reason, speed_phrase,
                                  times)


def cell(t: str, css: str = "") -> dict:
    return {"text": t, "css": css}


def methods(ev, device) -> list[tuple[str, str]]:
    env = ev.get("environment") or {}
    torch = dig(env, "torch") or {}
    gpus = dig(env, "gpus") or []
    gpu_t = "; ".join(plain(x.get("name") if isinstance(x, dict) else x) for x in gpus) if gpus else "none"
    hw = (f"{device}; CPU {plain(dig(env, 'cpu', 'model'))}, {plain(dig(env, 'cpu', 'logical_cores'))} logical "
          f"cores; GPUs: {gpu_t}")
    tv = torch.get("version") if isinstance(torch, dict) else torch
    stack = (f"torch {plain(tv)}; python {plain(str(dig(env, 'python') or '').split(' ')[0])}; numpy {plain(dig(env, 'numpy'))}; "
             f"nvcc {plain(dig(env, 'toolchain', 'nvcc'))}; hipcc {plain(dig(env, 'toolchain', 'hipcc'))}; "
             f"gcc {plain(dig(env, 'toolchain', 'gcc'))}")
    if ev.get("pipeline") is not None:
        stack += f"; diffusers {plain(dig(ev, 'pipeline', 'versions', 'diffusers'))}"
    par = ev.get("parity") or {}
    bench = ev.get("bench") or {}
    gates = dig(par, "gates") or {}
    shapes = [shape_label(s) for s in dig(par, "shapes", default=[])] or [shape_label(s) for s in bench_shapes(ev)]
    rows = [("Hardware", hw), ("Stack and versions", stack),
            ("Oracle", f"{plain(dig(par, 'oracle'))}; reference: {plain(dig(par, 'reference'))}" if par else
             "not recorded (no parity evidence)"),
            ("Procedure", "; ".join(x for x in (
                f"parity: fresh seeded random inputs (seed {dig(par, 'seed')} + shape index), outputs "
                "NaN-poisoned first so an unwritten element fails" if par else "",
                f"timing: {plain(dig(bench, 'timer'))}, {dig(bench, 'warmup')} warm-up call(s), "
                f"{dig(bench, 'repeats')} repeats per backend, {plain(dig(bench, 'order'))}, input sets rotated"
                if bench else "",
                "pipeline: " + ("; ".join(f"{k}: {plain(v)}" for k, v in dig(ev, 'pipeline', 'method').items()
                                          if k not in ("inputs", "parity"))
                                if isinstance(dig(ev, 'pipeline', 'method'), dict) else "see pipeline.json")
                if ev.get("pipeline") is not None else "") if x) or "not recorded"),
            ("Precision", f"{FP8_LABEL}: inputs {plain(dig(par, 'dtype') or dig(bench, 'dtype'))}, quantized "
                          "inside the call (INT8 Q K^T with K smoothed, e4m3 P V, flash_kernel.fp8); softmax "
                          "statistics fp32; held to the fp8 gates" if precision_of(ev) == "fp8" else
                          f"inputs {plain(dig(par, 'dtype') or dig(bench, 'dtype'))}; accumulation and softmax "
                          "statistics fp32 (the kernel's C ABI)"),
            ("Metric and gate", ("parity gates: " + ", ".join(f"{k} {v}" for k, v in gates.items())
                                 if isinstance(gates, dict) and gates else "no parity gates recorded")
             + f"; speed: ratio of medians, {plain(dig(bench, 'flops'), '4*B*H*Nq*Nk*D')} FLOPs for TFLOP/s"),
            ("Stimulus", (", ".join(shapes) or "not recorded")
             + (f"; pipeline: {plain(dig(ev, 'pipeline', 'method', 'inputs'))}"
                if dig(ev, "pipeline", "method", "inputs") else ""))]
    return rows


def targets_table(ev, ran) -> list[dict]:
    rows = []
    for t in target_records(ev):
        name = str(t.get("target"))
        status = str(t.get("status"))
        run_here = name in ran
        note = t.get("reason") or ""
        if status == "built" and not run_here:
            note = next((v for k, v in NEVER_RUN_WHY.items() if name.startswith(k)), "not run here")
        if name.endswith("-generic"):
            note = (note + "; " if note else "") + "the generic (RDNA2) logic forced on NVIDIA: a proxy, never an RDNA2 figure"
        rows.append({"target": name, "built": status, "built_css": {"built": "ok", "failed": "fail"}.get(status, "skipped"),
                     "run": "yes" if run_here else "no", "run_css": "ok" if run_here else "warn", "note": plain(note, "")})
    return rows


def results(ev, op, e2e, sov) -> list[dict]:
    rows = []
    if op:
        s, sp = op
        level = is_level(sp.get("ci_low"), sp.get("ci_high"))
        rows.append({"what": "Op", "value": "level" if level else times(sp["ratio"]), "css": "warn" if level else "",
                     "detail": f"{primary_name(ev)} vs our naive path on {shape_label(s)}: "
                               + speed_phrase(sp.get("ratio"), sp.get("ci_low"), sp.get("ci_high")),
                     "evidence": "evidence/bench.json"})
    else:
        rows.append({"what": "Op", "value": "not measured", "css": "warn", "detail": "no bench evidence",
                     "evidence": ""})
    if e2e:
        fig = e2e["figure"]
        share = (f"; attention share {100 * e2e['share']:.1f}% of the {plain(e2e['reference'])} run"
                 if e2e.get("share") is not None else "")
        value = ("not claimed" if fig is None else "level" if e2e["figure_level"] else times(fig.value))
        rows.append({"what": "End to end", "value": value, "css": "warn" if e2e["inconsistent"] or fig is None else "",
                     "detail": f"{plain(dig(ev, 'pipeline', 'preset'), '')} DiT pipeline, flash vs "
                               f"{baseline_name(e2e['reference'])}{share}; "
                               + "; ".join(k.sentence() for k in e2e["checks"].values()),
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
                            + ("; " + "; ".join(plain(f) for f in dig(ev, 'parity', 'failures', default=[])[:5])
                               if pp is False else "")) if pp is not None else "no parity evidence",
                 "evidence": "evidence/parity.json" if pp is not None else ""})
    n = len(linkage_files(ev))
    rows.append({"what": "Sovereignty", "value": {"pass": "pass", "fail": "FAIL"}.get(sov or "", "not checked"),
                 "css": {"pass": "pass", "fail": "fail"}.get(sov or "", "warn"),
                 "detail": f"{n} object(s) audited, {finding_count(ev)} finding(s)" if sov else "no linkage evidence",
                 "evidence": "evidence/linkage.json" if sov else ""})
    return rows


def parity_table(ev) -> tuple[list[str], list[dict]]:
    head = ["shape", "status", "rel L2 vs float64", "cosine vs naive", "max abs", "NaN/Inf", "seed"]
    rows = []
    for s in dig(ev, "parity", "shapes", default=[]):
        if not isinstance(s, dict):
            continue
        ref = dig(s, "candidate_vs_reference") or {}
        ora = dig(s, "candidate_vs_oracle") or {}
        st = str(s.get("status"))
        rows.append({"cells": [cell(shape_label(s)), cell(st, "pass" if st == "passed" else "fail"),
                               cell(sci(ref.get("rel_l2"))), cell(fmt_cos(ora.get("cosine")) if ora else "n/a"),
                               cell(sci(ref.get("max_abs"))),
                               cell(f"{int(ref.get('nan') or 0) + int(ref.get('inf') or 0)}" if ref else "n/a"),
                               cell(str(s.get("seed")))]})
    return head, rows


def bench_table(ev) -> tuple[list[str], list[dict]]:
    head = ["shape", "backend", "status", "median ms", "IQR ms", "min-max ms", "n", "TFLOP/s", "speedup of ours (95% CI)"]
    rows = []
    prim = primary_name(ev)
    for s in bench_shapes(ev):
        sps = {sp.get("baseline"): sp for sp in dig(s, "speedups", default=[]) if isinstance(sp, dict)}
        for b in dig(s, "backends", default=[]):
            if not isinstance(b, dict):
                continue
            t = b.get("timing") or {}
            ours = b.get("name") == prim
            path = s.get("path") if ours and isinstance(s.get("path"), str) else None
            name = (str(b.get("name")) + (" (vendor)" if b.get("vendor") else "")
                    + ((f" (ours, {path} path)" if path and path != "refused" else " (ours)") if ours else ""))
            sp = sps.get(b.get("name"))
            sp_t = (f"{times(sp.get('ratio'))} ({times(sp.get('ci_low'))} to {times(sp.get('ci_high'))})"
                    + (", level" if is_level(sp.get("ci_low"), sp.get("ci_high")) else "") if sp else "")
            ok = b.get("status") == "ok"
            rows.append({"cells": [cell(shape_label(s)), cell(name),
                                   cell(str(b.get("status")) + ("" if ok else f": {short_reason(b.get('reason'))}"),
                                        "ok" if ok else "skipped"),
                                   cell(f"{num(t.get('median')):.4g}" if num(t.get("median")) else "n/a"),
                                   cell(f"{num(t.get('iqr')):.3g}" if num(t.get("iqr")) is not None else "n/a"),
                                   cell(f"{num(t.get('min')):.4g} to {num(t.get('max')):.4g}"
                                        if num(t.get("min")) and num(t.get("max")) else "n/a"),
                                   cell(str(t.get("n", ""))),
                                   cell(f"{num(b.get('tflops')):.3g}" if num(b.get("tflops")) is not None else "n/a"),
                                   cell(sp_t)]})
    return head, rows


def pipeline_rows(ev) -> list[tuple[str, str]]:
    p = ev.get("pipeline")
    if not isinstance(p, dict):
        return []
    cfg = p.get("config") or {}
    rows = [("preset", f"{plain(p.get('preset'))}: {plain(dig(cfg, 'preset', 'about'), '')}"),
            ("steps, guidance", f"{plain(cfg.get('steps'))} steps, {plain(cfg.get('cfg'))}, guidance {plain(cfg.get('guidance_scale'))}"),
            ("device, dtype", f"{plain(cfg.get('device'))}, {plain(cfg.get('dtype'))}"),
            ("attention cores", plain(cfg.get("attention"))),
            ("swapped", f"every {pipeline_swapped(ev)}"),
            ("finished", {True: "yes: every core ran to the end", False: "no"}.get(p.get("complete"), "not recorded"))]
    for r in p.get("runs") or []:
        if isinstance(r, dict):
            inst = r.get("instrumented_step") or {}
            vae = [seconds(x) for x in r.get("vae_decode_samples_s") or [] if num(x) is not None]
            rows.append((f"run: {plain(r.get('attention'))}",
                         f"{plain(r.get('status'))}{': ' + short_reason(r.get('reason')) if r.get('reason') else ''}; "
                         f"DiT loop {seconds(r.get('dit_loop_s'))}, VAE decode {seconds(r.get('vae_decode_s'))}"
                         + (f" (median of {', '.join(vae)})" if len(vae) > 1 else "")
                         + f", attention share {percent(inst.get('attention_share'))}"))
    e2e = pipeline_speedup(ev)
    if e2e:
        base = baseline_name(e2e["reference"])
        rows.append((f"measured speedup, flash vs {base}",
                     f"DiT loop {speed_phrase(e2e['dit'], e2e['lo'], e2e['hi'])}; DiT loop + VAE decode "
                     f"{speed_phrase(e2e['full'], e2e['full_lo'], e2e['full_hi'])}"))
        rows.append(("op speedup in the pipeline (s_op)", speed_phrase(e2e["op"], e2e["op_lo"], e2e["op_hi"])))
        for key, k in e2e["checks"].items():
            rows.append((f"Amdahl check ({k.what})",
                         f"predicted {times(k.predicted.value)} = 1 / ((1 - p) + p / s_op), p "
                         + (f"{percent(e2e['share'])} scaled by the unchanged decode time" if key == "full"
                            else percent(e2e["share"])) + f"; {k.sentence()}"))
        for key in ("latents", "frames"):
            m = e2e.get(key)
            if isinstance(m, dict):
                rows.append((f"{key}: flash vs naive", metrics_line(m)))
    cal = p.get("calibration")
    if isinstance(cal, dict):
        rows.append(("calibration", f"a {plain(cal.get('relative_perturbation'))} relative perturbation of the "
                     "attention output gives: " + "; ".join(f"{k} {metrics_line(cal[k])}" for k in ("latents", "frames")
                                                            if isinstance(cal.get(k), dict))))
    return rows


def other_libraries(ev) -> list[dict]:
    """Parity and bench of the other libraries a run checked (other targets, --artifact objects)."""
    rows = []
    for stem in sorted(ev):
        stage, _, which = stem.partition(".")
        if stage not in ("parity", "bench") or not which or not isinstance(ev[stem], dict):
            continue
        d = ev[stem]
        lib = plain(dig(d, "selection", "library", "path") or dig(d, "selection", "spec"), which)
        if stage == "parity":
            passed = d.get("passed")
            rows.append({"evidence": f"evidence/{stem}.json", "library": lib, "what": "parity",
                         "value": {True: "pass", False: "FAIL"}.get(passed, "n/a"),
                         "css": {True: "pass", False: "fail"}.get(passed, "warn"),
                         "detail": "; ".join(plain(f) for f in d.get("failures") or [])[:600]})
        else:
            sub = {"bench": d}
            best = headline_op(sub)
            rows.append({"evidence": f"evidence/{stem}.json", "library": lib, "what": "op vs its naive path",
                         "value": times(best[1].get("ratio")) if best else "n/a", "css": "",
                         "detail": (f"on {shape_label(best[0])}: "
                                    + speed_phrase(best[1].get("ratio"), best[1].get("ci_low"), best[1].get("ci_high"))
                                    if best else "no timing")})
    return rows


def sovereignty_summary(ev, sov) -> str:
    if sov is None:
        return "No linkage evidence in this bundle: sovereignty was not checked."
    pol = plain(dig(ev, "linkage", "policy", "name") or dig(ev, "linkage", "policy"), "the default policy")
    return (f"Policy {pol}: {len(linkage_files(ev))} object(s), verdict {sov}, {finding_count(ev)} finding(s). "
            "Each object is identified by its sha256; the verdict applies to exactly those bytes.")


def sovereignty(ev, artifacts) -> list[dict]:
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
                          "text": finding_text(x)} for x in findings]
            + [{"css": "warn", "text": f"warning: {plain(w)}"} for w in f.get("warnings") or []],
        })
    return rows


def _transitive(f: dict, needed: list[str]) -> list[str]:
    """Libraries the resolved DT_NEEDED tree (linkage.json's `resolved`) reaches beyond the direct ones."""
    out: list[str] = []

    def walk(node, level):
        if level > 32 or not isinstance(node, dict):
            return
        name = node.get("name")
        if level >= 1 and isinstance(name, str) and name not in needed and name not in out:
            out.append(name)
        children = node.get("children")
        for child in children if isinstance(children, list) else []:
            walk(child, level + 1)

    walk(f.get("resolved"), 0)
    return out


def reproducibility(ev, artifacts) -> dict:
    run = ev.get("run") or {}
    cmds = []
    if run.get("command_line"):
        cmds.append(str(run["command_line"]))
    for t in target_records(ev):
        c = dig(t, "provenance", "command") or t.get("command")
        if isinstance(c, list):
            cwd = dig(t, "provenance", "cwd")
            cmds.append((f"(cd {shlex.quote(str(cwd))} && " if cwd else "(") + shlex.join(str(x) for x in c) + ")")
        elif c:
            cmds.append(str(c))
    cmds.append("sovereign-audit verify BUNDLE_DIR   # check every signature, digest and the manifest")
    cmds.append("sovereign-audit report BUNDLE_DIR/evidence --out NEW_DIR   # rebuild this report")
    env = ev.get("environment") or {}
    torch = dig(env, "torch") or {}
    versions = [("sovereign-audit", plain(dig(run, "tool", "version"), __version__)),
                ("python", plain(dig(env, "python"))), ("os", plain(dig(env, "os"))),
                ("torch", plain(torch.get("version") if isinstance(torch, dict) else torch))]
    if isinstance(torch, dict):
        for k in ("cuda", "hip", "cudnn"):
            if k in torch:
                versions.append((f"torch {k}", plain(torch.get(k), "none (this torch build has no such runtime)")))
    for k, v in (dig(env, "toolchain") or {}).items():
        versions.append((str(k), plain(v, "not found on this machine")))
    if ev.get("pipeline") is not None:
        for k, v in (dig(ev, "pipeline", "versions") or {}).items():
            versions.append((f"pipeline {k}", plain(v, "none (not in this torch build)")))
    for t in target_records(ev):
        comp = dig(t, "provenance", "compiler") or {}
        if comp:
            pk = comp.get("packages") or {}
            versions.append((f"{t.get('target')} compiler", f"{plain(comp.get('name'))} {plain(comp.get('version'))}"
                             + (" (" + ", ".join(f"{k} {v}" for k, v in pk.items()) + ")" if pk else "")))
    digests = [{"name": a.path, "sha256": a.sha256, "size": a.size} for a in artifacts]
    return {"commands": cmds, "versions": versions, "digests": digests}


def speedup_chart(ev) -> plots.Chart | None:
    rows = []
    baselines = []
    for s in bench_shapes(ev):
        for sp in dig(s, "speedups", default=[]):
            if not isinstance(sp, dict):
                continue
            b = str(sp.get("baseline"))
            if b not in baselines:
                baselines.append(b)
            rows.append({"label": f"vs {b}, {shape_label(s)}", "ratio": num(sp.get("ratio")),
                         "lo": num(sp.get("ci_low")), "hi": num(sp.get("ci_high")),
                         "series": baselines.index(b)})
    return plots.speedup_chart(rows)


def tflops_chart(ev) -> plots.Chart | None:
    groups = []
    for s in bench_shapes(ev):
        items = [(str(b.get("name")), num(b.get("tflops")), bool(b.get("vendor")))
                 for b in dig(s, "backends", default=[]) if isinstance(b, dict) and num(b.get("tflops")) is not None]
        groups.append((shape_label(s), items))
    return plots.grouped_chart(groups, "tflops", "TFLOP/s per backend and shape (at the median)",
                               "4·B·H·Nq·Nk·D FLOPs per call divided by the median time; vendor backends "
                               "(not sovereign) dashed.", "TFLOP/s")
