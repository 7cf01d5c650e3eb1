"""Did the run that wrote this evidence finish? Partial evidence is never read as a result.

A run stopped part-way (killed, out of time, the machine gone) leaves run.json with a stage still
"running" or "pending", and a stage's evidence file may hold what was checkpointed so far
(pipeline.json with `complete: false`). Such a run's verdict is "incomplete": the report says so
in the title's place, `report` exits 1, and the partial files are set aside, never shown as
measurements. The report stage itself is exempt: it is the one running while the report is built.

Pure: works on the loaded evidence dict ({stem: parsed JSON}).
"""

from __future__ import annotations

from dataclasses import dataclass, field

UNFINISHED = ("running", "pending")
# Evidence stem of each stage whose file a stopped run can leave half-written.
STAGE_EVIDENCE = {"environment": "environment", "build": "build", "linkage": "linkage",
                  "parity": "parity", "bench": "bench", "pipeline": "pipeline"}


@dataclass(frozen=True)
class Completeness:
    reasons: tuple[str, ...] = ()  # one line per thing that did not finish
    partial: tuple[str, ...] = ()  # evidence stems set aside as partial
    stages: tuple[str, ...] = field(default=())  # stages left running or pending

    @property
    def complete(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict:
        return {"complete": self.complete, "reasons": list(self.reasons), "partial": list(self.partial),
                "unfinished_stages": list(self.stages)}


def assess(ev: dict) -> Completeness:
    """What in `ev` did not finish: stages of run.json left running/pending (the report stage
    aside) and evidence that says it is partial (`complete: false`), or belongs to such a stage."""
    reasons: list[str] = []
    partial: list[str] = []
    stages: list[str] = []
    run = ev.get("run")
    records = run.get("stages") if isinstance(run, dict) else None
    for s in records if isinstance(records, list) else []:
        if not isinstance(s, dict) or s.get("name") == "report":
            continue
        name, status = str(s.get("name")), s.get("status")
        if status in UNFINISHED:
            stages.append(name)
            stem = STAGE_EVIDENCE.get(name)
            # its own file and those of the other libraries it checked (parity.cpu.json, ...)
            held = sorted(k for k in ev if stem is not None and (k == stem or k.startswith(stem + ".")))
            reasons.append(f"stage {name} was left {status}: the run stopped before it finished"
                           + (f" (its partial evidence, {', '.join(f'evidence/{k}.json' for k in held)}, "
                              "is not read as a result)" if held else ""))
            partial += held
    for stem in sorted(ev):
        data = ev[stem]
        if stem in partial or not isinstance(data, dict) or data.get("complete") is not False:
            continue
        partial.append(stem)
        reasons.append(f"evidence/{stem}.json is partial (complete: false): not read as a result")
    return Completeness(tuple(reasons), tuple(partial), tuple(stages))


def usable(ev: dict, c: Completeness | None = None) -> dict:
    """`ev` without the partial evidence (what the report may read as results)."""
    c = c or assess(ev)
    return {k: v for k, v in ev.items() if k not in c.partial}
