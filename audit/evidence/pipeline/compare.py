"""Each core against the reference: parity, measured speedups, Amdahl's prediction, consistency."""

from __future__ import annotations

from audit.evidence.dit_attention import SWAPS
from audit.evidence.pipeline.results import Comparison, PipelineReport


def comparison_of(report: PipelineReport, name: str) -> Comparison:
    c = report.comparison(name)
    if c is None:
        c = Comparison(name, report.reference)
        report.comparisons.append(c)
    return c


def fill_comparison(report: PipelineReport, name: str, latents_of: dict, metrics) -> None:
    from audit.evidence import consistency as K
    from audit.evidence.stats import bootstrap_ratio_ci, bootstrap_total_ratio_ci

    ref, run = report.run(report.reference), report.run(name)
    c = comparison_of(report, name)
    c.latents = metrics.compare(latents_of[name], latents_of[report.reference]).to_dict()
    dit = full = op = None
    if ref.step_s and run.step_s:
        ci = bootstrap_total_ratio_ci([(ref.step_s, "sum")], [(run.step_s, "sum")])
        c.speedup_dit, c.speedup_dit_ci = ci.ratio, ci.to_dict()
        dit = K.Interval(ci.ratio, ci.low, ci.high)
    if ref.dit_plus_vae_s and run.dit_plus_vae_s:
        ci = bootstrap_total_ratio_ci([(ref.step_s, "sum"), (ref.vae_decode_samples_s, "median")],
                                      [(run.step_s, "sum"), (run.vae_decode_samples_s, "median")], seed=1)
        c.speedup_dit_vae, c.speedup_dit_vae_ci = ci.ratio, ci.to_dict()
        full = K.Interval(ci.ratio, ci.low, ci.high)
    if ref.instrumented and run.instrumented and run.instrumented.attention_ms_per_call_median > 0:
        p = ref.instrumented.share
        ref_kinds, run_kinds = ref.instrumented.attention_ms_by_kind, run.instrumented.attention_ms_by_kind
        if len(ref_kinds) > 1 and set(ref_kinds) == set(run_kinds):
            # Self and cross calls differ ~10x in time: the ratio of the step's summed core times
            # (what Amdahl's p is a share of), each kind of call resampled on its own.
            ci = bootstrap_total_ratio_ci([(ref_kinds[k], "sum") for k in SWAPS if k in ref_kinds],
                                          [(run_kinds[k], "sum") for k in SWAPS if k in run_kinds], seed=2)
        else:
            ci = bootstrap_ratio_ci(ref.instrumented.attention_ms_samples,
                                    run.instrumented.attention_ms_samples, seed=2)
        c.op_speedup, c.op_speedup_ci, c.reference_attention_share = ci.ratio, ci.to_dict(), p
        c.amdahl_predicted = amdahl(p, ci.ratio)
        op = K.Interval(ci.ratio, ci.low, ci.high)
    loop = None
    if dit is not None and op is not None:
        loop = K.check_dit(dit, c.reference_attention_share, op)
        c.consistency.append(loop.to_dict())
    if full is not None and op is not None:
        k = K.check_dit_vae(full, c.reference_attention_share, op, ref.dit_loop_s, ref.vae_decode_s,
                            run.vae_decode_s, dit=loop)
        c.amdahl_predicted_dit_vae = k.predicted.value
        c.consistency.append(k.to_dict())


def amdahl(p: float, s_op: float) -> float:
    """Whole-program speedup when a share p of the time gets s_op times faster."""
    from audit.evidence.consistency import amdahl as _amdahl

    return _amdahl(p, s_op)
