"""`sovereign-audit report` and the bundle: rebuilt from saved evidence, claims only with evidence,
self-contained HTML, paths that cannot leave the bundle."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import jinja2
import pytest

from test_report_fixtures import assert_inert, cli, load, require_cpu_run, tmpdir


def title_of(html: str) -> str:
    return re.search(r'<h1 id="title">(.*?)</h1>', html).group(1)


def evidence_copy(name: str, drop=(), edit=None) -> Path:
    """A copy of the real run's evidence, minus some files, optionally edited."""
    src = require_cpu_run() / "evidence"
    dst = tmpdir("evidence-" + name) / "evidence"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for d in drop:
        (dst / d).unlink()
    if edit:
        edit(dst)
    return dst


@pytest.mark.slow
def test_report_rebuilds_an_equivalent_bundle_that_verifies():
    bundle = require_cpu_run()
    out = tmpdir("rebuild") / "b"
    proc = cli("report", str(bundle / "evidence"), "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"report: {out / 'report.html'}"
    old, new = (bundle / "report.html").read_text(), (out / "report.html").read_text()
    assert title_of(new) == title_of(old)
    for p in (bundle / "evidence").iterdir():
        assert (out / "evidence" / p.name).read_bytes() == p.read_bytes()
    for p in (bundle / "artifacts").rglob("*.so"):
        assert (out / p.relative_to(bundle)).read_bytes() == p.read_bytes()
    assert cli("verify", str(out), timeout=120).returncode == 0


@pytest.mark.slow
def test_report_accepts_the_bundle_folder_itself():
    out = tmpdir("rebuild-from-bundle") / "b"
    proc = cli("report", str(require_cpu_run()), "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_no_bench_evidence_no_speed_claim():
    ev = evidence_copy("no-bench", drop=["bench.json"])
    out = tmpdir("no-bench") / "b"
    assert cli("report", str(ev), "--out", str(out), timeout=120).returncode == 0
    html = (out / "report.html").read_text()
    assert "op speedup not measured" in title_of(html)
    assert "faster than our naive" not in html and "faster than torch eager" not in html
    assert "No timing evidence in this bundle: nothing to plot." in html
    full = (require_cpu_run() / "report.html").read_text()
    assert "faster than our naive" in full or "A speedup over our naive path" in full  # the control


@pytest.mark.slow
def test_no_linkage_evidence_no_sovereignty_claim():
    ev = evidence_copy("no-linkage", drop=["linkage.json"])
    out = tmpdir("no-linkage") / "b"
    assert cli("report", str(ev), "--out", str(out), timeout=120).returncode == 0
    html = (out / "report.html").read_text()
    assert title_of(html).startswith("Flash attention (sovereignty not checked) on ")
    assert "links, loads or embeds a vendor" not in html
    assert "No linkage evidence: no object was audited." in html


@pytest.mark.slow
def test_failed_parity_evidence_is_reported_as_such():
    def fail_first_shape(d: Path):
        p = json.loads((d / "parity.json").read_text())
        p["passed"] = False
        p["shapes"][0]["status"] = "failed"
        p["failures"] = ["shape tiny-128: rel_l2 vs reference = 1.0e-02 > 0.0001"]
        (d / "parity.json").write_text(json.dumps(p))

    ev = evidence_copy("parity-failed", edit=fail_first_shape)
    out = tmpdir("parity-failed") / "b"
    assert cli("report", str(ev), "--out", str(out), timeout=120).returncode == 0
    html = (out / "report.html").read_text()
    assert "matches a float64 reference" not in html
    assert "rel_l2 vs reference = 1.0e-02 &gt; 0.0001" in html


def test_rendered_claims_drops_claims_without_evidence():
    from audit.report.claims import Claim, rendered_claims

    claims = [Claim("backed", ["evidence/bench.json"]), Claim("unbacked", []), Claim("blank", [""])]
    assert [c.text for c in rendered_claims(claims)] == ["backed"]


@pytest.mark.slow
def test_report_html_is_one_inert_self_contained_file():
    bundle = require_cpu_run()
    html = (bundle / "report.html").read_text()
    assert_inert(html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert "<style>" in html and "<svg" in html  # CSS and figures inline
    for section in ("abstract", "contribution", "methods", "results", "figures", "sovereignty", "threats",
                    "claim-boundary", "reproducibility"):
        assert f'<section id="{section}">' in html


@pytest.mark.slow
def test_methods_and_provenance_record_what_the_seed_left_unrecorded():
    bundle = require_cpu_run()
    html = (bundle / "report.html").read_text()
    env = load(bundle / "evidence" / "environment.json")
    build = load(bundle / "evidence" / "build.json")
    assert env["torch"]["version"] in html
    cpu = [t for t in build["targets"] if t["target"] == "cpu"][0]
    assert cpu["sha256"] in html
    assert "not recorded" not in html.split('id="reproducibility"')[1].split("Stages of this run")[0]
    for t in build["targets"]:
        if t["status"] == "built":
            assert t["provenance"]["compiler"]["version"] in html


def test_malformed_evidence_exits_3_in_one_line():
    ev = tmpdir("malformed") / "evidence"
    ev.mkdir(exist_ok=True)
    (ev / "bench.json").write_text('{"schema": "sovereign-audit.bench/1", ')
    proc = cli("report", str(ev), "--out", str(tmpdir("malformed-out") / "b"), timeout=60)
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "bench.json" in proc.stderr


@pytest.mark.parametrize("content", ["[1, 2]", '{"schema": 7}'])
def test_evidence_of_the_wrong_shape_exits_3(content):
    ev = tmpdir("wrong-shape-" + str(len(content))) / "evidence"
    ev.mkdir(exist_ok=True)
    (ev / "parity.json").write_text(content)
    proc = cli("report", str(ev), "--out", str(tmpdir("wrong-shape-out") / f"b{len(content)}"), timeout=60)
    assert proc.returncode == 3 and proc.stderr.startswith("error: ")


def test_empty_or_missing_evidence_folder_exits_3():
    empty = tmpdir("empty-evidence")
    assert cli("report", str(empty), "--out", str(tmpdir("e-out") / "b"), timeout=60).returncode == 3
    assert cli("report", str(empty / "nope"), "--out", str(tmpdir("e-out") / "c"), timeout=60).returncode == 3


@pytest.mark.slow
def test_report_out_that_is_not_a_bundle_is_refused():
    out = tmpdir("report-not-bundle")
    (out / "mine.txt").write_text("x")
    proc = cli("report", str(require_cpu_run() / "evidence"), "--out", str(out), timeout=60)
    assert proc.returncode == 2 and "not a sovereign-audit bundle" in proc.stderr
    assert (out / "mine.txt").read_text() == "x"


# --- bundle paths cannot leave the output folder ------------------------------------------------

@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../b", "a//b", "", "..", "C:/x", "a/\x00b"])
def test_safe_join_refuses_escaping_names(tmp_path, rel):
    from audit.errors import InputError
    from audit.report.layout import safe_join

    with pytest.raises(InputError):
        safe_join(tmp_path, rel)


def test_safe_join_refuses_a_symlinked_folder_pointing_out(tmp_path):
    from audit.errors import InputError
    from audit.report.layout import safe_join

    root, outside = tmp_path / "bundle", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "artifacts")
    with pytest.raises(InputError):
        safe_join(root, "artifacts/cpu.so")
    assert safe_join(root, "evidence/x.json") == root / "evidence" / "x.json"


@pytest.mark.slow
def test_crafted_build_json_cannot_place_or_pull_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not ship me")
    victim = tmp_path / "victim"

    def craft(d: Path):
        b = json.loads((d / "build.json").read_text())
        t0 = b["targets"][0]
        b["targets"] = [dict(t0, target=f"../../{victim.name}"),  # would climb out of artifacts/
                        dict(t0, target="cpu2", library=str(secret), sha256=None)]  # not an ELF object
        (d / "build.json").write_text(json.dumps(b))

    ev = evidence_copy("crafted", edit=craft)
    out = tmp_path / "out"
    proc = cli("report", str(ev), "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not victim.exists()
    assert "unsafe name" in proc.stderr and "not an ELF object" in proc.stderr
    assert not [p for p in out.rglob("*") if p.is_file() and p.read_bytes() == b"do not ship me"]
    inside = out.resolve()
    assert all(inside in p.resolve().parents for p in out.rglob("*"))


# --- the renderer -------------------------------------------------------------------------------

def test_autoescape_is_on_and_undefined_is_strict():
    from audit.report.render import TEMPLATE, environment

    env = environment()
    assert env.autoescape(TEMPLATE) is True
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    with pytest.raises(jinja2.UndefinedError):
        env.get_template(TEMPLATE).render()


def test_templates_never_bypass_escaping():
    root = Path(__file__).resolve().parents[1] / "templates"
    for p in root.glob("*.j2"):
        text = p.read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text, p
    src = Path(__file__).resolve().parents[1] / "audit" / "report"
    for name in sorted(p.name for p in src.glob("*.py")):
        assert "Markup(" not in (src / name).read_text(), name


def test_speedup_chart_geometry_follows_the_numbers():
    from audit.report import plots

    c = plots.speedup_chart([{"label": "a", "ratio": 1.0, "lo": 0.9, "hi": 1.1},
                             {"label": "b", "ratio": 2.0, "lo": 1.5, "hi": 2.5}])
    a, b = c.bars
    assert b.w == pytest.approx(2 * a.w)
    assert c.ref_x == pytest.approx(a.x + a.w)  # the 1.0 line sits at the end of the ratio-1 bar
    per_unit = a.w / 1.0
    assert b.lo_x == pytest.approx(b.x + 1.5 * per_unit) and b.hi_x == pytest.approx(b.x + 2.5 * per_unit)
    assert c.ticks[-1].x == pytest.approx(plots.LABEL_W + plots.PLOT_W)
    assert plots.speedup_chart([{"label": "nan", "ratio": float("nan")}]) is None


def test_speed_phrase_never_calls_a_slowdown_or_a_tie_a_speedup():
    from audit.report.wording import speed_phrase

    assert speed_phrase(0.64) == "slower: 0.64x"
    # an interval spanning 1.0 is level, never "1.0x faster"
    assert speed_phrase(1.13, 0.62, 1.31) == "level: 1.13x (95% CI 0.62x to 1.31x), no difference shown"
    assert speed_phrase(1.02, 1.0, 1.04).startswith("level: 1.02x")
    assert speed_phrase(1.5, 1.2, 1.8) == "1.50x faster (95% CI 1.20x to 1.80x)"
    assert speed_phrase(0.5, 0.4, 0.6) == "slower: 0.50x (95% CI 0.40x to 0.60x)"
    assert speed_phrase(None) == "not measured"


@pytest.mark.slow
def test_without_the_signing_modules_the_bundle_says_unsigned(monkeypatch, tmp_path):
    import sys

    import audit.report
    from audit.report.bundle import write_bundle

    import audit.signing

    for name in ("attest", "manifest"):
        monkeypatch.setitem(sys.modules, f"audit.report.{name}", None)
        monkeypatch.delattr(audit.report, name, raising=False)
    monkeypatch.setitem(sys.modules, "audit.signing.keys", None)
    monkeypatch.delattr(audit.signing, "keys", raising=False)
    result = write_bundle(require_cpu_run() / "evidence", tmp_path / "b")
    html = result.report.read_text()
    assert "signing: not available" in html and "ephemeral key" not in html
    assert result.manifest is None and not (tmp_path / "b" / "manifest.json").exists()
    assert result.signing.available is False
