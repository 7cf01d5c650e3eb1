"""`parity`: the candidate against the oracle (the pre-flash naive path) and a float64 reference.

Inputs are fresh seeded random tensors (seed recorded per shape). Outputs we allocate are
NaN-filled first, so an element the kernel never wrote shows up as a NaN. Besides the model's
default scale, each shape gets a scale probe (an explicit scale != 1/sqrt(D)): a kernel that
ignores `scale` passes everything else.
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
from dataclasses import dataclass, field

from audit.errors import UsageError
from audit.evidence import metrics as M
from audit.evidence.precision import FP8_GATES
from audit.evidence.presets import Shape
from audit.evidence.selection import Backend, Selection, oracle_supports, torch_dtype

SCHEMA = "sovereign-audit.parity/1"

# rel_l2: candidate vs float64, upper bound per dtype; cosine: candidate vs oracle, lower bound;
# nonfinite: NaN + Inf elements of the candidate's output, upper bound.
DEFAULT_REL_L2 = {"fp32": 1e-4, "fp16": 2e-3, "bf16": 1e-2}
DEFAULT_COSINE = 0.99999
DEFAULT_NONFINITE = 0
GATE_NAMES = ("rel_l2", "cosine", "nonfinite")
PROBE_ROWS = 128  # query rows of the scale probe: the keys stay whole
PROBE_SCALE_FACTOR = 2.0  # probe scale = 2/sqrt(D): sharper than the default


@dataclass
class Gates:
    rel_l2: float
    cosine: float
    nonfinite: int

    def to_dict(self) -> dict:
        return {"rel_l2": self.rel_l2, "cosine": self.cosine, "nonfinite": self.nonfinite}


def _gate_value(name: str, raw) -> float:
    try:
        val = float(raw)
    except (TypeError, ValueError):
        raise UsageError(f"gate {name}: {raw!r} is not a number") from None
    if not math.isfinite(val) or val < 0:
        raise UsageError(f"gate {name}: {raw!r} must be a finite number >= 0")
    if name == "cosine" and val > 1:
        raise UsageError(f"gate cosine: {raw!r} must be <= 1")
    return val


def parse_gate_overrides(items) -> dict[str, float]:
    """`--gate NAME=VALUE` strings -> {name: value}."""
    out = {}
    for item in items or ():
        name, sep, value = str(item).partition("=")
        name = name.strip()
        if not sep or name not in GATE_NAMES:
            raise UsageError(f"malformed --gate {item!r}: expected one of "
                             f"{', '.join(GATE_NAMES)} as NAME=VALUE")
        out[name] = _gate_value(name, value.strip())
    return out


def gates_from_config(config: dict, dtype: str, precision: str = "exact") -> dict[str, float]:
    """[parity.gates] NAME = VALUE, and per dtype [parity.gates.bf16] NAME = VALUE (wins). At
    precision fp8 only [parity.gates.fp8] applies: the exact gates would fail every FP8 run."""
    section = config.get("parity", {})
    if not isinstance(section, dict):
        raise UsageError("config: [parity] must be a table")
    table = section.get("gates", {})
    if not isinstance(table, dict):
        raise UsageError("config: [parity.gates] must be a table")
    out: dict[str, float] = {}
    per_dtype = {}
    for key, val in table.items():
        if key in GATE_NAMES:
            out[key] = _gate_value(key, val)
        elif (key in DEFAULT_REL_L2 or key == "fp8") and isinstance(val, dict):
            per_dtype[key] = val
        else:
            raise UsageError(f"config: unknown key parity.gates.{key} (known: "
                             f"{', '.join(GATE_NAMES)}, or a table per dtype or for fp8)")
    if precision == "fp8":
        out = {}
    table_name = "fp8" if precision == "fp8" else dtype
    for key, val in per_dtype.get(table_name, {}).items():
        if key not in GATE_NAMES:
            raise UsageError(f"config: unknown key parity.gates.{table_name}.{key}")
        out[key] = _gate_value(key, val)
    return out


def effective_gates(dtype: str, config: dict | None = None, overrides: dict | None = None,
                    precision: str = "exact") -> Gates:
    if precision == "fp8":
        vals = FP8_GATES.to_dict()
    else:
        vals = {"rel_l2": DEFAULT_REL_L2[dtype], "cosine": DEFAULT_COSINE, "nonfinite": DEFAULT_NONFINITE}
    vals.update(gates_from_config(config or {}, dtype, precision))
    vals.update(overrides or {})
    return Gates(float(vals["rel_l2"]), float(vals["cosine"]), int(vals["nonfinite"]))


@dataclass
class GateResult:
    name: str  # rel_l2 | cosine | nonfinite | scale_rel_l2 | output | dit_rel_l2 | dit_cosine
    against: str  # reference | oracle | -
    value: float | None
    threshold: float | None
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        v = self.value if self.value is None or math.isfinite(self.value) else None
        return {"name": self.name, "against": self.against, "value": v,
                "threshold": self.threshold, "passed": self.passed, "detail": self.detail}


@dataclass
class ShapeParity:
    shape: Shape
    seed: int
    scale: float | None  # None: the default 1/sqrt(D) (passed as None, as models do)
    status: str  # passed | failed
    candidate_vs_reference: M.ErrorMetrics | None = None
    oracle_vs_reference: M.ErrorMetrics | None = None
    candidate_vs_oracle: M.ErrorMetrics | None = None
    public_vs_raw: M.ErrorMetrics | None = None  # libraries: binding output vs poisoned raw call
    scale_probe: dict | None = None
    dit_probe: dict | None = None  # precision fp8: the DiT-shaped inputs' metrics
    gates: list[GateResult] = field(default_factory=list)
    poisoned: bool = False  # True: the output was NaN-filled by us before the kernel wrote it
    oracle_poisoned: bool = False
    oracle: str = ""  # what the oracle of this shape was
    oracle_note: str = ""  # why it is not the selection's oracle, if it is not
    error: str = ""

    @property
    def failures(self) -> list[GateResult]:
        return [g for g in self.gates if not g.passed]

    def to_dict(self) -> dict:
        def md(m):
            return m.to_dict() if m is not None else None

        return {"shape": self.shape.to_dict(), "seed": self.seed, "scale": self.scale,
                "status": self.status, "poisoned": self.poisoned,
                "oracle_poisoned": self.oracle_poisoned, "oracle": self.oracle,
                "oracle_note": self.oracle_note,
                "candidate_vs_reference": md(self.candidate_vs_reference),
                "oracle_vs_reference": md(self.oracle_vs_reference),
                "candidate_vs_oracle": md(self.candidate_vs_oracle),
                "public_vs_raw": md(self.public_vs_raw),
                "scale_probe": self.scale_probe, "dit_probe": self.dit_probe, "gates": [g.to_dict() for g in self.gates],
                "error": self.error}


@dataclass
class ParityReport:
    selection: dict
    dtype: str
    device: str
    seed: int
    gates: Gates
    shapes: list[ShapeParity]
    oracle: str
    started: str
    finished: str
    torch_version: str = ""
    device_name: str = ""
    environment: dict | None = None  # environment.capture(), schema sovereign-audit.environment/1
    layout: str = "bhnd"  # how the inputs were stored: bhnd, or bnhd (strided (B,H,N,D) views)
    precision: str = "exact"  # what the candidate computed at: exact | fp8 (and its gates)

    @property
    def passed(self) -> bool:
        return all(s.status == "passed" for s in self.shapes)

    def failure_lines(self) -> list[str]:
        """One line per failed shape, naming the shape and every failed gate."""
        return [f"shape {s.shape.label}: " + "; ".join(f"{g.name} {g.detail}".strip()
                                                       for g in s.failures)
                for s in self.shapes if s.failures]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "passed": self.passed, "selection": self.selection,
                "dtype": self.dtype, "device": self.device, "device_name": self.device_name,
                "torch": self.torch_version, "seed": self.seed, "oracle": self.oracle,
                "layout": self.layout, "precision": self.precision,
                "gates": self.gates.to_dict(), "started": self.started, "finished": self.finished,
                "reference": "float64 softmax(scale QK^T)V per head in row chunks, on the device",
                "failures": self.failure_lines(), "shapes": [s.to_dict() for s in self.shapes],
                "environment": self.environment}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def is_oom(exc: BaseException) -> bool:
    """An allocation that did not fit: torch's CUDA or CPU allocator, Python's, or our naive path's
    workspace (FK_ERR_NO_MEMORY)."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError) or isinstance(exc, MemoryError):
        return True
    if getattr(exc, "status", None) == 9 or getattr(exc, "code", None) == 9:  # FK_ERR_NO_MEMORY
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text  # the latter: torch's CPU allocator


def random_inputs(shape: Shape, dtype, device: str, seed: int, layout: str = "bhnd"):
    """Seeded standard-normal q (B,H,Nq,D), k and v (B,H,Nk,D), generated on `device`.

    layout "bnhd": stored (B,N,H,D) contiguous, as video DiTs hand them over, and returned as
    (B,H,N,D) views with those strides (the kernels take strides; D stays contiguous).
    """
    import torch

    if layout not in ("bhnd", "bnhd"):
        raise UsageError(f"unknown layout {layout!r}; use bhnd or bnhd")
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    b, h, d = shape.batch, shape.heads, shape.head_dim

    def one(n):
        if layout == "bhnd":
            return torch.randn((b, h, n, d), generator=g, device=device, dtype=dtype)
        return torch.randn((b, n, h, d), generator=g, device=device, dtype=dtype).transpose(1, 2)

    return one(shape.nq), one(shape.nk), one(shape.nk)


class _CallFailed(Exception):
    pass


def _run_backend(be: Backend, q, k, v, scale) -> tuple[object, bool]:
    """(output, poisoned). Raises _CallFailed with a one-line reason."""
    import torch

    try:
        if be.writer is not None:
            out = torch.full_like(q, float("nan"))
            be.writer(q, k, v, out, scale)
            poisoned = True
        else:
            out = be.fn(q, k, v, scale=scale)
            poisoned = False
        if q.is_cuda:
            torch.cuda.synchronize(q.device)  # kernel faults surface here
    except Exception as exc:
        raise _CallFailed(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    if not isinstance(out, torch.Tensor):
        raise _CallFailed(f"returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(q.shape):
        raise _CallFailed(f"returned shape {tuple(out.shape)}, expected {tuple(q.shape)}")
    if out.device != q.device:
        raise _CallFailed(f"returned a tensor on {out.device}, inputs are on {q.device}")
    if out.dtype != q.dtype:
        raise _CallFailed(f"returned dtype {out.dtype}, inputs are {q.dtype}")
    return out, poisoned


def _free(t) -> None:
    if t.is_cuda:
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


def _eager_oracle(reason: str) -> Backend:
    return Backend("eager", lambda q, k, v, scale=None: M.eager_attention(q, k, v, scale,
                                                                          precise=True),
                   sovereign=False, about=f"torch softmax(QK^T)V in fp32, chunked ({reason})")


def parity_shape(sel: Selection, shape: Shape, dtype_name: str, gates: Gates, seed: int,
                 scale: float | None = None, layout: str = "bhnd") -> ShapeParity:

    dtype = torch_dtype(dtype_name)
    dev = sel.device
    res = ShapeParity(shape, seed, scale, "failed")
    oracle = sel.oracle if oracle_supports(sel, shape.head_dim) else _eager_oracle(
        sel.oracle_note or "our library lacks this head dim")
    try:
        q, k, v = random_inputs(shape, dtype, dev, seed, layout)
    except Exception as exc:
        if not is_oom(exc):
            raise
        reason = f"inputs do not fit in memory: {' '.join(str(exc).split())[:200]}"
        res.error = reason
        res.gates.append(GateResult("output", "-", None, None, False, f"not checked: {reason}"))
        return res
    try:
        out, res.poisoned = _run_backend(sel.primary, q, k, v, scale)
    except _CallFailed as exc:
        res.error = str(exc)
        res.gates.append(GateResult("output", "-", None, None, False, f"the candidate failed: {exc}"))
        return res
    try:
        ref_out, res.oracle_poisoned = _run_backend(oracle, q, k, v, scale)
    except _CallFailed as exc:
        # Our naive path materialises Nq x Nk per head: at N ~ 1e5 it may not fit. The chunked
        # eager path is the same computation; use it and say so, rather than skip the gate.
        res.oracle_note = f"oracle {oracle.name} failed ({exc}); torch eager used instead"
        oracle = _eager_oracle("fallback")
        _free(q)
        try:
            ref_out, res.oracle_poisoned = _run_backend(oracle, q, k, v, scale)
        except _CallFailed as exc2:
            ref_out = None
            res.error = f"oracle failed: {exc}; eager fallback failed: {exc2}"
    res.oracle = oracle.about or oracle.name
    outputs = {"candidate": out} if ref_out is None else {"candidate": out, "oracle": ref_out}
    vs_ref = M.reference_compare(q, k, v, outputs, scale)
    res.candidate_vs_reference = vs_ref["candidate"]
    res.oracle_vs_reference = vs_ref.get("oracle")
    if ref_out is not None:
        res.candidate_vs_oracle = M.compare(out, ref_out)
    del outputs, ref_out
    public = None
    if res.poisoned:
        # The output above came through the raw ABI into our buffer; bench times the public
        # binding (the torch custom op). They must compute the same thing.
        try:
            pub, _ = _run_backend(Backend("public", sel.primary.fn, True), q, k, v, scale)
            res.public_vs_raw = M.compare(pub, out)
            del pub
        except _CallFailed as exc:
            public = f"the public binding path failed: {exc}"
    del out

    cr = res.candidate_vs_reference
    nonfinite = cr.nonfinite
    g = GateResult("nonfinite", "-", float(nonfinite), float(gates.nonfinite),
                   nonfinite <= gates.nonfinite,
                   f"= {nonfinite} NaN/Inf elements ({cr.nan} NaN, {cr.inf} Inf"
                   f"{', NaN may be elements never written' if res.poisoned else ''})"
                   f" {'<=' if nonfinite <= gates.nonfinite else '>'} {gates.nonfinite}")
    res.gates.append(g)  # first: a NaN is the cause of the other failures
    res.gates.append(_upper("rel_l2", "reference", cr.rel_l2, gates.rel_l2))
    co = res.candidate_vs_oracle
    if co is None:
        res.gates.append(GateResult("cosine", "oracle", None, gates.cosine, False,
                                    f"not evaluated: {res.error}"))
    else:
        res.gates.append(_lower("cosine", "oracle", co.cosine, gates.cosine))

    if res.public_vs_raw is not None or public:
        pv = res.public_vs_raw
        if pv is None:
            res.gates.append(GateResult("public_path", "raw", None, gates.rel_l2, False, public))
        else:
            res.gates.append(_upper("public_path", "raw", pv.rel_l2, gates.rel_l2,
                                    f"(the timed binding path vs the raw ABI call, NaN {pv.nan})"))
            if pv.nonfinite:
                res.gates[-1].passed = False

    # The scale probe: a sharper, explicit scale on the first PROBE_ROWS queries.
    probe_scale = PROBE_SCALE_FACTOR / math.sqrt(shape.head_dim)
    rows = min(shape.nq, PROBE_ROWS)
    qp = q[:, :, :rows].contiguous()
    try:
        pout, _ = _run_backend(sel.primary, qp, k, v, probe_scale)
        pm = M.reference_compare(qp, k, v, {"candidate": pout}, probe_scale)["candidate"]
        res.scale_probe = {"scale": probe_scale, "nq": rows, "metrics": pm.to_dict()}
        res.gates.append(_upper("scale_rel_l2", "reference", pm.rel_l2, gates.rel_l2,
                                f"(scale probe, scale={probe_scale:.6g}, {rows} query rows)"))
    except _CallFailed as exc:
        res.scale_probe = {"scale": probe_scale, "nq": rows, "error": str(exc)}
        res.gates.append(GateResult("scale_rel_l2", "reference", None, gates.rel_l2, False,
                                    f"the candidate failed on the scale probe: {exc}"))
    if sel.precision == "fp8":
        _dit_probe(sel, shape, dtype, seed, res)
    res.status = "passed" if not res.failures else "failed"
    return res


def _dit_probe(sel: Selection, shape: Shape, dtype, seed: int, res: ShapeParity) -> None:
    """FP8 only: the first PROBE_ROWS query rows again on DiT-shaped inputs (a constant offset per
    K channel, outlier query rows: flash_kernel.fp8.dit_shaped_inputs), held to the DiT gates."""
    import torch

    from audit.evidence.precision import FP8_DIT_GATES
    from flash_kernel.fp8 import dit_shaped_inputs

    rows = min(shape.nq, PROBE_ROWS)
    g = torch.Generator(device=sel.device)
    g.manual_seed(seed)
    q, k, v = dit_shaped_inputs(shape.batch, shape.heads, rows, shape.nk, shape.head_dim, g, dtype,
                                sel.device)
    try:
        out, _ = _run_backend(sel.primary, q, k, v, None)
    except _CallFailed as exc:
        res.dit_probe = {"nq": rows, "error": str(exc)}
        res.gates.append(GateResult("dit_rel_l2", "reference", None, FP8_DIT_GATES.rel_l2, False,
                                    f"the candidate failed on DiT-shaped inputs: {exc}"))
        return
    m = M.reference_compare(q, k, v, {"candidate": out})["candidate"]
    res.dit_probe = {"nq": rows, "inputs": "dit-shaped", "metrics": m.to_dict()}
    what = f"(DiT-shaped inputs, {rows} query rows)"
    res.gates.append(_upper("dit_rel_l2", "reference", m.rel_l2, FP8_DIT_GATES.rel_l2, what))
    res.gates.append(_lower("dit_cosine", "reference", m.cosine, FP8_DIT_GATES.cosine))
    if m.nonfinite:
        res.gates[-1].passed = False


def _bad(x: float | None) -> bool:
    return x is None or not math.isfinite(x)


def _upper(name, against, value, thr, extra="") -> GateResult:
    ok = not _bad(value) and value <= thr
    shown = M.fmt_num(value, ".3e")
    return GateResult(name, against, value, thr, ok,
                      f"vs {against} = {shown} {'<=' if ok else '>'} {thr:g} {extra}".strip())


def _lower(name, against, value, thr) -> GateResult:
    ok = not _bad(value) and value >= thr
    return GateResult(name, against, value, thr, ok,
                      f"vs {against} = {M.fmt_cosine(value)} {'>=' if ok else '<'} {thr:g}")


def run_parity(selection: Selection, shapes: list[Shape], dtype: str = "fp32",
               device: str | None = None, gates: Gates | None = None, seed: int = 0,
               scale: float | None = None, progress=None,
               capture_environment: bool = True, checkpoint=None,
               layout: str = "bhnd") -> ParityReport:
    """Parity of `selection` over `shapes`; shape i uses seed `seed + i`.

    `device` must agree with the selection's (it is there so `run` can pass what it resolved).
    `progress(i, shape)` is called before each shape when given; `checkpoint(report)` after each
    one with the shapes done so far.
    """
    import torch

    if device is not None and device != selection.device:
        raise UsageError(f"run_parity: device {device} differs from the selection's "
                         f"{selection.device}")
    if dtype not in DEFAULT_REL_L2:
        raise UsageError(f"unknown dtype {dtype!r}")
    if scale is not None and (not math.isfinite(scale) or scale <= 0):
        raise UsageError(f"--scale {scale!r} must be a finite number > 0")
    if layout not in ("bhnd", "bnhd"):
        raise UsageError(f"unknown layout {layout!r}; use bhnd or bnhd")
    selection.check_shapes(shapes)
    gates = gates or effective_gates(dtype, precision=selection.precision)
    started = _now()
    results = []
    for i, shape in enumerate(shapes):
        if progress:
            progress(i, shape)
        results.append(parity_shape(selection, shape, dtype, gates, seed + i, scale, layout))
        if selection.device == "cuda":
            torch.cuda.empty_cache()
        if checkpoint:
            checkpoint(_report(selection, dtype, seed, gates, results, started, None, layout))
    from audit.evidence.environment import capture

    return _report(selection, dtype, seed, gates, results, started,
                   capture() if capture_environment else None, layout)


def _report(selection, dtype, seed, gates, results, started, env, layout) -> ParityReport:
    import torch

    name = torch.cuda.get_device_name() if selection.device == "cuda" else _cpu_name()
    oracle = (selection.oracle.about if selection.oracle else
              f"torch softmax(QK^T)V in fp32 ({selection.oracle_note})")
    return ParityReport(selection.to_dict(), dtype, selection.device, seed, gates, list(results),
                        oracle, started, _now(), torch.__version__, name, env, layout,
                        selection.precision)


def _cpu_name() -> str:
    from audit.evidence.environment import cpu_model

    return cpu_model() or sys.platform
