"""A run that did not finish: which stages and files make it incomplete, and what is set aside."""

from __future__ import annotations

from audit.report.completeness import assess, usable


def _run(**status):
    names = ("environment", "build", "linkage", "parity", "bench", "pipeline", "report")
    return {"stages": [{"name": n, "status": status.get(n, "ok")} for n in names]}


def test_a_finished_run_is_complete():
    ev = {"run": _run(), "pipeline": {"complete": True}, "bench": {}}
    c = assess(ev)
    assert c.complete and c.reasons == () and usable(ev, c) == ev


def test_the_report_stage_running_is_the_report_being_built():
    assert assess({"run": _run(report="running")}).complete
    assert assess({"run": _run(report="pending")}).complete


def test_a_run_killed_in_its_pipeline_stage():
    ev = {"run": _run(pipeline="running", report="pending"), "bench": {"shapes": []},
          "pipeline": {"complete": False, "runs": [{"attention": "naive"}]}}
    c = assess(ev)
    assert not c.complete and c.stages == ("pipeline",) and c.partial == ("pipeline",)
    assert len(c.reasons) == 1  # the partial file is named once, with its stage
    assert "stage pipeline was left running" in c.reasons[0] and "evidence/pipeline.json" in c.reasons[0]
    assert set(usable(ev, c)) == {"run", "bench"}
    assert c.to_dict()["unfinished_stages"] == ["pipeline"]


def test_pending_stages_and_the_other_libraries_of_a_stage():
    ev = {"run": _run(parity="running", bench="pending", pipeline="pending", report="pending"),
          "parity": {"passed": True}, "parity.cpu": {"passed": True}, "parityx": {}}
    c = assess(ev)
    assert c.stages == ("parity", "bench", "pipeline")
    assert c.partial == ("parity", "parity.cpu")  # not "parityx": another stem
    assert any("bench was left pending" in r for r in c.reasons)


def test_partial_evidence_without_a_run_record():
    c = assess({"pipeline": {"complete": False}, "bench": {"complete": True}})
    assert not c.complete and c.partial == ("pipeline",)
    assert c.reasons == ("evidence/pipeline.json is partial (complete: false): not read as a result",)


def test_malformed_records_are_tolerated():
    assert assess({"run": {"stages": "no"}}).complete
    assert assess({"run": {"stages": [None, 3, {"name": "bench"}]}}).complete
    assert assess({"run": []}).complete
