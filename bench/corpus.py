"""The real-world corpus: download named wheels from the package index, audit each with
`sovereign-audit check`, and compare what it reports with bench/corpus_expectations.toml, a
file written by hand from independent evidence (readelf, nm, objdump, cuobjdump, strings; for
Windows and macOS wheels llvm-readobj, llvm-objdump, llvm-otool, llvm-nm).

    python3 bench/corpus.py                       # every wheel, a table on stdout
    python3 bench/corpus.py --only numpy,orjson   # a subset
    python3 bench/corpus.py --write docs/corpus.md
    python3 bench/corpus.py --platform windows,macos   # the Windows and macOS wheels only

A wheel of another platform is downloaded for that platform (pip's --platform, from the wheel
file's own tags or its `platform` field), whatever machine runs the benchmark.

A finding is scored when it is the file's own evidence (the audited file itself: soname, needed,
verneed, symbols, strings, device kernels); findings reached through the tree (transitive, rpath,
a library's content under the file that loads it) are consequences of a member's own evidence,
which is scored where that member is audited, unless an expectation names them. Per (component,
mechanism): TP an expected (file, component, mechanism) reported; FN expected and not reported;
FP reported and not expected ("wrong mechanism" when the file does hold that component, but by
another mechanism). An expectation marked `gap` and a `[[wheels.tolerate]]` entry are known
misses and known wrong findings: they are still counted and shown, marked known.

An entry with `deb = "NAME=VERSION"` is a Debian package: its .deb is downloaded with
`apt-get download` (else from its `deb-url`, on a machine whose apt does not offer that version),
unpacked with `dpkg-deb -x` into CACHE/debs/, and the folder is audited; its members are named
from the package's root (usr/lib/x86_64-linux-gnu/libblis.so.4).

A note (severity warn: a library name mentioned inside text, a name in an object that imports no
loader) is not a component's presence: it is never scored.

This is a benchmark (downloads of several GB, minutes of auditing), not a test; tests/test_corpus.py
runs a few small entries of it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import json
import os
import platform
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPECTATIONS = REPO / "bench" / "corpus_expectations.toml"
DEFAULT_CACHE = Path(os.environ.get("SOVEREIGN_AUDIT_CORPUS", "/work/cache/wheels"))
# The audited file's own evidence. transitive / unresolved / mismatch are judged where the library
# itself is audited (it is a member of the same wheel); rpath is a note (severity warn: a search
# directory the object may dlopen from), not a component's presence.
PLATFORMS = ("linux", "windows", "macos")
# A note (severity warn: a library name mentioned inside text, a name in an object that imports no
# loader) is not a component's presence and is never scored.
SCORED = {"soname", "needed", "verneed", "static-symbol", "static-string", "imported-symbol", "dlopen-string",
          "dlsym-string", "assembled-name", "device-kernel"}


@dataclass
class Expect:
    component: str  # a policy rule id
    mechanism: str  # a finding kind
    files: list[str]  # members (globs) of the wheel
    evidence: str
    gap: str | None = None  # a known miss: why the tool does not report it yet


@dataclass
class Tolerate:
    component: str
    mechanism: str
    files: list[str]
    reason: str


@dataclass
class Wheel:
    name: str
    requirement: str
    file: str
    clean: bool
    note: str
    expects: list[Expect] = field(default_factory=list)
    tolerate: list[Tolerate] = field(default_factory=list)
    index_url: str | None = None
    platform: str = "linux"  # linux | windows | macos: the binaries' format (ELF, PE, Mach-O)
    deb: str | None = None  # a Debian package, NAME=VERSION for apt-get download (file: its .deb)
    deb_url: str | None = None  # where the .deb is when apt-get cannot give that version
    pip_platform: list[str] = field(default_factory=list)  # pip --platform tags; default: the file's


def load_expectations(path: Path = EXPECTATIONS) -> list[Wheel]:
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    wheels = []
    for w in doc["wheels"]:
        wheels.append(Wheel(
            name=w["name"], requirement=w.get("requirement") or w["deb"], file=w["file"], clean=w.get("clean", False),
            note=w.get("note", ""), index_url=w.get("index-url"), platform=_platform(w),
            pip_platform=list(w.get("pip-platform", [])), deb=w.get("deb"), deb_url=w.get("deb-url"),
            expects=[Expect(e["component"], e["mechanism"], list(e["files"]), e["evidence"], e.get("gap"))
                     for e in w.get("expect", [])],
            tolerate=[Tolerate(t["component"], t["mechanism"], list(t["files"]), t["reason"])
                      for t in w.get("tolerate", [])]))
    return wheels


# ---------------------------------------------------------------- download


def fetch(wheel: Wheel, cache: Path, find_links: list[str]) -> Path:
    """The wheel's file in `cache`, downloaded with pip if it is not there yet; for a Debian
    package, the folder its .deb unpacks to (dpkg-deb -x), the .deb downloaded with apt-get
    download (else from its `deb-url`)."""
    if wheel.deb:
        return _fetch_deb(wheel, cache)
    target = cache / wheel.file
    if target.exists():
        return target
    for d in find_links:  # a local copy (e.g. a wheel from another index kept on disk)
        if (Path(d) / wheel.file).exists():
            return Path(d) / wheel.file
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(cache),
           *_target_flags(wheel.file, wheel.pip_platform), wheel.requirement]
    if wheel.index_url:
        cmd += ["--index-url", wheel.index_url]
    for d in find_links:
        cmd += ["--find-links", d]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not target.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{wheel.requirement}: pip download did not give {wheel.file}: {tail[0]}")
    return target


def _fetch_deb(wheel: Wheel, cache: Path) -> Path:
    folder = cache / "debs" / wheel.file[:-len(".deb")]
    if folder.is_dir():
        return folder
    deb = cache / "debs" / wheel.file
    deb.parent.mkdir(parents=True, exist_ok=True)
    if not deb.exists():
        try:
            proc = subprocess.run(["apt-get", "download", "-q", wheel.deb], capture_output=True, text=True,
                                  cwd=str(deb.parent))
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        except OSError as exc:
            tail = [str(exc)]
        if not deb.exists() and wheel.deb_url:
            import urllib.request
            try:
                with urllib.request.urlopen(wheel.deb_url, timeout=60) as r, open(f"{deb}.part", "wb") as fh:
                    while chunk := r.read(1 << 20):
                        fh.write(chunk)
                os.replace(f"{deb}.part", deb)
            except OSError as exc:
                tail = [f"{wheel.deb_url}: {exc}"]
        if not deb.exists():
            raise RuntimeError(f"{wheel.deb}: apt-get download did not give {wheel.file}: {tail[0]}")
    tmp = folder.with_name(folder.name + ".part")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    try:
        proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], capture_output=True, text=True)
    except OSError as exc:
        raise RuntimeError(f"{wheel.file}: dpkg-deb cannot run: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{wheel.file}: dpkg-deb -x failed: {proc.stderr.strip()}")
    tmp.rename(folder)
    return folder


def _platform(w: dict) -> str:
    """The wheel's platform: its `platform` field, else read from the file's platform tag."""
    if "platform" in w:
        if w["platform"] not in PLATFORMS:
            raise ValueError(f"{w['name']}: platform {w['platform']!r} is not one of {', '.join(PLATFORMS)}")
        return w["platform"]
    if "deb" in w:
        return "linux"
    tag = w["file"][:-len(".whl")].rsplit("-", 1)[-1]
    return "windows" if tag.startswith("win") else "macos" if tag.startswith("macosx") else "linux"


def _target_flags(filename: str, platforms: list[str] | None = None) -> list[str]:
    """pip's --python-version/--abi/--platform from the wheel's own tags (or the `pip-platform`
    tags given), so every machine downloads the very file the expectations describe (not the
    build for its own Python or its own operating system)."""
    _name, _ver, py, abi, plat = filename[:-len(".whl")].rsplit("-", 4)
    flags = ["--abi", abi] + [x for p in (platforms or plat.split(".")) for x in ("--platform", p)]
    if py.startswith("cp") and py[2:].isdigit():
        flags += ["--python-version", f"{py[2]}.{py[3:]}", "--implementation", "cp"]
    return flags


# ---------------------------------------------------------------- audit and score


@dataclass
class Audit:
    wheel: Wheel
    exit_code: int
    seconds: float
    max_rss_mb: float
    files: list[dict]  # the JSON report's files
    error: str | None = None
    binaries: int = -1  # how many files the report had (kept when `files` is dropped after scoring)

    def __post_init__(self):
        if self.binaries < 0:
            self.binaries = len(self.files)


def audit(wheel: Wheel, path: Path, workdir: Path) -> Audit:
    """`sovereign-audit check WHEEL --format json=...` as a user runs it; wall time and peak RSS of
    that process."""
    out = workdir / f"{wheel.name}.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    errfile = workdir / f"{wheel.name}.stderr"
    # a folder (an unpacked .deb) is audited from its parent, so members are named FOLDER/usr/lib/...
    target, cwd = (path.name, path.parent) if path.is_dir() else (str(path), workdir)
    rssfile = workdir / f"{wheel.name}.maxrss"
    start = time.perf_counter()
    with open(errfile, "wb") as errfh:  # a file, not a pipe: a long stderr cannot block the child
        # started through a small process that waits for it: a child's peak RSS (wait4) counts the
        # pages it shared with its parent between fork and exec, and this process grows with the
        # reports it has read (a 16,000-file report)
        proc = subprocess.Popen([sys.executable, "-c", _PEAK_RSS, str(rssfile), sys.executable, "-m", "audit", "check",
                                 target, "--format", f"json={out.resolve()}"],
                                stdout=subprocess.DEVNULL, stderr=errfh, env=env, cwd=str(cwd))
        proc.wait()
    seconds = time.perf_counter() - start
    try:
        rss_mb = int(rssfile.read_text()) / 1024
    except (OSError, ValueError):
        rss_mb = float("nan")
    err = errfile.read_text(encoding="utf-8", errors="replace").strip()
    try:
        files = json.loads(out.read_text())["files"]
    except (OSError, ValueError, KeyError):
        return Audit(wheel, proc.returncode, seconds, rss_mb, [], err or "no JSON report written")
    return Audit(wheel, proc.returncode, seconds, rss_mb, files)


# argv: RSSFILE CMD...: runs CMD, writes its own peak RSS (KB, wait4: the largest of it and the
# workers it waited for) to RSSFILE, exits with its exit code
_PEAK_RSS = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[2:]); _, st, ru = os.wait4(p.pid, 0); "
             "open(sys.argv[1], 'w').write(str(ru.ru_maxrss)); sys.exit(os.waitstatus_to_exitcode(st))")


def _member(path: str) -> str:
    """A wheel's member (after `!/`), or a file of an unpacked .deb without the folder's name."""
    if "!/" in path:
        return path.split("!/", 1)[1]
    return path.split("/", 1)[1] if "/" in path and not path.startswith("/") else path


def _matches(member: str, globs: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(member, g) for g in globs)


@dataclass
class Row:
    wheel: str
    member: str
    component: str
    mechanism: str
    outcome: str  # TP | FN | FP
    known: str | None = None  # the gap or tolerate reason
    why: str = ""  # FP: "wrong mechanism" or "not present"


def score(a: Audit) -> list[Row]:
    w = a.wheel
    members = [_member(f["path"]) for f in a.files]
    expected: dict[tuple[str, str, str], Expect] = {}
    for e in w.expects:
        for m in members:
            if _matches(m, e.files):
                expected[(m, e.component, e.mechanism)] = e
        for g in e.files:  # an expected file that is not in the report at all is a miss too
            if not any(ch in g for ch in "*?[") and g not in members:
                expected[(g, e.component, e.mechanism)] = e
    found: set[tuple[str, str, str]] = set()
    for f in a.files:
        m = _member(f["path"])
        for x in f.get("findings") or []:
            if x.get("severity") == "warn":
                continue
            key = (m, x["rule"], x["kind"])
            own = x["kind"] in SCORED and not x.get("in_file")
            if own or key in expected:
                found.add(key)
    present = {(m, c) for (m, c, _) in expected}
    rows = []
    for key, e in sorted(expected.items()):
        rows.append(Row(w.name, key[0], key[1], key[2], "TP" if key in found else "FN",
                        known=None if key in found else e.gap))
    for key in sorted(found - set(expected)):
        m, c, k = key
        tol = next((t for t in w.tolerate if t.component == c and t.mechanism == k and _matches(m, t.files)), None)
        rows.append(Row(w.name, m, c, k, "FP", known=tol.reason if tol else None,
                        why="wrong mechanism" if (m, c) in present else "not present"))
    return rows


# ---------------------------------------------------------------- tables


def component_table(rows: list[Row]) -> list[str]:
    agg: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        slot = agg.setdefault((r.component, r.mechanism), {"TP": 0, "FN": 0, "FP": 0})
        slot[r.outcome] += 1
    lines = ["| component | mechanism | TP | FN | FP |", "|---|---|---:|---:|---:|"]
    for (c, k), n in sorted(agg.items()):
        lines.append(f"| {c} | {k} | {n['TP']} | {n['FN']} | {n['FP']} |")
    return lines


def wheel_table(audits: list[Audit], rows: list[Row]) -> list[str]:
    lines = ["| wheel | platform | binaries | exit | expected | TP | FN | FP | time (s) | peak RSS (MB) |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for a in audits:
        mine = [r for r in rows if r.wheel == a.wheel.name]
        n = {o: sum(r.outcome == o for r in mine) for o in ("TP", "FN", "FP")}
        want = "pass (clean control)" if a.wheel.clean else "fail"
        lines.append(f"| {a.wheel.file} | {a.wheel.platform} | {a.binaries} | {a.exit_code} | {want} | "
                     f"{n['TP']} | {n['FN']} | "
                     f"{n['FP']} | {a.seconds:.1f} | {a.max_rss_mb:.0f} |")
    return lines


def misses(rows: list[Row]) -> list[str]:
    """One line per miss; the misses of one cause over many files of a wheel (a folder of 93
    cubins) are one line with their count and the first file."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.outcome != "TP":
            groups.setdefault((r.wheel, r.outcome, r.component, r.mechanism, r.why, r.known), []).append(r)
    lines = []
    for (wheel, outcome, component, mechanism, why, known), rs in groups.items():
        what = "missed" if outcome == "FN" else f"reported, {why}"
        note = f" (known: {' '.join(known.split())})" if known else ""
        many = [rs] if len(rs) > 3 else [[r] for r in rs]
        for part in many:
            files = f"`{part[0].member}`" if len(part) == 1 else f"{len(part)} files (`{part[0].member}`, ...)"
            lines.append(f"- {outcome} {wheel} {files}: {component} by {mechanism}, {what}{note}")
    return lines


def unexplained(audits: list[Audit], rows: list[Row]) -> list[str]:
    """What the expectations do not account for: FN/FP not marked known, a clean control that
    does not pass, an audit that could not run."""
    bad = [f"{r.outcome} {r.wheel} {r.member}: {r.component} by {r.mechanism}"
           for r in rows if r.outcome != "TP" and not r.known]
    for a in audits:
        if a.error:
            bad.append(f"{a.wheel.name}: {a.error}")
        elif a.wheel.clean and a.exit_code != 0:
            bad.append(f"{a.wheel.name}: clean control exited {a.exit_code}")
    return bad


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(audits: list[Audit], rows: list[Row], command: str) -> str:
    out = [f"Run {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {_commit()}, "
           f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}.",
           f"Command: `{command}`", "", "### Per wheel", "", *wheel_table(audits, rows), "",
           "### Per component and mechanism", "", *component_table(rows), "",
           "### Every false negative and false positive", "", *(misses(rows) or ["none"]), ""]
    return "\n".join(out)


DOC_HEAD = """# The real-world corpus

`make corpus` (bench/corpus.py) downloads these wheels from the package index, audits each with
`sovereign-audit check`, and compares the findings with bench/corpus_expectations.toml. That
file is written by hand from evidence gathered without this tool (readelf, nm, objdump,
cuobjdump, strings; for the Windows and macOS wheels llvm-readobj-15 --coff-imports,
llvm-objdump-15 -p, llvm-otool-15 -L / -l, llvm-nm-15, and cuobjdump on a DLL's `.nv_fatb`
section cut out with its offsets from llvm-readobj-15 --sections); each expectation carries its
evidence. A row is scored on the audited
file's own evidence (soname, needed, verneed, symbols, strings, device kernels); what a file
reaches through its tree is scored where the library itself is audited, unless an expectation
names it (onnxruntime's dlopen of its CUDA provider). TP: expected and reported by that
mechanism; FN: expected, not reported; FP: reported, not expected ("wrong mechanism" when the
file does hold that component, by another mechanism). Known misses and known wrong findings are
marked in the expectations file and listed below with the reason. The machine was shared with
other jobs while timing; time is the wall clock of one `check` process per wheel, peak RSS the
largest of that process and its workers (as wait4 reports it).

"""


def with_last_run(doc: Path, section: str, heading: str = "## Last run") -> str:
    """The document with its `heading` section ("## Last run", or "## Last run (windows, macos)"
    for a run of some platforms only) replaced by `section`: what follows it (the history of
    earlier runs, written by hand) and the other platforms' sections are kept. A section not
    there yet goes after the last "## Last run" section; a new document starts from DOC_HEAD."""
    old = doc.read_text() if doc.exists() else ""
    start = old.find(heading + "\n")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        return old[:start] + section + ("" if end < 0 else old[end:])
    last = old.rfind("## Last run")
    if last < 0:
        return DOC_HEAD + section
    end = old.find("\n## ", last + 1)
    if end < 0:
        return old.rstrip("\n") + "\n\n" + section
    return old[:end + 1] + section + old[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated wheel names from the expectations file")
    ap.add_argument("--platform", help=f"comma-separated platforms ({', '.join(PLATFORMS)}): only their wheels")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where wheels are downloaded (kept)")
    ap.add_argument("--find-links", action="append", default=[], metavar="DIR",
                    help="a folder that may already hold a wheel (e.g. torch's CPU build); repeatable")
    ap.add_argument("--expectations", type=Path, default=EXPECTATIONS)
    ap.add_argument("--work", type=Path, default=None, help="folder for the JSON reports (default: CACHE/reports)")
    ap.add_argument("--write", type=Path, metavar="MD", help="also write the tables to this markdown file")
    args = ap.parse_args(argv)
    wheels = load_expectations(args.expectations)
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {w.name for w in wheels}
        if unknown:
            print(f"error: not in {args.expectations}: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        wheels = [w for w in wheels if w.name in names]
    if args.platform:
        plats = set(args.platform.split(","))
        if plats - set(PLATFORMS):
            print(f"error: --platform: not one of {', '.join(PLATFORMS)}: {', '.join(sorted(plats - set(PLATFORMS)))}",
                  file=sys.stderr)
            return 2
        wheels = [w for w in wheels if w.platform in plats]
    work = args.work or args.cache / "reports"
    work.mkdir(parents=True, exist_ok=True)
    audits, rows = [], []
    for w in wheels:
        try:
            path = fetch(w, args.cache, args.find_links)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 3
        a = audit(w, path, work)
        print(f"{w.name}: exit {a.exit_code}, {len(a.files)} binaries, {a.seconds:.1f} s", file=sys.stderr)
        rows += score(a)
        a.files = []  # scored: dropped (16,000 files of flashinfer-cubin's report add up)
        audits.append(a)
    command = "python3 bench/corpus.py" + (f" --only {args.only}" if args.only else "") \
        + (f" --platform {args.platform}" if args.platform else "")
    text = report(audits, rows, command)
    print(text)
    if args.write:
        heading = "## Last run" + (f" ({', '.join(sorted(set(args.platform.split(','))))})" if args.platform else "")
        args.write.write_text(with_last_run(args.write, heading + "\n\n" + text, heading))
    bad = unexplained(audits, rows)
    for line in bad:
        print(f"unexplained: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
