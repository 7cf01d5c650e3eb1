"""The inputs of `check` as a release gate: a folder, wheel, conda package or container image is
read without reading or writing anything outside it, every binary in it is either audited or
makes the run an error (never skipped as data), and hostile sizes and shapes stay bounded.

Every case runs the CLI in a subprocess (exit code, one `error:` line, no traceback) on inputs
built here with real compilers and Python's zipfile/tarfile.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared, run

from audit.errors import EXIT_INPUT, EXIT_OK

REPO = Path(__file__).resolve().parents[1]

# The CLI under an audit hook: any open() of a path holding CANARY is reported on stderr.
_HOOKED = """
import os, sys
canary = os.environ["CANARY"]
def hook(event, args):
    if event == "open" and args and canary in str(args[0]):
        os.write(2, f"CANARY OPENED {args[0]}\\n".encode())
sys.addaudithook(hook)
from audit.cli import main
main(sys.argv[1:])
"""


# As root, nobody's python may lie out of reach (/root is 0700): root keeps its uid but loses the
# two capabilities that skip file permission checks, so the kernel checks them as for any user.
_NO_DAC_BYPASS = ("--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search")


def cli(*args, tmpdir: Path | None = None, canary: str | None = None, user: bool = False,
        timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    cmd = [sys.executable, "-m", "audit", *map(str, args)]
    if canary is not None:
        env["CANARY"] = canary
        cmd = [sys.executable, "-c", _HOOKED, *map(str, args)]
    if user:  # without the capabilities that let root read a chmod 000 folder anyway
        cmd = ["setpriv", *_NO_DAC_BYPASS, *cmd] if os.geteuid() == 0 else cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip().startswith("error:")]


def assert_input_error(proc: subprocess.CompletedProcess, *expect: str, count: int = 1) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_INPUT, proc.stdout + proc.stderr
    errors = error_lines(proc)
    assert len(errors) == count, proc.stdout + proc.stderr
    for want in expect:
        assert any(want in e for e in errors), (want, errors)


def tree_of(top: Path) -> set[str]:
    return {str(p.relative_to(top)) for p in top.rglob("*")}


# ---------------------------------------------------------------- fixtures built with real tools


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    require_tool("gcc")
    d = tmp_path_factory.mktemp("gate-inputs")
    p = {"clean": cc_shared(d / "libclean.so", "int clean(void){return 0;}\n", "-Wl,-soname,libclean.so")}
    p["canary"] = cc_shared(d / "host/libcanary.so", "int canary(void){return 0;}\n", "-Wl,-soname,libcanary.so")
    p["user"] = cc_shared(d / "libuser.so", "extern int canary(void);\nint user(void){return canary();}\n",
                          f"-L{d / 'host'}", "-lcanary")
    return p


@pytest.fixture(scope="module")
def dll(tmp_path_factory) -> Path:
    cc = require_tool("x86_64-w64-mingw32-gcc")
    d = tmp_path_factory.mktemp("pe")
    (d / "f.c").write_text("__declspec(dllexport) int f(void){return 1;}\n")
    run(cc, "-shared", "-o", d / "f.dll", d / "f.c")
    return d / "f.dll"


def _tar(entries, mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.GNU_FORMAT) as tf:
        for name, kind, value in entries:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size, ti.mode = len(value), 0o755
                tf.addfile(ti, io.BytesIO(value))
            elif kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            else:
                ti.type, ti.linkname = (tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE), value
                tf.addfile(ti)
    return buf.getvalue()


def tar_bz2(out: Path, entries) -> Path:
    info = [("info/index.json", "file", json.dumps({"name": "demo", "version": "1.0", "build": "0"}).encode())]
    out.write_bytes(_tar(info + entries, "w:bz2"))
    return out


def climb_to_root(depth: int = 24) -> list:
    """Symlinks that each stay inside the package when read one at a time, but chained lead up
    to the host's `/` (`..` there stays at `/`): d/r0 -> .., d/rK -> r(K-1)/.."""
    links = [("d/r0", "symlink", "..")]
    links += [(f"d/r{k}", "symlink", f"r{k - 1}/..") for k in range(1, depth)]
    return links


# ---------------------------------------------------------------- never outside the inputs


def test_conda_symlink_chain_to_the_host_root_is_refused_and_never_opens_a_host_file(built, tmp_path):
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir(), tmp.mkdir()
    canary = str(built["canary"])
    pkg = tar_bz2(work / "demo-1.0-0.tar.bz2", [
        ("lib/libuser.so", "file", built["user"].read_bytes()),
        *climb_to_root(),
        ("lib/libcanary.so", "symlink", "../d/r23" + canary),  # NEEDED by libuser.so
    ])
    proc = cli("check", pkg, tmpdir=tmp, canary=canary)
    assert "CANARY OPENED" not in proc.stderr, proc.stderr
    assert_input_error(proc, "leaving the package")
    assert tree_of(work) == {pkg.name} and tree_of(tmp) == set()


def test_conda_member_behind_a_symlink_chain_creates_no_folder_outside(built, tmp_path):
    work, tmp, outside = tmp_path / "work", tmp_path / "tmp", tmp_path / "outside"
    for d in (work, tmp, outside):
        d.mkdir()
    pkg = tar_bz2(work / "demo-1.0-0.tar.bz2", [
        ("lib/libclean.so", "file", built["clean"].read_bytes()),
        *climb_to_root(),
        ("d/r23" + str(outside) + "/made/deeper/evil.so", "file", built["clean"].read_bytes()),
    ])
    proc = cli("check", pkg, tmpdir=tmp)
    assert_input_error(proc, "leaving the package")
    assert tree_of(outside) == set() and tree_of(work) == {pkg.name} and tree_of(tmp) == set()


# ---------------------------------------------------------------- never skip a binary silently


@pytest.fixture(scope="module")
def foreign(tmp_path_factory, dll) -> dict[str, Path]:
    """Binaries of formats the audit does not read, each made by its own toolchain."""
    d = tmp_path_factory.mktemp("foreign")
    (d / "f.c").write_text("int f(void){return 1;}\n")
    out = {"dll": dll}
    clang = require_tool("clang-15")
    require_tool("ld64.lld-15")
    run(clang, "--target=arm64-apple-macos11", "-fuse-ld=lld", "-shared", "-nostdlib", "-o", d / "libf.dylib",
        d / "f.c")
    out["dylib"] = d / "libf.dylib"
    run("gcc", "-c", "-fPIC", "-o", d / "f.o", d / "f.c")
    run("ar", "rcs", d / "libf.a", d / "f.o")
    out["a"] = d / "libf.a"
    return out


NATIVE_KINDS = {"dll": "pe", "dylib": "macho"}


@pytest.mark.parametrize("which", sorted(NATIVE_KINDS))
def test_folder_with_an_elf_file_and_a_windows_or_macos_binary_audits_both(built, foreign, tmp_path, which):
    """A DLL or dylib beside the ELF files is audited too (its own verdict), never skipped."""
    folder = tmp_path / "dist"
    (folder / "lib").mkdir(parents=True)
    (folder / "lib/libclean.so").write_bytes(built["clean"].read_bytes())
    (folder / "README.txt").write_text("docs\n")  # data: still skipped
    (folder / "lib" / foreign[which].name).write_bytes(foreign[which].read_bytes())
    proc = cli("check", "--format", "json", folder)
    doc = json.loads(proc.stdout)
    assert proc.returncode == EXIT_OK and doc["summary"]["skipped"] == {"non_elf": 1}, proc.stdout + proc.stderr
    verdicts = {Path(f["path"]).name: (f["verdict"], f.get("format")) for f in doc["files"]}
    assert verdicts == {"libclean.so": ("pass", None), foreign[which].name: ("pass", NATIVE_KINDS[which])}


def test_static_archive_in_a_wheel_or_folder_is_read_member_by_member(built, foreign, tmp_path):
    """A static archive beside the libraries (numpy's wheels ship libnpymath.a) is never skipped:
    its ELF members are audited as files of their own, `lib.a!/member.o`."""
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(built["clean"], "demo/libclean.so")
        zf.write(foreign["a"], "demo/lib/libf.a")
    folder = tmp_path / "dist"
    folder.mkdir()
    (folder / "libclean.so").write_bytes(built["clean"].read_bytes())
    (folder / "libf.a").write_bytes(foreign["a"].read_bytes())
    for target, shown in ((whl, f"{whl}!/demo/lib/libf.a!/f.o"), (folder, f"{folder / 'libf.a'}!/f.o")):
        proc = cli("check", "--format", "json", target)
        doc = json.loads(proc.stdout)
        assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
        assert {f["path"]: f["verdict"] for f in doc["files"]}.get(shown) == "pass", doc["files"]


def test_wheel_with_an_elf_file_and_a_dll_audits_both(built, dll, tmp_path):
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(built["clean"], "demo/libclean.so")
        zf.write(dll, "demo/f.dll")
        zf.writestr("demo/__init__.py", "")
    proc = cli("check", "--format", "json", whl)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    verdicts = {f["path"]: f["verdict"] for f in json.loads(proc.stdout)["files"]}
    assert verdicts == {f"{whl}!/demo/libclean.so": "pass", f"{whl}!/demo/f.dll": "pass"}


def test_conda_package_with_an_elf_file_and_a_dll_audits_both(built, dll, tmp_path):
    pkg = tar_bz2(tmp_path / "demo-1.0-0.tar.bz2", [("lib/libclean.so", "file", built["clean"].read_bytes()),
                                                    ("Library/bin/f.dll", "file", dll.read_bytes())])
    proc = cli("check", "--format", "json", pkg)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    verdicts = {f["path"]: f["verdict"] for f in json.loads(proc.stdout)["files"]}
    assert verdicts == {f"{pkg}!/lib/libclean.so": "pass", f"{pkg}!/Library/bin/f.dll": "pass"}


@pytest.mark.parametrize("how", [None, "gzip"])
def test_image_with_an_elf_file_and_a_dll_audits_both(built, dll, tmp_path, how):
    from image_fixtures import layer_tar, oci_layout

    layer = layer_tar([("file", "usr/lib/libclean.so", built["clean"].read_bytes()),
                       ("file", "opt/app/f.dll", dll.read_bytes())])
    img = oci_layout(tmp_path / "img", [layer], how=how, as_tar=True)
    proc = cli("check", "--format", "json", img)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    verdicts = {f["path"]: f["verdict"] for f in json.loads(proc.stdout)["files"]}
    assert verdicts == {f"{img}!/usr/lib/libclean.so": "pass", f"{img}!/opt/app/f.dll": "pass"}


# ---------------------------------------------------------------- bounded


def _docker_save(out: Path, layer: bytes, refs: int) -> Path:
    """A docker save archive whose manifest names one layer `refs` times."""
    import hashlib

    diff = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff] * refs}}).encode()
    cname = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cname, "RepoTags": ["app:1"], "Layers": ["l/layer.tar"] * refs}]).encode()
    with tarfile.open(out, "w") as tf:
        for name, data in (("l/layer.tar", layer), (cname, config), ("manifest.json", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return out


def test_image_naming_one_layer_thousands_of_times_is_refused_at_once(built, tmp_path):
    from image_fixtures import layer_tar

    layer = layer_tar([("file", "usr/lib/libclean.so", built["clean"].read_bytes())])
    ok = _docker_save(tmp_path / "ok.tar", layer, 3)
    assert cli("check", ok).returncode == EXIT_OK
    img = _docker_save(tmp_path / "many.tar", layer, 3000)
    proc = cli("check", img, timeout=60)
    assert_input_error(proc, "names 3000 layers (limit 256)")


@pytest.mark.parametrize("limit, expect", [((), "--max-member-ratio"),
                                           (("--max-archive-size", "1M"), "--max-archive-size")])
def test_gzip_layer_that_inflates_past_the_limits_is_refused(built, tmp_path, limit, expect):
    import gzip

    from image_fixtures import layer_tar, oci_layout

    # 80 MiB of zeros behind a real library: a few hundred KB of gzip
    layer = layer_tar([("file", "usr/lib/libclean.so", built["clean"].read_bytes()),
                       ("file", "var/zeros", bytes(80 << 20))])
    assert len(gzip.compress(layer, 1)) * 100 < (64 << 20) < len(layer)
    img = oci_layout(tmp_path / "img", [layer], how="gzip", as_tar=True)
    proc = cli("check", *limit, img)
    assert_input_error(proc, "layer 1", expect)


@pytest.mark.parametrize("where", ["etc/ld.so.conf", "etc/ld.so.conf.d/fifo.conf"])
def test_fifo_as_ld_so_conf_under_root_does_not_hang(built, tmp_path, where):
    """A FIFO is never opened to be read (it would block until a writer came); the top-level
    ld.so.conf is then warned about, as an unreadable one is."""
    root = tmp_path / "sysroot"
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    if where != "etc/ld.so.conf":
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    os.mkfifo(root / where)
    proc = cli("check", "--root", root, built["clean"], timeout=30)
    assert "Traceback" not in proc.stderr and proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    if where == "etc/ld.so.conf":
        assert "cannot read /etc/ld.so.conf" in proc.stdout + proc.stderr


def test_folder_with_an_unreadable_sub_folder_is_an_error(built, tmp_path):
    """The sub-folder (which might hold anything) is chmod 000 and the CLI runs without root's
    permission bypass, so the folder really cannot be listed."""
    require_tool("setpriv")
    top = tmp_path / "dist"
    (top / "lib").mkdir(parents=True)
    (top / "secret").mkdir()
    (top / "lib/libclean.so").write_bytes(built["clean"].read_bytes())
    (top / "secret/libhidden.so").write_bytes(built["clean"].read_bytes())
    (top / "secret").chmod(0)
    try:
        ok = cli("check", top / "lib", user=True)
        assert ok.returncode == EXIT_OK, ok.stdout + ok.stderr  # the rest is readable
        proc = cli("check", top, user=True)
    finally:
        (top / "secret").chmod(0o755)
    assert_input_error(proc, "cannot list folder: Permission denied")
    assert str(top / "secret") in proc.stdout


def _tar_declaring(size: int, before: list[tuple[str, bytes]]) -> bytes:
    """A tar (by tarfile) of `before`, then one header declaring `size` bytes whose data never
    comes: the stream ends right after the header, as a cut-off or hostile archive does."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in before:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        body = buf.getvalue()
        huge = tarfile.TarInfo("usr/lib/libbig.so")
        huge.size = size
        return body + huge.tobuf(format=tarfile.GNU_FORMAT) + bytes(20 * 512)  # a record's padding


@pytest.mark.parametrize("where", ["image", "conda", "folder"])
def test_a_streamed_tar_member_declaring_a_huge_size_is_refused_at_once(built, tmp_path, where):
    """tarfile steps over an unread member by reading its declared size and keeps going after
    the stream ends: a header declaring 1 TB over a few KB spun for minutes. Every tar read as a
    stream (a compressed image layer, a conda package, a compressed tar in a folder) refuses it."""
    import bz2
    import gzip

    from image_fixtures import oci_layout

    clean = [("usr/lib/libclean.so", built["clean"].read_bytes())]
    data = _tar_declaring(10 ** 12, clean)
    if where == "image":
        target = oci_layout(tmp_path / "img", [data], how="gzip", as_tar=True)
    elif where == "conda":
        target = tmp_path / "demo-1.0-0.tar.bz2"
        target.write_bytes(bz2.compress(_tar_declaring(10 ** 12, [("info/index.json", b"{}")] + clean)))
    else:
        target = tmp_path / "dist"
        target.mkdir()
        (target / "libclean.so").write_bytes(built["clean"].read_bytes())
        (target / "bundle.tar.gz").write_bytes(gzip.compress(data))
    proc = cli("check", target, timeout=60)
    assert_input_error(proc, "declares 1000000000000 bytes")


def test_conda_member_replacing_a_folder_with_a_file_is_no_internal_error(built, tmp_path):
    """`lib/.` after `lib/libclean.so` names the folder `lib` itself, as a file: the folder and
    what it held are replaced (an internal KeyError before)."""
    pkg = tar_bz2(tmp_path / "demo-1.0-0.tar.bz2", [("lib/libclean.so", "file", built["clean"].read_bytes()),
                                                    ("lib/.", "file", b"not a folder\n")])
    proc = cli("check", pkg)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    # nothing audited is left in the package: an error, never a pass
    assert proc.returncode == EXIT_INPUT, proc.stdout + proc.stderr


def test_image_whiteout_of_a_folder_with_files_removes_them_all(built, tmp_path):
    """A later layer's `.wh.lib` deletes the folder lib/ and what lower layers put in it (an
    internal KeyError before: the folder's children were dropped before each child was)."""
    from image_fixtures import layer_tar, oci_layout

    lower = layer_tar([("file", "usr/lib/libclean.so", built["clean"].read_bytes()),
                       ("file", "usr/lib/sub/libgone.so", built["clean"].read_bytes()),
                       ("file", "opt/libkept.so", built["clean"].read_bytes())])
    upper = layer_tar([("whiteout", "usr/lib")])
    img = oci_layout(tmp_path / "img", [lower, upper], as_tar=True)
    proc = cli("check", "--format", "json", img)
    assert "internal error" not in proc.stderr and proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert [f["path"] for f in json.loads(proc.stdout)["files"]] == [f"{img}!/opt/libkept.so"]


def test_wheel_member_with_an_empty_name_is_an_input_error(built, tmp_path):
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(built["clean"], "demo/libclean.so")
        zf.writestr(zipfile.ZipInfo(""), built["clean"].read_bytes())  # an ELF file with no name
    proc = cli("check", whl)
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_INPUT, proc.stdout + proc.stderr
