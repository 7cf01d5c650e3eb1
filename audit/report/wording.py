"""Wording: numbers and evidence strings turned into the report's phrases.

A ratio of times is never called a speedup when it is a slowdown or a tie (`speed_phrase`), and
`plain` flattens any untrusted string to one line (the template escapes it).
"""

from __future__ import annotations

import math

# Targets and what running them would need (for "built, never run").
NEVER_RUN_WHY = {
    "gfx": "no AMD GPU is available to this project: built and audited only",
    "sm_": "an NVIDIA target: not run on this machine",
}


def num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def times(x, digits: int = 2) -> str:
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


def is_level(lo, hi) -> bool:
    """A ratio whose 95% interval spans 1.0: no difference shown either way."""
    lo, hi = num(lo), num(hi)
    return lo is not None and hi is not None and lo <= 1.0 <= hi


def speed_phrase(ratio, lo=None, hi=None) -> str:
    """A ratio of times in words that never calls a slowdown or a tie a speedup: an interval
    spanning 1.0 is "level", never "1.0x faster"."""
    r, lo, hi = num(ratio), num(lo), num(hi)
    if r is None:
        return "not measured"
    ci = f" (95% CI {lo:.2f}x to {hi:.2f}x)" if lo is not None and hi is not None else ""
    if is_level(lo, hi):
        return f"level: {r:.2f}x{ci}, no difference shown"
    return (f"{r:.2f}x faster" if r >= 1.0 else f"slower: {r:.2f}x") + ci


def e2e_phrase(e2e: dict) -> str:
    """The end-to-end figure in words: speed_phrase, except that a figure within the gate's noise
    allowance of 1.0 (readers.pipeline_speedup's "figure_level") is level too."""
    fig = e2e["figure"]
    if e2e["figure_level"] and not is_level(fig.low, fig.high):
        return (f"level within the {100 * e2e['tolerance']:.0f}% noise allowance: {fig.value:.2f}x "
                f"(95% CI {fig.low:.2f}x to {fig.high:.2f}x)")
    return speed_phrase(fig.value, fig.low, fig.high)


# What the title and sentences call each baseline a ratio is taken against.
BASELINE_NAMES = {"naive": "our naive path", "eager": "torch eager", "sdpa": "SDPA (default dispatch)",
                  "sdpa-flash": "SDPA-flash", "sdpa-cudnn": "SDPA-cuDNN", "sdpa-efficient": "SDPA-efficient",
                  "sdpa-math": "SDPA-math", "flash": "our flash kernel"}


def baseline_name(name) -> str:
    return BASELINE_NAMES.get(str(name), plain(name, "an unnamed baseline"))


# PyTorch's raw error when a forced SDPA backend has no kernel for the device or inputs.
_NO_SDPA_KERNEL = "No viable backend for scaled_dot_product_attention"


def short_reason(reason, limit: int = 160) -> str:
    """A skip reason as a short clean line (evidence may carry a library's raw error text)."""
    text = plain(reason, "")
    if _NO_SDPA_KERNEL in text:
        return "not available: this PyTorch has no kernel of this backend for these inputs"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain(x, default: str = "not recorded") -> str:
    if x is None or x == "" or x == []:
        return default
    if isinstance(x, (list, tuple)):
        return ", ".join(str(v) for v in x)
    return " ".join(str(x).split())


def seconds(x) -> str:
    v = num(x)
    return "n/a" if v is None else f"{v:.3g} s"


def percent(x) -> str:
    v = num(x)
    return "n/a" if v is None else f"{100 * v:.1f}%"


def metrics_line(m: dict) -> str:
    return (f"cosine {fmt_cos(m.get('cosine'))}, rel L2 {sci(m.get('rel_l2'))}, PSNR "
            f"{'n/a' if num(m.get('psnr_db')) is None else format(num(m.get('psnr_db')), '.1f') + ' dB'}")


def precision_of(ev: dict) -> str:
    """"fp8" when any evidence of the run was measured at precision fp8 (the run record, parity,
    bench or the pipeline say so), else "exact". One FP8 stage makes the whole report FP8: its
    figures must never be read as exact attention's."""
    found = [ev.get("run"), ev.get("parity"), ev.get("bench")]
    pipe = ev.get("pipeline")
    found.append(pipe.get("config") if isinstance(pipe, dict) else None)
    for d in found:
        if isinstance(d, dict) and (d.get("precision") == "fp8"
                                    or (isinstance(d.get("selection"), dict)
                                        and d["selection"].get("precision") == "fp8")):
            return "fp8"
    return "exact"


FP8_LABEL = "FP8 (quantized, not exact)"


def kernel_name(ev: dict, exact: str = "flash forward") -> str:
    """What the measured kernel is called in a sentence: the FP8 one is always labelled so."""
    return f"{FP8_LABEL} {exact}" if precision_of(ev) == "fp8" else exact


def finding_text(x: dict) -> str:
    t = f"[{plain(x.get('rule'), '?')}] {plain(x.get('kind'), '')} {plain(x.get('subject'), '')} ({plain(x.get('where'), '')})"
    if x.get("in_file"):
        t += f" in {plain(x.get('in_file'))}"
    chain = x.get("chain")
    if isinstance(chain, list) and len(chain) > 1:
        t += " via " + " -> ".join(str(c) for c in chain)
    if x.get("reason"):
        t += f": {plain(x.get('reason'))}"
    if x.get("use_instead"):
        t += f" (use instead: {plain(x.get('use_instead'))})"
    if x.get("excepted"):
        t += f" [waived: {plain(x.get('excepted'))}]"
    if x.get("severity") == "warn":
        t += " [warning]"
    return t
