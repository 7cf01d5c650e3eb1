"""report.html in a real browser: Debian's headless chromium renders it, takes a screenshot, sees the
key sections, and logs no console error (a control page proves the console check can fail)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_report_fixtures import parse_html, require_cpu_run, tmpdir

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
SECTIONS = ["Abstract", "Contribution", "Methods", "Results", "Figures", "Sovereignty", "Threats to validity",
            "Claim boundary", "Reproducibility and provenance"]


def chromium() -> str:
    path = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if not path:
        pytest.skip("chromium not installed (make test installs Debian's chromium)")
    return path


def render(page: Path, work: Path, *mode: str) -> tuple[str, str]:
    """(stdout, console lines) of one headless chromium run over a local file."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={work / 'profile'}", "--enable-logging=stderr", "--v=0", *mode,
           page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines()
               if ":CONSOLE" in ln or "Uncaught" in ln or "Refused to" in ln or "Content Security Policy" in ln]
    return proc.stdout, console


def test_screenshot_of_the_report(tmp_path):
    page = require_cpu_run() / "report.html"
    shot = tmp_path / "shot.png"
    _, console = render(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 2400)
    assert len(data) > 50_000  # a rendered page, not a blank one
    assert console == []


def test_dom_has_the_key_sections_and_no_console_errors(tmp_path):
    page = require_cpu_run() / "report.html"
    dom, console = render(page, tmp_path, "--dump-dom")
    assert console == [], console
    headings = re.findall(r"<h2>(.*?)</h2>", dom)
    assert headings == SECTIONS
    title = re.search(r'<h1 id="title">(.*?)</h1>', dom).group(1)
    assert title.startswith("Sovereign flash attention on ")
    tags = {t for t, _ in parse_html(dom).tags}
    assert "svg" in tags and "script" not in tags and "img" not in tags


def test_console_check_catches_errors_on_a_control_page(tmp_path):
    # The same report with an injected script and an external image: CSP blocks both and the
    # browser logs it; the plain console.error page logs directly. Either way the check fires.
    html = (require_cpu_run() / "report.html").read_text()
    bad = tmpdir("browser-control") / "bad.html"
    bad.write_text(html.replace("</body>", '<img src="http://127.0.0.1:9/x.png"><script>console.error("x")</script></body>'))
    _, console = render(bad, tmp_path / "a", "--dump-dom")
    assert any("Content Security Policy" in ln for ln in console), console
    plain = tmpdir("browser-control") / "plain.html"
    plain.write_text("<!DOCTYPE html><title>t</title><script>console.error('probe-7');nope()</script>")
    _, console = render(plain, tmp_path / "b", "--dump-dom")
    assert any("probe-7" in ln for ln in console) and any("Uncaught" in ln for ln in console)
