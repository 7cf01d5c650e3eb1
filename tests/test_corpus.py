"""A small real subset of the corpus (bench/corpus.py): wheels from the package index,
downloaded with pip at test time (for their own platform, whatever runs the tests), audited and
compared with the hand-written expectations. orjson (Linux, Windows, macOS) is a clean control;
numpy bundles OpenBLAS (renamed by auditwheel) and links it; numpy for macOS 14 loads Accelerate;
cuDNN's Python frontend loads cuDNN from its Python code with ctypes;
Debian's libblis4-openmp (a 4.5 MB .deb from apt-get download, else deb.debian.org) is BLIS twice,
once with its bli_ symbols hidden. Skipped only when the package index (or Debian's archive, for
the .deb) cannot be reached."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import corpus  # noqa: E402

CACHE = REPO / "tests" / "_fixtures_build" / "corpus-wheels"
SUBSET = ("orjson", "numpy", "orjson-win", "orjson-macos", "numpy-macos14", "nvidia-cudnn-frontend")


def _index_reachable(host: str = "pypi.org", port: int = 443) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def audits(tmp_path_factory) -> dict[str, corpus.Audit]:
    wheels = {w.name: w for w in corpus.load_expectations() if w.name in SUBSET}
    assert set(wheels) == set(SUBSET)
    # a folder that already holds the wheels (SOVEREIGN_AUDIT_CORPUS) saves the download
    links = [os.environ["SOVEREIGN_AUDIT_CORPUS"]] if os.environ.get("SOVEREIGN_AUDIT_CORPUS") else []
    paths = {}
    for name, w in wheels.items():
        try:
            paths[name] = corpus.fetch(w, CACHE, links)
        except RuntimeError as exc:
            if not _index_reachable():
                pytest.skip(f"the package index (pypi.org) cannot be reached to download {w.requirement}")
            raise AssertionError(str(exc)) from None
    work = tmp_path_factory.mktemp("corpus")
    return {name: corpus.audit(wheels[name], paths[name], work) for name in SUBSET}


@pytest.mark.parametrize("name", ["orjson", "orjson-win", "orjson-macos"])
def test_clean_control_passes_with_no_finding(audits, name):
    a = audits[name]
    assert a.error is None and a.exit_code == 0 and a.files
    assert all(f["verdict"] == "pass" for f in a.files)
    # a warning at most: the Windows build's python311.dll is the interpreter's, not in the wheel
    notes = [(x["rule"], x["kind"]) for f in a.files for x in f["findings"]]
    assert all(k == ("linkage.unresolved", "unresolved") for k in notes), notes
    assert corpus.score(a) == []


def test_numpy_macos_accelerate_loads_found(audits):
    """The three extensions that load Accelerate (llvm-otool -l: LC_LOAD_DYLIB
    .../Accelerate.framework/...) are reported by that load command; what is not (Accelerate's
    $NEWLAPACK names) is a known miss in the expectations, nothing unexplained."""
    a = audits["numpy-macos14"]
    assert a.error is None and a.exit_code in (1, 3)  # 3: libnpymath.a holds Mach-O objects
    rows = corpus.score(a)
    found = {r.member for r in rows if r.outcome == "TP" and (r.component, r.mechanism) == ("apple.accelerate", "needed")}
    assert len(found) == 3, found
    assert corpus.unexplained([a], rows) == []


def test_numpy_every_component_found_by_the_right_mechanism(audits):
    a = audits["numpy"]
    assert a.error is None and a.exit_code == 1
    rows = corpus.score(a)
    missed = [r for r in rows if r.outcome == "FN"]
    assert missed == [], missed
    tp = {(r.component, r.mechanism) for r in rows if r.outcome == "TP"}
    assert {("blas.openblas", "soname"), ("blas.openblas", "needed"), ("blas.cblas", "imported-symbol"),
            ("blas.reference", "imported-symbol")} <= tp
    wrong = [r for r in rows if r.outcome == "FP" and not r.known]
    assert wrong == [], wrong  # a wrong-reason finding not yet known is a regression
    assert corpus.unexplained([a], rows) == []


def test_numpy_bundled_runtime_libraries_beside_openblas_have_no_finding(audits):
    """libgfortran's RPATH $ORIGIN is OpenBLAS's folder, but it neither needs nor names OpenBLAS
    (readelf -dW: NEEDED libquadmath, libz, libm, libgcc_s, libc; no dlopen import): a search
    directory is not a linkage. The extensions that do load OpenBLAS say so by DT_NEEDED only."""
    a = audits["numpy"]
    by_member = {f["path"].split("!/", 1)[1]: f for f in a.files}
    runtime = [m for m in by_member if m.startswith(("numpy.libs/libgfortran-", "numpy.libs/libquadmath-"))]
    assert len(runtime) == 2
    for m in runtime:
        assert by_member[m]["verdict"] == "pass" and by_member[m]["findings"] == [], m
        assert by_member[m]["rpath"] == ["$ORIGIN"] or "libquadmath" in m
    assert [(m, x["where"]) for m, f in by_member.items() for x in f["findings"] if x["kind"] == "rpath"] == []


def test_cudnn_frontend_python_load_found_as_the_source_spells_it(audits):
    """cudnn/__init__.py hands libcudnn.so.9, libcudnn.so and cudnn64_9.dll to ctypes (grep: lines
    238, 254, 270, 273); the extension only looks cuDNN's API up with dlsym. Both are found, each by
    its own mechanism, and the package's other ctypes loads (libcuda.so.1, its own .so) pass."""
    a = audits["nvidia-cudnn-frontend"]
    assert a.error is None and a.exit_code == 1
    rows = corpus.score(a)
    assert [r for r in rows if r.outcome != "TP"] == []
    assert {(r.member, r.component, r.mechanism) for r in rows} >= {
        ("cudnn/__init__.py", "nvidia.cudnn", "dlopen-string")}
    init = next(f for f in a.files if f["path"].endswith("!/cudnn/__init__.py"))
    (finding,) = init["findings"]
    assert finding["where"].startswith("line ") and "ctypes" in finding["where"]
    assert {n for m in finding["matches"] for n in m["names"]} == {"libcudnn.so.9", "libcudnn.so", "cudnn64_9.dll"}
    others = [f for f in a.files if f["path"].endswith(".py") and f is not init]
    assert others and all(f["verdict"] == "pass" and not f["findings"] for f in others)
    assert corpus.unexplained([a], rows) == []


def test_scoring_counts_misses_and_unexpected_findings(audits):
    """The comparison on the same real report: dropping an expectation turns its findings into
    false positives, and expecting something absent is a false negative."""
    a = audits["numpy"]
    drop = next(e for e in a.wheel.expects if e.mechanism == "needed")
    bogus = corpus.Expect("nvidia.cudnn", "needed", ["numpy/fft/_pocketfft_umath.*.so"], "none")
    changed = dataclasses.replace(a, wheel=dataclasses.replace(
        a.wheel, expects=[e for e in a.wheel.expects if e is not drop] + [bogus]))
    rows = corpus.score(changed)
    fp = [r for r in rows if r.outcome == "FP" and r.component == drop.component and r.mechanism == "needed"]
    assert len(fp) == 3 and all(r.why == "not present" for r in fp)
    fn = [r for r in rows if r.outcome == "FN"]
    assert [(r.member.split("/")[-1].split(".")[0], r.component) for r in fn] == [("_pocketfft_umath", "nvidia.cudnn")]
    table = "\n".join(corpus.component_table(rows))
    assert "| blas.openblas | needed | 0 | 0 | 3 |" in table and "| nvidia.cudnn | needed | 0 | 1 | 0 |" in table


def test_writing_the_last_run_keeps_the_history_after_it(tmp_path):
    doc = tmp_path / "corpus.md"
    doc.write_text("# Head\n\nintro\n\n## Last run\n\nold tables\n\n## Since the first runs\n\nhistory\n")
    out = corpus.with_last_run(doc, "## Last run\n\nnew tables\n")
    assert out == "# Head\n\nintro\n\n## Last run\n\nnew tables\n\n## Since the first runs\n\nhistory\n"
    fresh = corpus.with_last_run(tmp_path / "absent.md", "## Last run\n\nnew tables\n")
    assert fresh.startswith(corpus.DOC_HEAD) and fresh.endswith("## Last run\n\nnew tables\n")


@pytest.fixture(scope="module")
def blis_deb(tmp_path_factory) -> corpus.Audit:
    w = next(w for w in corpus.load_expectations() if w.name == "deb-libblis4-openmp")
    try:
        path = corpus.fetch(w, CACHE, [])
    except RuntimeError as exc:
        if not _index_reachable("deb.debian.org", 80):
            pytest.skip(f"Debian's archive (deb.debian.org) cannot be reached to download {w.deb}")
        raise AssertionError(str(exc)) from None
    return corpus.audit(w, path, tmp_path_factory.mktemp("corpus-deb"))


def test_debian_blis_found_by_its_messages_where_its_symbols_are_hidden(blis_deb):
    """libblas.so.3 from libblis4-openmp defines no bli_ symbol (nm -D: 342 definitions, BLAS and
    CBLAS only), but holds BLIS's own "libblis: ..." messages (strings -a): BLIS by static-string,
    as in libblis.so.4, which also says so by its soname and its 1184 bli_ exports."""
    a = blis_deb
    assert a.error is None and a.exit_code == 1
    assert all(not f["path"].startswith("/") for f in a.files)  # named from the package's root
    rows = corpus.score(a)
    assert [r for r in rows if r.outcome != "TP"] == []
    tp = {(r.member.rsplit("/", 1)[1].split(".so")[0], r.component, r.mechanism) for r in rows}
    assert {("libblas", "blas.blis", "static-string"), ("libblas", "blas.reference", "soname"),
            ("libblis", "blas.blis", "soname"), ("libblis", "blas.blis", "static-symbol")} <= tp
    assert ("libblas", "blas.blis", "static-symbol") not in tp
    assert corpus.unexplained([a], rows) == []


def test_a_debian_package_is_read_as_dpkg_unpacks_it(blis_deb):
    """`check X.deb` reads the package's data.tar itself: every library dpkg-deb -x writes out is
    audited, with the same verdict and findings (the folder's symlinks name some of them there)."""
    from audit.linkage.check import check_paths
    from audit.linkage.judging.policy import load_policy
    from audit.linkage.resolution.ldso import ResolveOptions

    w = blis_deb.wheel
    deb = CACHE / "debs" / w.file
    assert deb.is_file()
    report = check_paths([str(deb)], load_policy(None), ResolveOptions.from_cli())
    assert report.exit_code == 1 and all(f.path.startswith(f"{deb}!/usr/lib/") for f in report.files)
    seen = lambda verdicts: sorted(verdicts)  # noqa: E731
    assert seen((f.verdict, sorted((x.rule, x.kind, x.subject) for x in f.findings)) for f in report.files) == seen(
        (f["verdict"], sorted((x["rule"], x["kind"], x["subject"]) for x in f["findings"])) for f in blis_deb.files)
