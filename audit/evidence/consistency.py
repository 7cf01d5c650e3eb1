"""Does a measured end-to-end speedup agree with what the attention measurement predicts?

Amdahl's law bounds the speedup of a program of which only a share p gets s_op times faster:
1 / ((1 - p) + p / s_op). The pipeline measures p (the reference's attention share) and s_op (the
per-call core time ratio) in instrumented steps, and the speedup itself from the timed steps. The
two are independent measurements of one effect; when the measured interval and the predicted one
lie apart by more than the noise allows, at least one of them carries something other than
attention (a cold start paid by one core, load from another process during one core's turns), and
the measured figure must not be claimed.

The DiT+VAE prediction counts the VAE decode as unchanged time: its share of the whole
generation is p * D / (D + V), with D the reference's DiT loop time and V the decode time.

Pure Python: no torch, no numpy. The bootstrap of the op speedup lives in stats.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# What the measured and predicted intervals may lie apart, relative, and still agree. Both
# intervals already carry their own sampling noise; this allows for what neither can: the
# attention share comes from one instrumented step, and the core timers add their own overhead.
TOLERANCE = 0.10

CONSISTENT = "consistent"
INCONSISTENT = "inconsistent"
NOT_CHECKED = "not checked"
PHRASE = "inconsistent with the Amdahl bound"


def amdahl(p: float, s_op: float) -> float:
    """Whole-program speedup when a share p of the time gets s_op times faster (nan if undefined)."""
    if not (_finite(p) and _finite(s_op)) or not (0 <= p <= 1) or s_op <= 0:
        return float("nan")
    return 1.0 / ((1.0 - p) + p / s_op)


def share_with_fixed_time(p: float, loop_s: float, fixed_s: float) -> float:
    """The attention share of loop + fixed time, when the loop's share is p and `fixed_s` (the
    VAE decode) does not change with the core."""
    if not (_finite(p) and _finite(loop_s) and _finite(fixed_s)) or loop_s <= 0 or fixed_s < 0:
        return float("nan")
    return p * loop_s / (loop_s + fixed_s)


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    @property
    def known(self) -> bool:
        return all(_finite(x) for x in (self.value, self.low, self.high))

    def to_dict(self) -> dict:
        return {"value": _round(self.value), "low": _round(self.low), "high": _round(self.high)}


def predicted_interval(p: float, op: Interval) -> Interval:
    """Amdahl's prediction over the op speedup's interval (it rises with s_op, so the ends map
    to the ends)."""
    return Interval(amdahl(p, op.value), amdahl(p, op.low), amdahl(p, op.high))


@dataclass(frozen=True)
class Consistency:
    """One comparison (`what`: "DiT loop" or "DiT loop + VAE decode") of measured and predicted."""

    what: str
    measured: Interval
    predicted: Interval
    verdict: str  # consistent | inconsistent | not checked
    cause: str = ""  # the likely cause of a disagreement, or why it was not checked
    tolerance: float = TOLERANCE

    @property
    def inconsistent(self) -> bool:
        return self.verdict == INCONSISTENT

    def sentence(self) -> str:
        """Both figures side by side, in the words the report uses."""
        m, p = self.measured, self.predicted
        figures = (f"measured {m.value:.2f}x (95% CI {m.low:.2f}x to {m.high:.2f}x), Amdahl "
                   f"predicted {p.value:.2f}x ({p.low:.2f}x to {p.high:.2f}x)") if m.known and p.known else ""
        if self.verdict == INCONSISTENT:
            return f"{self.what}: {figures}: {PHRASE}; likely cause: {self.cause}"
        if self.verdict == CONSISTENT:
            return f"{self.what}: {figures}: consistent with the Amdahl bound"
        return f"{self.what}: consistency with the Amdahl bound not checked ({self.cause})"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["measured"], d["predicted"] = self.measured.to_dict(), self.predicted.to_dict()
        d["rule"] = (f"inconsistent when the measured 95% CI and the predicted interval, widened by "
                     f"{100 * self.tolerance:.0f}% each way, do not overlap"
                     + (", or when the DiT loop it contains is inconsistent" if self.what == "DiT loop + VAE decode"
                        else ""))
        return d


def check(what: str, measured: Interval, predicted: Interval, tolerance: float = TOLERANCE,
          cause_above: str = "", cause_below: str = "") -> Consistency:
    """Compares the intervals; `cause_above` / `cause_below` name the likely cause when the
    measured speedup lies above / below the prediction (a generic one when empty)."""
    if not measured.known:
        return Consistency(what, measured, predicted, NOT_CHECKED, "no measured interval", tolerance)
    if not predicted.known:
        return Consistency(what, measured, predicted, NOT_CHECKED,
                           "no attention share or op speedup was measured", tolerance)
    lo = min(predicted.low, predicted.high) / (1.0 + tolerance)
    hi = max(predicted.low, predicted.high) * (1.0 + tolerance)
    if measured.low > hi:
        return Consistency(what, measured, predicted, INCONSISTENT, cause_above or (
            "the reference's time grew for a reason other than attention (a cold start or another "
            "process's load during its turns)"), tolerance)
    if measured.high < lo:
        return Consistency(what, measured, predicted, INCONSISTENT, cause_below or (
            "the candidate's time grew for a reason other than attention (another process's load "
            "during its turns), or the instrumented step overstated the attention share"), tolerance)
    return Consistency(what, measured, predicted, CONSISTENT, "", tolerance)


def check_dit(measured: Interval, p: float, op: Interval, tolerance: float = TOLERANCE) -> Consistency:
    """The DiT loop's measured speedup against Amdahl from the share p and the op speedup."""
    return check("DiT loop", measured, predicted_interval(p, op), tolerance)


def check_dit_vae(measured: Interval, p: float, op: Interval, dit_s: float, vae_ref_s: float,
                  vae_core_s: float, tolerance: float = TOLERANCE,
                  dit: Consistency | None = None) -> Consistency:
    """DiT loop + VAE decode against Amdahl with the decode as unchanged time. `dit_s` is the
    reference's DiT loop; the decode counted is the mean of the two cores' decodes (the same work);
    when they differ beyond the tolerance, that is named as the likely cause.

    `dit`: the check of the DiT loop this figure contains. When the bound refutes the loop, the
    whole is refuted too: the decode's spread can widen the whole's interval until it reaches the
    prediction, but the loop inside it still carries something other than attention."""
    vae = (vae_ref_s + vae_core_s) / 2 if _finite(vae_ref_s) and _finite(vae_core_s) else float("nan")
    predicted = predicted_interval(share_with_fixed_time(p, dit_s, vae), op)
    decode_differs = (_finite(vae_ref_s) and _finite(vae_core_s) and min(vae_ref_s, vae_core_s) > 0
                      and max(vae_ref_s, vae_core_s) / min(vae_ref_s, vae_core_s) > 1.0 + tolerance)
    decode = (f"the VAE decode, the same work for every core, took {vae_ref_s:.3g} s for the reference "
              f"and {vae_core_s:.3g} s for the candidate: its timing, not attention, moved the figure"
              if decode_differs else "")
    whole = check("DiT loop + VAE decode", measured, predicted, tolerance,
                  cause_above=decode if decode and vae_ref_s > vae_core_s else "",
                  cause_below=decode if decode and vae_core_s > vae_ref_s else "")
    if dit is not None and dit.inconsistent and whole.verdict == CONSISTENT:
        return Consistency(whole.what, measured, predicted, INCONSISTENT,
                           f"it contains the DiT loop, which its Amdahl bound refutes ({dit.cause})", tolerance)
    return whole


def level(low: float | None, high: float | None) -> bool:
    """A ratio whose interval spans 1.0 is level: no difference was shown either way."""
    return low is not None and high is not None and _finite(low) and _finite(high) and low <= 1.0 <= high


def level_within_noise(measured: Interval, tolerance: float = TOLERANCE) -> bool:
    """An end-to-end ratio is level when its interval, widened by the same allowance the gate
    gives for what the intervals cannot carry, spans 1.0: a 4% difference the decode's timing
    can make on its own (the same work for every core) is no difference shown."""
    return measured.known and level(measured.low / (1.0 + tolerance), measured.high * (1.0 + tolerance))


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _round(x: float, nd: int = 4) -> float | None:
    return round(float(x), nd) if _finite(x) else None
