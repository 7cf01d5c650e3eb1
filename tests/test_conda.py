"""`check PKG.conda` / `PKG.tar.bz2`: conda packages built here (zip + tar.zst, tar.bz2) from real
gcc-built libraries; NEEDED resolved inside the package and against --conda-prefix."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared

from audit.cli import main
from audit.errors import EXIT_INPUT, EXIT_USAGE, EXIT_VIOLATION
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions


@pytest.fixture(scope="session")
def libs(fixture_root) -> dict[str, Path]:
    require_tool("gcc")
    d = Path(fixture_root) / "conda-libs"
    p = {}
    p["cudnn"] = cc_shared(d / "env/lib/libcudnn.so.9", "int cudnnCreate(void){return 0;}\n",
                           "-Wl,-soname,libcudnn.so.9")
    p["envdep"] = cc_shared(d / "env/lib/libenvdep.so", "int envdep(void){return 0;}\n", "-Wl,-soname,libenvdep.so")
    p["pkg"] = cc_shared(d / "pkg/libpkg.so.1.2", "int pkg(void){return 1;}\n", "-Wl,-soname,libpkg.so.1")
    p["user"] = cc_shared(d / "pkg/libuser.so", "extern int pkg(void);\nint user(void){return pkg();}\n",
                          f"-L{d / 'pkg'}", "-l:libpkg.so.1.2", "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")
    p["ext"] = cc_shared(d / "pkg/ext.so", "extern int pkg(void);\nint ext(void){return pkg();}\n",
                         f"-L{d / 'pkg'}", "-l:libpkg.so.1.2")
    p["bad"] = cc_shared(d / "pkg/libbad.so", "int bad(void){return 0;}\n", f"-L{d / 'env/lib'}", "-l:libcudnn.so.9")
    p["needsenv"] = cc_shared(d / "pkg/libneedsenv.so", "int ne(void){return 0;}\n", f"-L{d / 'env/lib'}", "-lenvdep")
    p["env"] = d / "env"
    return p


def _tar(entries, mode="w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, kind, value in entries:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size, ti.mode = len(value), 0o755
                tf.addfile(ti, io.BytesIO(value))
            else:
                ti.type, ti.linkname = tarfile.SYMTYPE, value
                tf.addfile(ti)
    return buf.getvalue()


def package_entries(libs) -> list:
    return [
        ("lib/libpkg.so.1.2", "file", libs["pkg"].read_bytes()),
        ("lib/libpkg.so.1", "symlink", "libpkg.so.1.2"),
        ("lib/libuser.so", "file", libs["user"].read_bytes()),
        ("lib/python3.11/site-packages/ext.so", "file", libs["ext"].read_bytes()),
        ("lib/libbad.so", "file", libs["bad"].read_bytes()),
        ("lib/libneedsenv.so", "file", libs["needsenv"].read_bytes()),
        ("share/doc/README", "file", b"docs\n"),
    ]


INFO = [("info/index.json", "file", json.dumps({"name": "demo", "version": "1.0", "build": "0"}).encode())]


def tar_bz2(out: Path, entries) -> Path:
    out.write_bytes(_tar(INFO + entries, mode="w:bz2"))
    return out


def dot_conda(out: Path, entries) -> Path:
    import zstandard

    zc = zstandard.ZstdCompressor()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        zf.writestr("pkg-demo-1.0-0.tar.zst", zc.compress(_tar(entries)))
        zf.writestr("info-demo-1.0-0.tar.zst", zc.compress(_tar(INFO)))
    return out


BUILDERS = {"conda": lambda d, e: dot_conda(d / "demo-1.0-0.conda", e),
            "tar.bz2": lambda d, e: tar_bz2(d / "demo-1.0-0.tar.bz2", e)}


def audit(pkg, prefix=None):
    return check_paths([str(pkg)], load_policy(None), ResolveOptions.from_cli(conda_prefix=prefix))


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_package_is_audited_like_a_wheel(libs, tmp_path, fmt):
    pkg = BUILDERS[fmt](tmp_path, package_entries(libs))
    report = audit(pkg)
    files = {f.path: f for f in report.files}
    assert sorted(files) == sorted(f"{pkg}!/{n}" for n in (
        "lib/libpkg.so.1.2", "lib/libuser.so", "lib/python3.11/site-packages/ext.so", "lib/libbad.so",
        "lib/libneedsenv.so"))
    assert report.exit_code == EXIT_VIOLATION
    bad = files[f"{pkg}!/lib/libbad.so"]
    assert [(f.kind, f.subject) for f in bad.findings if f.failing] == [("needed", "libcudnn.so.9")]
    # RUNPATH $ORIGIN finds the package's own lib/, through its symlink
    user = files[f"{pkg}!/lib/libuser.so"].tree.children[0]
    assert (user.name, user.how, Path(user.realpath).name) == ("libpkg.so.1", "runpath", "libpkg.so.1.2")
    # no RUNPATH: the package's member is the fallback
    ext = next(c for c in files[f"{pkg}!/lib/python3.11/site-packages/ext.so"].tree.children if c.name == "libpkg.so.1")
    assert ext.how == "member" and ext.status == "unlisted"
    # without a prefix, a library from another package is unresolved
    needs = files[f"{pkg}!/lib/libneedsenv.so"]
    assert [f.subject for f in needs.findings if f.kind == "unresolved"] == ["libenvdep.so"]


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_conda_prefix_resolves_other_packages_libraries(libs, tmp_path, fmt):
    pkg = BUILDERS[fmt](tmp_path, package_entries(libs))
    report = audit(pkg, prefix=str(libs["env"]))
    files = {f.path: f for f in report.files}
    dep = files[f"{pkg}!/lib/libneedsenv.so"].tree.children[0]
    assert (dep.name, dep.how, dep.path) == ("libenvdep.so", "conda-prefix", str(libs["env"] / "lib/libenvdep.so"))
    assert not [f for f in files[f"{pkg}!/lib/libneedsenv.so"].findings if f.kind == "unresolved"]
    cud = next(f for f in files[f"{pkg}!/lib/libbad.so"].findings if f.kind == "needed")
    assert str(libs["env"] / "lib/libcudnn.so.9") in cud.detail and "conda-prefix" in cud.detail
    assert report.options["conda_prefix"] == str(libs["env"].resolve())


def _cli(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


HOSTILE = {
    "dotdot": ([("lib/../../evil.so", "file", b"\x7fELF....")], "unsafe member path"),
    "escaping symlink": ([("lib/up", "symlink", "../../..")], "escapes the package"),
    "through a symlink chain": ([("l2", "symlink", "."), ("l1", "symlink", "l2/.."),
                                 ("l1/evil.so", "file", b"\x7fELF....")], "leaving the package"),
}


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_package_is_an_input_error_and_writes_nothing_outside(tmp_path, capsys, fmt, case):
    work = tmp_path / "work"
    work.mkdir()
    entries, expect = HOSTILE[case]
    pkg = BUILDERS[fmt](work, entries)
    rc, out, err = _cli(capsys, "check", pkg)
    assert rc == EXIT_INPUT, out + err
    errors = [line for line in out.splitlines() if line.strip().startswith("error:")]
    assert len(errors) == 1 and expect in errors[0], out
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["work", pkg.name])
    import tempfile

    assert not Path(tempfile.gettempdir(), "evil.so").exists()


def test_not_a_conda_package(tmp_path, capsys):
    fake = tmp_path / "x.conda"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr("readme.txt", "no pkg")
    rc, out, _ = _cli(capsys, "check", fake)
    assert rc == EXIT_INPUT and "not a .conda package" in out
    rc, _, err = _cli(capsys, "check", fake, "--conda-prefix", tmp_path / "missing")
    assert rc == EXIT_USAGE and "--conda-prefix" in err


def test_archive_limits_apply_to_conda_packages(libs, tmp_path, capsys):
    pkg = BUILDERS["conda"](tmp_path, package_entries(libs))
    rc, out, _ = _cli(capsys, "check", "--max-member-size", "4K", pkg)
    assert rc == EXIT_INPUT and len([ln for ln in out.splitlines() if "--max-member-size" in ln]) == 1, out
    rc, out, _ = _cli(capsys, "check", "--max-archive-size", "20K", pkg)
    assert rc == EXIT_INPUT and "--max-archive-size" in out, out
