"""Archives other than wheels are containers, never data: a zip archive (a Java archive with JNI
libraries, an egg, a plain zip), a Debian package, an RPM package and a tarball. Named, found in a
folder, inside a wheel, a conda package or a container image, their members are audited as a
wheel's are. The libraries are gcc-built; a jar's native library NEEDs cuDNN as real JNI wrappers
of CUDA libraries do; the .deb files are built by dpkg-deb, the .rpm files by rpmbuild."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared, tarball

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION
from audit.linkage.check import check_paths
from audit.linkage.containers.inputs import MAX_ZIP_DEPTH
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from tests.cli_runner import cli

JNI = "native/linux-x86_64/libjnicudnn.so"


@pytest.fixture(scope="session")
def jni(fixture_root) -> dict[str, bytes]:
    require_tool("gcc")
    d = Path(fixture_root) / "zip-archives"
    cudnn = cc_shared(d / "sdk/libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    lib = cc_shared(d / "libjnicudnn.so", "extern int cudnnCreate(void);\nint Java_x_create(void){return cudnnCreate();}\n",
                    f"-L{cudnn.parent}", "-l:libcudnn.so.9")
    clean = cc_shared(d / "libjniclean.so", "int Java_x_add(int a, int b){return a + b;}\n")
    return {"cudnn": lib.read_bytes(), "clean": clean.read_bytes()}


def jar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def dpkg_deb(tmp_path: Path, files: dict[str, bytes], name: str = "x_1_amd64.deb") -> Path:
    """A Debian package built by dpkg-deb installing `files` (path under / -> bytes)."""
    import subprocess

    require_tool("dpkg-deb")
    root = tmp_path / f"debroot-{name}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text("Package: x\nVersion: 1\nArchitecture: amd64\nMaintainer: n <n@x>\n"
                                             "Description: x\n")
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    deb = tmp_path / name
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True)
    return deb


def in_wheel_tarball_and_conda(tmp_path: Path, name: str, data: bytes) -> list[tuple[Path, str]]:
    """`data` as member `name` of a wheel, a .tar.gz and both conda formats: (container, the
    member's name in it)."""
    from tests.test_conda import BUILDERS

    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"demo/{name}", data)
        zf.writestr("demo-1.0.dist-info/RECORD", "")
    tgz = tmp_path / "sdk.tar.gz"
    tgz.write_bytes(tarball({f"sdk/{name}": data}))
    out = [(whl, f"demo/{name}"), (tgz, f"sdk/{name}")]
    return out + [(build(tmp_path, [(f"share/{name}", "file", data)]), f"share/{name}") for build in BUILDERS.values()]


def audit(*paths):
    return check_paths([str(p) for p in paths], load_policy(None), ResolveOptions.from_cli())


def cudnn_needed(result) -> bool:
    return {(f.rule, f.kind, f.subject) for f in result.findings if f.failing} == {
        ("nvidia.cudnn", "needed", "libcudnn.so.9"), ("nvidia.cudnn", "imported-symbol", "cudnnCreate")}


def test_a_named_jar_s_native_library_is_audited(jni, tmp_path):
    app = tmp_path / "app.jar"
    app.write_bytes(jar({JNI: jni["cudnn"], "native/linux-x86_64/libjniclean.so": jni["clean"],
                         "x/Main.class": b"\xca\xfe\xba\xbe\x00\x00\x00\x41"}))
    report = audit(app)
    files = {f.path: f for f in report.files}
    assert sorted(files) == sorted([f"{app}!/{JNI}", f"{app}!/native/linux-x86_64/libjniclean.so"])
    assert cudnn_needed(files[f"{app}!/{JNI}"]) and report.exit_code == EXIT_VIOLATION
    assert files[f"{app}!/native/linux-x86_64/libjniclean.so"].verdict == "pass"


def test_a_jar_in_a_folder_and_one_in_a_wheel_are_audited(jni, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "app.jar").write_bytes(jar({JNI: jni["cudnn"]}))
    report = audit(tmp_path / "lib")
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{tmp_path}/lib/app.jar!/{JNI}", True)]

    whl = tmp_path / "pyspark_like-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("pkg/jars/app.jar", jar({JNI: jni["cudnn"]}))
    report = audit(whl)
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{whl}!/pkg/jars/app.jar!/{JNI}", True)]


def test_zip_archives_nested_past_the_limit_are_an_error(jni, tmp_path, capsys):
    data = jar({JNI: jni["cudnn"]})
    for _ in range(MAX_ZIP_DEPTH + 1):
        data = jar({"inner.jar": data})
    deep = tmp_path / "deep.jar"
    deep.write_bytes(data)
    rc, out, _ = cli(capsys, "check", deep)
    assert rc == EXIT_INPUT and f"zip archive nested more than {MAX_ZIP_DEPTH} deep: not read" in out
    assert "libcudnn" not in out  # nothing past the limit was read


def test_a_zip_holding_no_binary_is_data(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "docs.zip").write_bytes(jar({"index.html": b"<html></html>"}))
    (tmp_path / "d" / "libclean.so").write_bytes(b"")  # no ELF: nothing is audited, nothing fails
    report = audit(tmp_path / "d")
    assert report.files == [] and "no ELF file found" in " ".join(report.errors)


def test_a_conda_package_s_jar_is_audited(jni, tmp_path):
    from tests.test_conda import BUILDERS

    for fmt, build in BUILDERS.items():
        pkg = build(tmp_path, [("share/java/app.jar", "file", jar({JNI: jni["cudnn"]}))])
        report = audit(pkg)
        assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{pkg}!/share/java/app.jar!/{JNI}", True)], fmt


@pytest.mark.parametrize("how", [None, "gzip"])
def test_an_image_s_jar_is_audited_and_resolved_inside_itself_only(jni, tmp_path, how):
    """The jar's library resolves among the jar's members (libjniclean.so, NEEDED by name, found
    beside it) and nowhere else: the image's own libraries and this machine's are not searched."""
    from tests.image_fixtures import layer_tar, oci_layout

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "libjniclean.so").write_bytes(jni["clean"])
    needs = cc_shared(tmp_path / "b/libuser.so", "extern int Java_x_add(int, int);\nint u(void){return Java_x_add(1, 2);}\n",
                      f"-L{tmp_path / 'b'}", "-l:libjniclean.so")
    app = jar({JNI: jni["cudnn"], "native/libuser.so": needs.read_bytes(), "native/libjniclean.so": jni["clean"]})
    layer = layer_tar([("dir", "opt"), ("dir", "opt/app"), ("file", "opt/app/app.jar", app)])
    image = oci_layout(tmp_path / f"img-{how}", [layer], how=how)
    report = audit(image)
    files = {f.path: f for f in report.files}
    assert cudnn_needed(files[f"{image}!/opt/app/app.jar!/{JNI}"])
    user = files[f"{image}!/opt/app/app.jar!/native/libuser.so"]
    assert user.verdict == "pass"
    (dep,) = [c for c in user.tree.children if c.name == "libjniclean.so"]
    assert dep.how == "member" and "app.jar" in (dep.path or "")
    assert all("/usr/lib" not in (n.path or "") and "/lib/x86_64" not in (n.path or "")
               for f in report.files if f.tree for n, _ in f.tree.walk())


def test_the_confined_file_system_sees_nothing_outside_its_folder(tmp_path):
    from audit.errors import InputError
    from audit.linkage.resolution.fs import ConfinedFS
    from audit.linkage.resolution.ldso import Paths
    from audit.linkage.resolution.native import read_binary

    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libin.so").write_bytes(b"\x7fELF")
    (root / "lib" / "libout.so").symlink_to("/etc/passwd")
    (root / "lib" / "up").symlink_to("../..")
    fs = ConfinedFS(str(root), read_binary)
    paths = Paths(None, fs)
    assert fs.kind("/etc/passwd") is None and fs.listdir("/etc") is None and fs.head("/etc/passwd", 4) == b""
    assert fs.kind(str(root / "lib" / "libin.so")) == "file" and fs.kind(str(tmp_path)) == "dir"
    assert fs.listdir(str(tmp_path)) is None  # a folder above the root is a way in, not a listing
    assert paths.real(str(root / "lib" / "libin.so")) == str(root / "lib" / "libin.so")
    assert paths.real(str(root / "lib" / "libout.so")) is None
    assert paths.real(str(root / "lib" / "up" / "root" / "lib" / "libin.so")) in (None, str(root / "lib" / "libin.so"))
    with pytest.raises(InputError, match="outside the archive"):
        fs.read_elf("/bin/ls", None)


def test_a_conda_package_in_an_image_s_cache_is_read_as_a_conda_package(jni, tmp_path):
    """A .conda file is a zip whose members are compressed tars: in an image (conda's package
    cache) it is read as a conda package, its libraries resolved inside it only."""
    from tests.image_fixtures import layer_tar, oci_layout
    from tests.test_conda import BUILDERS

    pkg = BUILDERS["conda"](tmp_path, [("lib/libjnicudnn.so", "file", jni["cudnn"])]).read_bytes()
    layer = layer_tar([("dir", "opt"), ("dir", "opt/conda"), ("dir", "opt/conda/pkgs"),
                       ("file", "opt/conda/pkgs/demo-1.0-0.conda", pkg)])
    image = oci_layout(tmp_path / "img", [layer])
    report = audit(image)
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [
        (f"{image}!/opt/conda/pkgs/demo-1.0-0.conda!/lib/libjnicudnn.so", True)]


def test_too_many_zip_archives_inside_archives_are_an_error(jni, tmp_path, monkeypatch):
    from audit.linkage.containers import inputs

    monkeypatch.setattr(inputs, "MAX_NESTED_ZIPS", 3)
    app = tmp_path / "fat.jar"
    app.write_bytes(jar({f"lib/dep{i}.jar": jar({JNI: jni["clean"]}) for i in range(5)}))
    report = audit(app)
    errors = [f.path.rsplit("!/", 1)[1] for f in report.files if f.verdict == "error"]
    assert errors == ["lib/dep3.jar", "lib/dep4.jar"]
    assert all("more than 3 zip archives inside archives" in f.error for f in report.files if f.verdict == "error")
    assert sum(f.verdict == "pass" for f in report.files) == 3


def test_an_image_s_tarball_is_audited_inside_itself_only(jni, tmp_path):
    from tests.image_fixtures import layer_tar, oci_layout

    layer = layer_tar([("dir", "opt"), ("file", "opt/sdk.tar.gz", tarball({"sdk/lib/libjnicudnn.so": jni["cudnn"]}))])
    image = oci_layout(tmp_path / "img", [layer], how="gzip")
    report = audit(image)
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{image}!/opt/sdk.tar.gz!/sdk/lib/libjnicudnn.so", True)]


@pytest.mark.parametrize("how", [None, "gzip"])
def test_an_image_s_plain_tar_is_known_by_its_magic_whatever_its_name(jni, tmp_path, how):
    """A plain tar named neither .tar nor .tar.*: in a compressed layer only the first 64 bytes
    of a file were kept, too few to see the "ustar" at byte 257, so it passed as data."""
    from tests.image_fixtures import layer_tar, oci_layout

    payload = tarball({"sdk/lib/libjnicudnn.so": jni["cudnn"]}, mode="w")
    layer = layer_tar([("dir", "opt"), ("file", "opt/payload.bin", payload),
                       ("file", "opt/notes.txt", b"plain text\n" * 100)])
    image = oci_layout(tmp_path / f"img-{how}", [layer], how=how)
    report = audit(image)
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [
        (f"{image}!/opt/payload.bin!/sdk/lib/libjnicudnn.so", True)]


def test_a_debian_package_built_by_dpkg_deb_is_audited(jni, tmp_path):
    """A .deb (an ar archive: debian-binary, control.tar, data.tar) named, and one met in a folder:
    the files its data.tar installs are audited, named from the package."""
    import subprocess

    require_tool("dpkg-deb")
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text("Package: libjnicudnn\nVersion: 1.0\nArchitecture: amd64\n"
                                             "Maintainer: nobody <nobody@example.org>\nDescription: test\n")
    lib = root / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libjnicudnn.so.1").write_bytes(jni["cudnn"])
    (lib / "libjnicudnn.so").symlink_to("libjnicudnn.so.1")
    (tmp_path / "dist").mkdir()
    deb = tmp_path / "dist" / "libjnicudnn_1.0_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True)
    for arg in (deb, tmp_path / "dist"):
        report = audit(arg)
        assert [(f.path, cudnn_needed(f)) for f in report.files] == [
            (f"{deb}!/usr/lib/x86_64-linux-gnu/libjnicudnn.so.1", True)], arg


def test_a_debian_package_in_an_image_is_audited_inside_itself_only(jni, tmp_path):
    from tests.image_fixtures import layer_tar, oci_layout

    deb = dpkg_deb(tmp_path, {"usr/lib/libjnicudnn.so": jni["cudnn"]})
    layer = layer_tar([("dir", "var"), ("dir", "var/cache"), ("file", "var/cache/x_1_amd64.deb", deb.read_bytes())])
    image = oci_layout(tmp_path / "img", [layer], how="gzip")
    report = audit(image)
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [
        (f"{image}!/var/cache/x_1_amd64.deb!/usr/lib/libjnicudnn.so", True)]


def test_a_conda_package_s_tarball_and_deb_are_audited(jni, tmp_path):
    """A conda package reads its members as every other container does: a tarball or a .deb it
    ships is opened and its libraries audited (they were skipped as data)."""
    from tests.test_conda import BUILDERS

    sdk = tarball({"sdk/lib/libjnicudnn.so": jni["cudnn"]})
    deb = dpkg_deb(tmp_path, {"usr/lib/libjnicudnn.so": jni["cudnn"]})
    for fmt, build in BUILDERS.items():
        pkg = build(tmp_path, [("share/sdk.tar.gz", "file", sdk),
                               ("share/debs/x_1_amd64.deb", "file", deb.read_bytes())])
        report = audit(pkg)
        assert sorted((f.path, cudnn_needed(f)) for f in report.files) == [
            (f"{pkg}!/share/debs/x_1_amd64.deb!/usr/lib/libjnicudnn.so", True),
            (f"{pkg}!/share/sdk.tar.gz!/sdk/lib/libjnicudnn.so", True)], fmt
        assert report.verdict == "fail"


def test_a_tar_member_given_twice_is_the_last_one(tmp_path):
    """As extraction leaves it: a Python loader replaced by a later member of the same name that
    loads nothing is not judged (and not reported unreadable)."""
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for data in (b'import ctypes\nctypes.CDLL("libcudnn.so.9")\n', b"import os\n"):
            ti = tarfile.TarInfo("demo/_load.py")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "demo.tar.gz").write_bytes(buf.getvalue())
    report = audit(tmp_path / "d")
    assert report.files == [] and report.skipped.get("compressed_tar") == 1


def _rpm(tmp_path, lib: Path, payload: str | None = None, links: bool = False) -> Path:
    """fk-1.0-1.x86_64.rpm, built by rpmbuild, installing `lib` as /usr/lib/libfk.so; its payload
    compressed as `payload` says (rpm's `_binary_payload`, e.g. w2.xzdio; None: rpmbuild's
    default); with `links`, also a hard link (/usr/lib/libfk-hard.so) and a symlink to it
    (/usr/lib/libfk.so.1)."""
    top = tmp_path / f"rpmbuild-{payload or 'default'}{'-links' if links else ''}"
    spec = top.with_suffix(".spec")
    more = ("ln %{buildroot}/usr/lib/libfk.so %{buildroot}/usr/lib/libfk-hard.so\n"
            "ln -s libfk.so %{buildroot}/usr/lib/libfk.so.1\n") if links else ""
    spec.write_text(f"Name: fk\nVersion: 1.0\nRelease: 1\nSummary: fk\nLicense: MIT\nBuildArch: x86_64\n"
                    f"%description\nfk\n%install\nmkdir -p %{{buildroot}}/usr/lib\n"
                    f"cp {lib} %{{buildroot}}/usr/lib/libfk.so\n{more}%files\n/usr/lib/libfk*\n")
    import subprocess

    subprocess.run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {top}", "--define", "debug_package %{nil}",
                    "--define", "__strip /bin/true", *(["--define", f"_binary_payload {payload}"] if payload else []),
                    str(spec)], check=True, capture_output=True)
    (rpm,) = top.glob("RPMS/*/*.rpm")
    return rpm


# archive formats the audit cannot open yet, each made by its own tool around a gcc-built library
OPAQUE = {
    "cpio": ("bsdtar", "cpio archive", lambda d, lib: _bsdtar(d, lib, "cpio", "lib.cpio")),
    "7-zip": ("bsdtar", "7-Zip archive", lambda d, lib: _bsdtar(d, lib, "7zip", "lib.7z")),
    "xar": ("bsdtar", "xar archive (macOS installer package)", lambda d, lib: _bsdtar(d, lib, "xar", "lib.pkg")),
    "cab": ("gcab", "Microsoft cabinet archive", lambda d, lib: _run_tool(d, "lib.cab", ["gcab", "-c", "-n", "lib.cab", str(lib)])),
    "squashfs": ("mksquashfs", "squashfs image",
                 lambda d, lib: _run_tool(d, "lib.sqsh", ["mksquashfs", str(lib.parent), "lib.sqsh", "-quiet", "-noappend"])),
}


def _run_tool(d: Path, out: str, cmd: list[str]) -> Path:
    import subprocess

    subprocess.run(cmd, cwd=d, check=True, capture_output=True)
    return d / out


def _bsdtar(d: Path, lib: Path, fmt: str, out: str) -> Path:
    return _run_tool(d, out, ["bsdtar", "--format", fmt, "-cf", out, "-C", str(lib.parent), lib.name])


@pytest.mark.parametrize("fmt", sorted(OPAQUE))
def test_an_archive_the_audit_cannot_open_is_an_error_never_data(jni, tmp_path, fmt):
    """Before, each of these passed in a folder as data, whatever it held."""
    tool, name, make = OPAQUE[fmt]
    require_tool(tool)
    src = tmp_path / "src"
    src.mkdir()
    lib = src / "libjnicudnn.so"
    lib.write_bytes(jni["cudnn"])
    made = make(tmp_path, lib)
    (tmp_path / "dist").mkdir()
    placed = tmp_path / "dist" / made.name
    made.rename(placed)
    report = audit(tmp_path / "dist")
    assert [(f.path, f.verdict, f.error) for f in report.files] == [(str(placed), "error", f"{name}: format not audited")]


@pytest.fixture
def rpm_of(jni, tmp_path):
    """rpm_of(which="cudnn", **_rpm's options): an RPM built by rpmbuild holding the gcc-built
    library that NEEDs libcudnn.so.9 (or the clean one), as /usr/lib/libfk.so."""
    require_tool("rpmbuild")

    def make(which: str = "cudnn", **kw) -> Path:
        src = tmp_path / f"src-{which}"
        src.mkdir(exist_ok=True)
        (src / "libjni.so").write_bytes(jni[which])
        return _rpm(tmp_path, src / "libjni.so", **kw)

    return make


def _placed(made: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return made.rename(folder / made.name)


def test_an_rpm_built_by_rpmbuild_is_audited_named_and_in_a_folder(rpm_of, tmp_path):
    """The files an RPM's payload installs are audited, named from the package; before, the RPM
    was an error ("RPM package: format not audited") and its library never read."""
    rpm = _placed(rpm_of(), tmp_path / "dist")
    for arg in (rpm, tmp_path / "dist"):
        report = audit(arg)
        assert [(f.path, f.verdict, cudnn_needed(f)) for f in report.files] == [
            (f"{rpm}!/usr/lib/libfk.so", "fail", True)], arg
        assert report.exit_code == EXIT_VIOLATION


def test_a_clean_rpm_passes(rpm_of, tmp_path):
    rpm = _placed(rpm_of("clean"), tmp_path / "dist")
    report = audit(rpm)
    assert [(f.path, f.verdict) for f in report.files] == [(f"{rpm}!/usr/lib/libfk.so", "pass")]
    assert report.exit_code == EXIT_OK


# rpm's payload compressors (`_binary_payload`) and the name its PAYLOADCOMPRESSOR tag gives each
RPM_PAYLOADS = {"w9.gzdio": "gzip", "w2.xzdio": "xz", "w19.zstdio": "zstd", "w9.bzdio": "bzip2",
                "w6.lzdio": "lzma", "w0.ufdio": "(none)"}


@pytest.mark.parametrize("payload", sorted(RPM_PAYLOADS))
def test_an_rpm_is_read_whatever_its_payload_compression(rpm_of, tmp_path, payload):
    import subprocess

    rpm_tool = require_tool("rpm")
    try:
        rpm = rpm_of(payload=payload)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"this rpmbuild cannot write a {payload} payload: {exc.stderr.decode()[-200:]}")
    used = subprocess.run([rpm_tool, "-qp", "--qf", "%{PAYLOADCOMPRESSOR}", str(rpm)], check=True,
                          capture_output=True, text=True).stdout
    if used != RPM_PAYLOADS[payload]:
        pytest.skip(f"this rpmbuild wrote a {used} payload when asked for {payload}")
    report = audit(rpm)
    assert [(f.path, f.verdict, cudnn_needed(f)) for f in report.files] == [
        (f"{rpm}!/usr/lib/libfk.so", "fail", True)]


def test_an_rpm_s_hard_link_and_symlink_are_its_library_audited_once(rpm_of):
    """In the payload a hard link's earlier names are empty (the data comes with the last one) and
    a symlink holds its target: the library is audited once, under the name that carries it."""
    rpm = rpm_of(links=True)
    report = audit(rpm)
    assert len(report.files) == 1 and cudnn_needed(report.files[0])
    assert report.files[0].path in (f"{rpm}!/usr/lib/libfk.so", f"{rpm}!/usr/lib/libfk-hard.so")


@pytest.mark.parametrize("cut", ["half", "payload"])
def test_a_truncated_rpm_is_an_input_error_in_one_line(rpm_of, tmp_path, capsys, cut):
    """rpmbuild's bytes cut in half (inside its headers) or 64 bytes short (inside its payload):
    an input error (exit 3) saying it is truncated, never a pass, never a traceback."""
    data = rpm_of().read_bytes()
    bad = tmp_path / "dist" / "fk-cut.rpm"
    bad.parent.mkdir()
    bad.write_bytes(data[:len(data) // 2] if cut == "half" else data[:-64])
    report = audit(bad)
    (f,) = report.files
    assert f.path == str(bad) and f.verdict == "error" and "truncated RPM" in f.error, f.error
    assert report.exit_code == EXIT_INPUT
    for arg in (bad, bad.parent):
        rc, out, err = cli(capsys, "check", arg)
        assert rc == EXIT_INPUT and "truncated RPM" in out and "Traceback" not in out + err


def test_an_rpm_whose_payload_cannot_be_read_is_an_error_naming_its_compressor(rpm_of, tmp_path):
    """rpmbuild's xz payload with its magic bytes zeroed: a compression this does not know is an
    error naming what the package's header says, never data."""
    data = bytearray(rpm_of(payload="w2.xzdio").read_bytes())
    at = data.index(b"\xfd7zXZ\x00")  # the payload's first bytes (six bytes no header holds by chance)
    data[at:at + 6] = bytes(6)
    bad = tmp_path / "fk-damaged.rpm"
    bad.write_bytes(bytes(data))
    report = audit(bad)
    assert [(f.path, f.verdict) for f in report.files] == [(str(bad), "error")]
    assert "payload compressed with xz" in report.files[0].error and report.exit_code == EXIT_INPUT


def test_an_rpm_in_an_image_is_audited_inside_itself_only(rpm_of, tmp_path):
    from tests.image_fixtures import layer_tar, oci_layout

    rpm = rpm_of()
    layer = layer_tar([("dir", "var"), ("dir", "var/cache"), ("file", "var/cache/fk.rpm", rpm.read_bytes())])
    image = oci_layout(tmp_path / "img", [layer], how="gzip")
    report = audit(image)
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{image}!/var/cache/fk.rpm!/usr/lib/libfk.so", True)]


def test_an_rpm_in_a_wheel_a_tarball_and_a_conda_package_is_audited(rpm_of, tmp_path):
    for arg, inner in in_wheel_tarball_and_conda(tmp_path, "fk.rpm", rpm_of().read_bytes()):
        report = audit(arg)
        assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{arg}!/{inner}!/usr/lib/libfk.so", True)]
        assert report.verdict == "fail"


def test_an_image_inside_a_wheel_is_an_error_not_loose_files(tmp_path):
    """A docker save tar inside a wheel: its layers are not audited as loose files of the wheel."""
    from tests.image_fixtures import docker_archive, layer_tar

    image = docker_archive(tmp_path / "app.tar", [layer_tar([("file", "README", b"x\n")])])
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("demo/app.tar", image.read_bytes())
    report = audit(whl)
    assert [(f.path, f.verdict, f.error) for f in report.files] == [
        (f"{whl}!/demo/app.tar", "error", "a container image inside an archive: audit it as a file of its own")]


def test_tarballs_inside_archives_share_one_byte_budget(jni, tmp_path, capsys):
    """Each nested tarball was read within its own --max-archive-size: many of them could write
    far more than one budget to the runner's disk. Now all nesting shares one, as zips do."""
    member = jni["cudnn"] + bytes(60 << 20)  # an ELF, then 60 MiB of zeros: ~60 KiB compressed
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for k in ("a", "b"):
            zf.writestr(f"demo/{k}.tar.gz", tarball({f"lib/lib{k}.so": member}))
    rc, out, err = cli(capsys, "check", whl, "--max-archive-size", str(100 << 20))
    assert rc == EXIT_INPUT, out + err
    assert "a.tar.gz!/lib/liba.so" in out and "archives inside archives unpack to more than" in out + err


def _newc(tmp_path: Path, files: dict[str, bytes]) -> bytes:
    """A cpio archive in the newc format (an initramfs's), written by bsdtar."""
    import subprocess

    require_tool("bsdtar")
    root = tmp_path / "cpio-root"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return subprocess.run(["bsdtar", "--format", "newc", "-cf", "-", "-C", str(root), *files],
                          check=True, capture_output=True).stdout


def test_a_newc_cpio_archive_is_read_named_in_a_folder_compressed_and_in_an_image(jni, tmp_path):
    """A newc cpio (what an initramfs is; an RPM's payload format) was an error, "cpio archive:
    format not audited"; its files are now audited as a tarball's are. The odc format stays an
    error (the table above)."""
    import gzip

    from tests.image_fixtures import layer_tar, oci_layout

    data = _newc(tmp_path, {"usr/lib/libjnicudnn.so": jni["cudnn"], "etc/hostname": b"box\n"})
    d = tmp_path / "boot"
    d.mkdir()
    (d / "initrd.cpio").write_bytes(data)
    (d / "initrd.img").write_bytes(gzip.compress(data))
    report = audit(d / "initrd.cpio")
    assert [(f.path, cudnn_needed(f)) for f in report.files] == [(f"{d}/initrd.cpio!/usr/lib/libjnicudnn.so", True)]
    report = audit(d)
    assert sorted((f.path, cudnn_needed(f)) for f in report.files) == [
        (f"{d}/initrd.cpio!/usr/lib/libjnicudnn.so", True),
        (f"{d}/initrd.img!/initrd.img.decompressed!/usr/lib/libjnicudnn.so", True)]
    image = oci_layout(tmp_path / "img", [layer_tar([("dir", "boot"), ("file", "boot/initrd.cpio", data)])], how="gzip")
    assert [(f.path, cudnn_needed(f)) for f in audit(image).files] == [
        (f"{image}!/boot/initrd.cpio!/usr/lib/libjnicudnn.so", True)]


def test_a_cut_newc_cpio_archive_is_an_error(jni, tmp_path, capsys):
    data = _newc(tmp_path, {"usr/lib/libjnicudnn.so": jni["cudnn"]})
    cut = tmp_path / "initrd.cpio"
    cut.write_bytes(data[:len(data) // 2])
    rc, out, err = cli(capsys, "check", cut)
    assert rc == EXIT_INPUT and "truncated cpio archive" in out + err and "Traceback" not in out + err
