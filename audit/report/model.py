"""The report model: everything report.html shows, built from the evidence dicts.

Every sentence with a number is built from the evidence (never typed); strings taken from
evidence stay plain str here and the template escapes them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from audit import __version__
from audit.report import claims, completeness, plots, tables
from audit.report.claims import Claim, rendered_claims
from audit.report.readers import (accelerator, device_name, dig, headline_op, linkage_files, linkage_verdict,
                                  parity_passed, pipeline_speedup, shape_label, stage_records, target_records,
                                  vendor_beside)
from audit.report.wording import (FP8_LABEL, baseline_name, e2e_phrase, is_level, kernel_name, num, plain,
                                  precision_of, speed_phrase)


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
    incomplete: list[str] = field(default_factory=list)  # why the run did not finish (empty: it did)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["claimed"] = [asdict(c) for c in rendered_claims(self.claimed)]
        return d


def build_model(ev: dict, artifacts=(), signing=None, warnings=()) -> ReportModel:
    """The model of report.html from the evidence dicts; `signing` is the bundle's SigningInfo.

    Evidence of a run that did not finish is set aside (completeness.py): the title says
    "incomplete" and nothing partial is read as a result."""
    finished = completeness.assess(ev)
    ev = completeness.usable(ev, finished)
    device = device_name(ev)
    run = ev.get("run") or {}
    op = headline_op(ev)
    e2e = pipeline_speedup(ev)
    sov = linkage_verdict(ev)
    ran_targets = [str(t) for t in dig(run, "targets_run", default=[])]
    built = [t for t in target_records(ev) if t.get("status") == "built"]
    never_run = [str(t.get("target")) for t in built if str(t.get("target")) not in ran_targets]

    claimed = claims.claimed(ev, op, e2e, sov, device)
    not_claimed = claims.not_claimed(ev, never_run, run)
    stages = [dict(s, reason=s.get("reason"), notes=[str(n) for n in s.get("notes", []) or []],
                   verdict=s.get("verdict"), status=str(s.get("status")), seconds=num(s.get("seconds")))
              for s in stage_records(ev) if s.get("name") != "report"]
    failing = [s for s in stages if s["status"] == "failed" or s["verdict"] == "fail"]
    charts = [c for c in (tables.speedup_chart(ev), tables.tflops_chart(ev)) if c is not None]
    parity_head, parity_rows = tables.parity_table(ev)
    bench_head, bench_rows = tables.bench_table(ev)
    return ReportModel(
        title=_title(accelerator(ev), op, vendor_beside(ev, op[0]) if op else None, e2e, sov, finished,
                     precision_of(ev)),
        device=device,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), tool_version=__version__,
        verdict=_verdict(stages, failing, finished), signing=_signing_view(signing),
        abstract=_abstract(ev, device, op, e2e, sov, never_run, failing, finished),
        claimed=claimed, not_claimed=not_claimed,
        methods=tables.methods(ev, device), targets=tables.targets_table(ev, ran_targets),
        results=tables.results(ev, op, e2e, sov),
        parity_head=parity_head, parity_rows=parity_rows, bench_head=bench_head, bench_rows=bench_rows,
        pipeline_rows=tables.pipeline_rows(ev), other_rows=tables.other_libraries(ev), charts=charts,
        sovereignty_summary=tables.sovereignty_summary(ev, sov), sovereignty=tables.sovereignty(ev, artifacts),
        threats=claims.threats(ev, never_run, run, failing),
        boundary=claims.boundary(claimed, not_claimed, ev, artifacts, device, never_run),
        reproducibility=tables.reproducibility(ev, artifacts),
        stages=stages, warnings=[str(w) for w in warnings],
        headline={"op": num(dig(op[1], "ratio")) if op else None,
                  "e2e": e2e["figure"].value if e2e and e2e["figure"] else None, "sovereign": sov},
        incomplete=list(finished.reasons),
    )


def _verdict(stages: list[dict], failing: list[dict], finished: completeness.Completeness) -> dict:
    """The overall verdict line: incomplete, else a failed stage or gate, else every gate held,
    else no run record."""
    if not finished.complete:
        return {"css": "fail", "text": "incomplete: " + "; ".join(finished.reasons)}
    if failing:
        return {"css": "fail", "text": "the claim does not hold as stated: "
                + "; ".join(f"{s['name']} {'failed' if s['status'] == 'failed' else 'gate failed'}"
                            + (f" ({s['reason']})" if s['reason'] else "") for s in failing)}
    if stages:
        return {"css": "pass", "text": "every stage that ran produced its evidence and every gate held"}
    return {"css": "warn", "text": "no run record (run.json) in this evidence"}


def _signing_view(signing) -> dict:
    """The signed-state box: the SigningInfo's fields plus its css class and the detail line."""
    sig = asdict(signing) if signing is not None else {"available": False, "line": "signing: not available"}
    sig["css"] = "unsigned" if not sig.get("available") else ("ephemeral" if sig.get("ephemeral") else "")
    if sig.get("available"):
        sig["detail"] = (f"DSSE envelopes (Ed25519 over the PAE) in attestations/, manifest.json signed in "
                         f"manifest.dsse.json, public key public.pem; keyid {sig.get('keyid')}. "
                         + ("The key was made for this run only: the signature proves the files were not "
                            "changed after signing (integrity), not who signed them (no identity)."
                            if sig.get("ephemeral") else ""))
    else:
        sig["detail"] = "this bundle is not signed: " + plain(sig.get("reason"), "signing not available")
    return sig


def _title(accel: str, op, vendor, e2e, sov, finished: completeness.Completeness,
           precision: str = "exact") -> str:
    """The headline: every figure names its baseline, the device is the one that ran the kernel,
    a level ratio is called level, and an end-to-end figure its Amdahl bound refutes is not
    stated. A run that did not finish has "Incomplete run" in the figures' place."""
    lead = {"pass": "Sovereign flash attention", "fail": "Non-sovereign build: flash attention"}.get(
        sov or "", "Flash attention (sovereignty not checked)")
    if precision == "fp8":  # never headlined as exact attention
        lead += f", {FP8_LABEL},"
    if not finished.complete:
        what = (", ".join(f"stage {s}" for s in finished.stages) + " left unfinished" if finished.stages
                else "partial evidence")
        return f"Incomplete run ({what}): {lead} on {accel}, no figure stated"
    return f"{lead} on {accel}: {_op_headline(op, vendor)}, {_e2e_headline(e2e)}"


def _op_headline(op, vendor) -> str:
    if not op:
        return "op speedup not measured"
    sp = op[1]
    r = num(sp.get("ratio"))
    if is_level(sp.get("ci_low"), sp.get("ci_high")):
        t = "op level with our naive path"
    elif r >= 1.0:
        t = f"{r:.1f}x op vs our naive path"
    else:
        t = f"op slower than our naive path ({r:.2f}x)"
    if vendor:
        vr, name = num(vendor.get("ratio")), baseline_name(vendor.get("baseline"))
        t += (f" (level with {name})" if is_level(vendor.get("ci_low"), vendor.get("ci_high"))
              else f" ({vr:.2f}x {name})")
    return t


def _e2e_headline(e2e) -> str:
    if not e2e:
        return "end-to-end not measured"
    fig = e2e["figure"]
    if fig is None:
        return ("end-to-end not claimed (inconsistent with the Amdahl bound)" if e2e["inconsistent"]
                else "end-to-end not claimed (no interval)")
    base = baseline_name(e2e["reference"])
    what = "end-to-end" if e2e["headline"] == "full" else "DiT loop"
    if e2e["figure_level"]:
        return f"{what} level with {base}"
    if fig.value < 1.0:
        return f"{what} slower than {base} ({fig.value:.2f}x)"
    return f"{fig.value:.2f}x {what} vs {base}"


def _abstract(ev, device, op, e2e, sov, never_run, failing, finished) -> list[str]:
    paras = []
    if not finished.complete:
        paras.append("This run did not finish: " + "; ".join(finished.reasons) + ". What it left is "
                     "kept in the bundle; nothing partial is read as a result below.")
    sov_t = {"pass": "passes the sovereignty policy (no vendor BLAS/DNN/attention library linked, "
                     "loaded or embedded)",
             "fail": "FAILS the sovereignty policy"}.get(sov or "", "was not checked for sovereignty")
    n_obj = len(linkage_files(ev))
    paras.append(f"We audit a hand-written flash-attention kernel build and measure it on {device}. "
                 f"The build ({n_obj} object(s) audited) {sov_t}.")
    bits = []
    pp = parity_passed(ev)
    if pp is not None:
        n = len(dig(ev, "parity", "shapes", default=[]))
        gates = "within the fp8 gates, not exact" if precision_of(ev) == "fp8" else ""
        bits.append(f"{'FP8 ' if gates else ''}parity against a float64 reference "
                    f"{'holds' if pp else 'FAILS'}{' (' + gates + ')' if gates and pp else ''} on {n} shape(s)")
    if op:
        s, sp = op
        bits.append(f"against our naive pre-flash path on {shape_label(s)} the {kernel_name(ev)} is "
                    + speed_phrase(sp.get("ratio"), sp.get("ci_low"), sp.get("ci_high")))
        vendor = vendor_beside(ev, s)
        if vendor:
            bits.append(f"against vendor {baseline_name(vendor.get('baseline'))} on the same shape it is "
                        + speed_phrase(vendor.get("ratio"), vendor.get("ci_low"), vendor.get("ci_high")))
    if e2e:
        preset = plain(dig(ev, "pipeline", "preset"), "")
        base = baseline_name(e2e["reference"])
        fig = e2e["figure"]
        if fig is not None:
            bits.append(f"end to end ({e2e['headline_what']}) the {preset} DiT pipeline with "
                        f"{kernel_name(ev, 'flash')} against "
                        f"{base} is " + e2e_phrase(e2e)
                        + ", consistent with the Amdahl bound from its measured attention share")
        if e2e["inconsistent"]:
            bits.append("the end-to-end " + " and ".join(k.what for k in e2e["inconsistent"])
                        + " figure" + ("s are" if len(e2e["inconsistent"]) > 1 else " is")
                        + " not claimed: inconsistent with the Amdahl bound (both figures and the likely "
                          "cause under Results)")
    if bits:
        paras.append("Measured: " + "; ".join(bits) + ".")
    if never_run:
        paras.append("Built and audited but never run here: " + ", ".join(never_run) + ".")
    if failing:
        paras.append("Stages that failed: " + ", ".join(s["name"] for s in failing)
                     + " (see Reproducibility and provenance).")
    return paras
