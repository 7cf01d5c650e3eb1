"""bench/device.sh (the named device runs) and the documents that quote its results.

The GPU runs themselves need an H100/H200; what is checked here is what can drift without one:
the entry point's list and dry run, that every run the documents name exists, that the old
per-run scripts are gone from them, that every `docs/perf.md "TITLE"` reference still finds its
entry, and that README's headline figures still appear in perf.md's current results.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVICE_SH = ROOT / "bench" / "device.sh"
PERF = ROOT / "docs" / "perf.md"
README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


def device(*args: str, cwd: Path = ROOT) -> Result:
    p = subprocess.run(["bash", str(DEVICE_SH), *args], cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    return Result(p.returncode, p.stdout, p.stderr)


def listed_runs() -> dict[str, str]:
    r = device("--list")
    assert r.rc == 0, r.err
    runs = {}
    for line in r.out.splitlines():
        name, _, desc = line.partition(" ")
        runs[name] = desc.strip()
    return runs


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "Makefile",
            ROOT / "bench" / "mma_variants.txt", ROOT / "bench" / "check_variants.py"]


def section(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i:text.index(end, i + len(start))]


# --- the entry point ---------------------------------------------------------------------------

def test_list_names_each_run_once_with_a_description():
    runs = listed_runs()
    # every measurement perf.md records came from one of these
    assert {"user-view", "research-object", "evidence", "pipeline", "all", "kernel", "survey",
            "variants", "persistent", "dims", "wide", "wide-pv"} <= set(runs)
    r = device("--list")
    assert len(r.out.splitlines()) == len(runs)  # no name twice
    for name, desc in runs.items():
        assert re.fullmatch(r"[a-z][a-z0-9-]*", name), name
        assert len(desc) > 20, (name, desc)


@pytest.mark.parametrize("name", sorted(listed_runs()) if shutil.which("bash") else [])
def test_every_listed_run_has_its_function_and_dry_run(name):
    r = device("--dry-run", name)
    assert r.rc == 0, r.err
    fn = "run_" + name.replace("-", "_")
    assert f"{fn}() {{" in r.out and f"}}  # end of {fn}" in r.out
    assert "nothing was built, run or written" in r.out


def test_dry_run_shows_the_settings_and_commands_and_writes_nothing(tmp_path):
    out = tmp_path / "uv"
    r = device("--dry-run", "user-view", f"OUT={out}", "PREBUILT=1", cwd=tmp_path)
    assert r.rc == 0, r.err
    assert f"settings given: OUT={out} PREBUILT=1" in r.out
    assert f"  OUT={out}" in r.out and "  PREBUILT=1" in r.out
    assert "  BUDGET_S (unset)" in r.out          # a knob the run reads, with its state
    assert "runs it starts: kernel" in r.out      # the sanitizers go through the kernel run
    assert "sovereign-audit bench --preset dit" in r.out or "--preset dit" in r.out
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, words", [
    ((), "no run named"),
    (("no-such-run",), "no run named no-such-run"),
    (("--frobnicate",), "unknown option --frobnicate"),
    (("dims", "not an assignment"), "is not VAR=VALUE"),
    (("--dry-run", "dims", "1X=2"), "is not VAR=VALUE"),
    (("no\x1b[31mrun",), "no run named $'no\\E[31mrun'"),   # escaped for the terminal
])
def test_usage_errors_are_one_line_and_exit_2(args, words):
    r = device(*args)
    assert r.rc == 2
    assert r.out == ""
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], r.err
    assert "\x1b" not in r.err


# --- the documents -----------------------------------------------------------------------------

def test_every_run_a_document_names_exists():
    runs = set(listed_runs())
    named = set()
    for doc in documents():
        for m in re.finditer(r"bench/device\.sh\s+(?:--dry-run\s+)?([a-z][a-z0-9-]*)", doc.read_text()):
            named.add((doc.name, m.group(1)))
    assert named, "no document names a run"
    assert {n for _, n in named} <= runs, sorted(n for n in named if n[1] not in runs)


def test_perf_md_reproducing_table_names_only_runs_that_exist():
    # a subset, not equality: adding a run stays a change in bench/device.sh alone
    text = section(PERF.read_text(), "## Reproducing", "## What was tried")
    table = set(re.findall(r"^\| `([a-z][a-z0-9-]*)` \|", text, re.M))
    assert len(table) >= 12
    assert table <= set(listed_runs()), sorted(table - set(listed_runs()))


def _documented_commands(text: str) -> list[str]:
    """The `bash bench/device.sh ...` commands of a document's sh blocks, continuation lines joined."""
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if "bash bench/device.sh " in line:
                cmds.append(line)
    return cmds


def test_every_documented_command_is_a_valid_invocation():
    cmds = _documented_commands(PERF.read_text())
    assert len(cmds) >= 4
    for cmd in cmds:
        if "--list" in cmd or "--dry-run" in cmd:
            dry = cmd
        else:
            dry = cmd.replace("bash bench/device.sh ", "bash bench/device.sh --dry-run ", 1)
        p = subprocess.run(["bash", "-c", dry], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stderr == "", (cmd, p.stderr)


def test_the_old_per_run_scripts_are_gone():
    assert sorted(p.name for p in (ROOT / "bench").glob("device_*.sh")) == []
    for doc in documents():
        hits = re.findall(r"device_[a-z_]+\.sh", doc.read_text())
        assert hits == [], (doc.name, hits)


def _labels(perf: str) -> list[str]:
    """Headings and the bold names that open a list item: what a reference may name."""
    found = re.findall(r"^#+ (.+)$", perf, re.M) + re.findall(r"^- \*\*(.+?)\*\*", perf, re.M)
    return [" ".join(t.split()) for t in found]


def test_every_reference_to_a_perf_md_entry_finds_it():
    labels = _labels(PERF.read_text())
    sources = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "audit").rglob("*.py"))]
    refs = []
    for src in sources:
        text = src.read_text()
        for m in re.finditer(r'docs/perf\.md`?,?\s*"([^"]+)"(?:\s+and\s+"([^"]+)")?', text):
            refs += [(src.name, " ".join(t.split())) for t in m.groups() if t]
    assert len(refs) > 20   # kernel.md alone names about twenty entries
    missing = [r for r in refs if not any(label.startswith(r[1]) for label in labels)]
    assert missing == []


def _headline_figures(readme: str) -> list[str]:
    part = section(readme, "## What has been measured", "## Exit codes")
    bullets = re.split(r"\n- ", part)
    # the seed's own figures are quoted from its note, not measured here (README says so)
    kept = [b for b in bullets if "not re-measured" not in b]
    text = " ".join(" ".join(kept).split())
    figures = []
    for f in re.findall(r"\[\d+\.\d+, \d+\.\d+\]|\d+\.\d+(?:-\d+\.\d+)?x?|\b\d{2,4}\b", text):
        # a ratio "1.07x" is a table's "1.07"; a range "1.14-1.20x" is two cells, its ends
        figures += f.rstrip("x").split("-") if not f.startswith("[") else [f]
    return figures


def test_readme_headline_figures_are_in_perf_md_current_results():
    current = " ".join(section(PERF.read_text(), "## Current results", "## Reproducing").split())
    figures = _headline_figures(README.read_text())
    assert len(figures) > 60
    missing = sorted({f for f in figures
                      if not re.search(r"(?<![\d.])" + re.escape(f) + r"(?![\d])", current)})
    assert missing == []


def test_readme_names_the_run_its_figures_come_from():
    part = section(README.read_text(), "## What has been measured", "## Exit codes")
    m = re.search(r'"The\s+default libraries in one run",\s+(\d{4}-\d\d-\d\d \d\d:\d\d) UTC', part)
    assert m, "README no longer names the run its figures come from"
    current = section(PERF.read_text(), "## Current results", "## Reproducing")
    assert f"{m.group(1)}-" in current or f"{m.group(1)} " in current
