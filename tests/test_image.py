"""`check IMAGE`: Docker archives and OCI layouts built as files (no container runtime); the
libraries in them are real gcc-built ELF files, resolved inside the image."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from conftest import require_tool
from image_fixtures import docker_archive, layer_tar, oci_layout
from linkage_fixtures import cc_shared

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from cli_runner import cli

TRIPLET_LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.fixture(scope="session")
def elf(fixture_root) -> dict[str, bytes]:
    """Real shared objects: a stub libcudnn, a library that NEEDs it, and clean ones whose
    dependencies only the image's ld.so.conf and Env LD_LIBRARY_PATH can find."""
    require_tool("gcc")
    d = Path(fixture_root) / "image-libs"
    out = {}
    cudnn = cc_shared(d / "vendor/libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    out["cudnn"] = cudnn.read_bytes()
    out["bad"] = cc_shared(d / "bad/libbad.so", "extern int cudnnCreate(void);\nint f(void){return cudnnCreate();}\n",
                           f"-L{cudnn.parent}", "-l:libcudnn.so.9").read_bytes()
    out["top"] = cc_shared(d / "top/libtop.so", "extern int f(void);\nint top(void){return f();}\n",
                           f"-L{d / 'bad'}", "-lbad").read_bytes()
    vx = cc_shared(d / "vx/libvendorx.so.1", "int vx(void){return 1;}\n", "-Wl,-soname,libvendorx.so.1")
    hp = cc_shared(d / "hp/libhelper.so", "int hp(void){return 2;}\n", "-Wl,-soname,libhelper.so")
    out["vendorx"], out["helper"] = vx.read_bytes(), hp.read_bytes()
    out["app"] = cc_shared(d / "app/libapp.so", "extern int vx(void), hp(void);\nint app(void){return vx()+hp();}\n",
                           f"-L{vx.parent}", f"-L{hp.parent}", "-l:libvendorx.so.1", "-lhelper").read_bytes()
    libc = next(Path(p) for p in (TRIPLET_LIBC, "/usr" + TRIPLET_LIBC) if Path(p).exists())
    out["libc"] = libc.read_bytes()
    out["ldso"] = (libc.parent / "ld-linux-x86-64.so.2").read_bytes()
    return out


def base_layer(elf) -> bytes:
    return layer_tar([
        ("dir", "lib"), ("dir", "lib/x86_64-linux-gnu"),
        ("file", "lib/x86_64-linux-gnu/libc.so.6", elf["libc"]),
        ("file", "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", elf["ldso"]),
        ("file", "etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n"),
        ("file", "etc/ld.so.conf.d/vendor.conf", b"/opt/vendor/lib\n"),
        ("file", "opt/vendor/lib/libvendorx.so.1.0", elf["vendorx"]),
        ("symlink", "opt/vendor/lib/libvendorx.so.1", "/opt/vendor/lib/libvendorx.so.1.0"),
        ("file", "opt/helper/libhelper.so", elf["helper"]),
        ("file", "app/libapp.so", elf["app"]),
        ("file", "etc/hostname", b"box\n"),
        # a symlink loop: resolution gives up on it, as ld.so does
        ("symlink", "usr/lib/loop1", "loop2"), ("symlink", "usr/lib/loop2", "/usr/lib/loop1"),
    ])


def bad_layer(elf) -> bytes:
    return layer_tar([("file", "usr/lib/libbad.so", elf["bad"]), ("hardlink", "usr/lib/libbad-copy.so",
                                                                    "usr/lib/libbad.so")])


CREATED = ["ADD rootfs /", "COPY libbad.so /usr/lib/", "RUN rm /usr/lib/libbad.so*"]
ENV = ["PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/helper"]


def audit(*paths):
    return check_paths([str(p) for p in paths], load_policy(None))


def by_path(report):
    return {f.path: f for f in report.files}


@pytest.mark.parametrize("blobs", [False, True], ids=["legacy", "blobs"])
def test_docker_archive_finds_the_layer_that_added_a_denied_needed(elf, tmp_path, blobs):
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf)], CREATED[:2], ENV, blobs=blobs)
    report = audit(img)
    files = by_path(report)
    assert report.exit_code == EXIT_VIOLATION
    bad = files[f"{img}!/usr/lib/libbad.so"]
    assert bad.verdict == "fail"
    needed = [f for f in bad.findings if f.kind == "needed"]
    assert [f.subject for f in needed] == ["libcudnn.so.9"]
    assert bad.layer["index"] == 2 and bad.layer["created_by"] == "COPY libbad.so /usr/lib/"
    assert bad.layer["digest"].startswith("sha256:") and len(bad.layer["digest"]) == 71
    # the hard link is the same bytes: audited once
    assert f"{img}!/usr/lib/libbad-copy.so" not in files and report.skipped.get("duplicate") == 1
    # the clean library resolves inside the image: ld.so.conf's include, an absolute symlink, Env
    app = files[f"{img}!/app/libapp.so"]
    assert app.verdict == "pass", app.findings
    kids = {c.name: c for c in app.tree.children}
    assert (kids["libvendorx.so.1"].how, kids["libvendorx.so.1"].realpath) == (
        "ld.so.conf", f"{img}!/opt/vendor/lib/libvendorx.so.1.0")
    assert (kids["libhelper.so"].how, kids["libhelper.so"].path) == ("LD_LIBRARY_PATH",
                                                                     f"{img}!/opt/helper/libhelper.so")
    assert (kids["libc.so.6"].status, kids["libc.so.6"].path) == ("trusted", f"{img}!{TRIPLET_LIBC}")
    assert files[f"{img}!{TRIPLET_LIBC}"].layer["index"] == 1
    assert files[f"{img}!{TRIPLET_LIBC}"].layer["created_by"] == "ADD rootfs /"


def test_whiteout_in_a_later_layer_deletes_the_file(elf, tmp_path):
    gone = layer_tar([("whiteout", "usr/lib/libbad.so"), ("whiteout", "usr/lib/libbad-copy.so")])
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf), gone], CREATED, ENV)
    report = audit(img)
    assert report.exit_code == EXIT_OK, [(f.path, f.findings, f.error) for f in report.files if f.verdict != "pass"]
    assert not [p for p in by_path(report) if "libbad" in p]


def test_opaque_directory_hides_lower_layers_but_keeps_its_own_layer(elf, tmp_path):
    again = layer_tar([("opaque", "usr/lib"), ("file", "usr/lib/libapp2.so", elf["app"])])
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf), again], CREATED, ENV)
    files = by_path(audit(img))
    assert f"{img}!/usr/lib/libapp2.so" in files
    assert not [p for p in files if "libbad" in p]


def test_a_file_replacing_a_library_in_a_higher_layer_wins(elf, tmp_path):
    # layer 3 puts a clean library where libbad.so was: the final file is the clean one
    over = layer_tar([("file", "usr/lib/libbad.so", elf["helper"]), ("whiteout", "usr/lib/libbad-copy.so")])
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf), over], CREATED, ENV)
    report = audit(img)
    fr = by_path(report)[f"{img}!/usr/lib/libbad.so"]
    assert fr.verdict == "pass" and fr.layer["index"] == 3 and fr.soname == "libhelper.so"


@pytest.mark.parametrize("how", [None, "gzip", "zstd"])
@pytest.mark.parametrize("as_tar", [False, True])
def test_oci_layout_directory_and_tar_compressed_layers(elf, tmp_path, how, as_tar):
    out = tmp_path / ("oci.tar" if as_tar else "oci")
    img = oci_layout(out, [base_layer(elf), bad_layer(elf)], CREATED[:2], ENV, how=how, as_tar=as_tar)
    report = audit(img)
    files = by_path(report)
    bad = files[f"{img}!/usr/lib/libbad.so"]
    assert report.exit_code == EXIT_VIOLATION
    assert [f.subject for f in bad.findings if f.kind == "needed"] == ["libcudnn.so.9"]
    assert bad.layer["index"] == 2
    app = files[f"{img}!/app/libapp.so"]
    assert app.verdict == "pass" and {c.how for c in app.tree.children} >= {"ld.so.conf", "LD_LIBRARY_PATH"}


def test_cli_output_names_image_members_and_layers(elf, tmp_path, capsys):
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf)], CREATED[:2], ENV)
    rc, out, _ = cli(capsys, "check", img, "--format", "text", "--format", f"json={tmp_path / 'r.json'}",
                     "--format", f"sarif={tmp_path / 'r.sarif'}", "--format", f"github={tmp_path / 'gh.txt'}")
    assert rc == EXIT_VIOLATION, out
    assert f"FAIL  {img}!/usr/lib/libbad.so" in out
    assert "layer 2 sha256:" in out and "COPY libbad.so /usr/lib/" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    bad = next(f for f in doc["files"] if f["path"].endswith("!/usr/lib/libbad.so"))
    assert bad["layer"]["created_by"] == "COPY libbad.so /usr/lib/"
    sarif = json.loads((tmp_path / "r.sarif").read_text())
    res0 = next(r for r in sarif["runs"][0]["results"] if r["properties"]["evidence"] == "needed")
    assert res0["properties"]["layer"]["index"] == 2
    annotation = next(line for line in (tmp_path / "gh.txt").read_text().splitlines() if "libcudnn.so.9" in line)
    assert "Added by layer 2 sha256:" in annotation and "COPY libbad.so /usr/lib/" in annotation


# ---------------------------------------------------------------- hostile or broken images


def _tamper_blob(files, names):
    name = names[1] if "/" in names[1] else f"blobs/sha256/{names[1]}"
    data = bytearray(files[name])
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern in the middle of the blob
    files[name] = bytes(data)


def _damage_header(files, names):
    data = bytearray(files[names[1]])
    data[124] ^= 0x7F  # the first member's size field: the tar no longer parses
    files[names[1]] = bytes(data)


def _config_of_wrong_types(files, _names):
    """A config whose fields have the wrong JSON types, under its own (valid) digest."""
    import hashlib

    old = next(k for k in files if k.endswith(".json") and k != "manifest.json")
    new = b'{"rootfs": "x", "config": [1], "history": 7}'
    del files[old]
    files[hashlib.sha256(new).hexdigest() + ".json"] = new
    manifest = json.loads(files["manifest.json"])
    manifest[0]["Config"] = hashlib.sha256(new).hexdigest() + ".json"
    files["manifest.json"] = json.dumps(manifest).encode()


def _drop_blob(files, names):
    del files[names[1] if "/" in names[1] else f"blobs/sha256/{names[1]}"]


BROKEN = {
    "digest mismatch": lambda d, elf: docker_archive(d / "i.tar", [base_layer(elf), bad_layer(elf)],
                                                     tamper=_tamper_blob),
    "damaged header": lambda d, elf: docker_archive(d / "i.tar", [base_layer(elf), bad_layer(elf)],
                                                    tamper=_damage_header),
    "blobs digest mismatch": lambda d, elf: docker_archive(d / "i.tar", [base_layer(elf), bad_layer(elf)],
                                                           blobs=True, tamper=_tamper_blob),
    "config of wrong types": lambda d, elf: docker_archive(d / "i.tar", [base_layer(elf)],
                                                           tamper=_config_of_wrong_types),
    "nested manifest": lambda d, elf: docker_archive(
        d / "i.tar", [base_layer(elf)], tamper=lambda f, n: f.update({"manifest.json": b"[" * 100000})),
    "missing blob": lambda d, elf: docker_archive(d / "i.tar", [base_layer(elf), bad_layer(elf)], tamper=_drop_blob),
    "oci digest mismatch": lambda d, elf: oci_layout(d / "o", [base_layer(elf), bad_layer(elf)], how="gzip",
                                                     tamper=_tamper_blob),
    "oci missing blob": lambda d, elf: oci_layout(d / "o.tar", [base_layer(elf)], as_tar=True,
                                                  tamper=lambda f, n: f.pop(f"blobs/sha256/{n[0]}")),
    "dotdot member": lambda d, elf: docker_archive(d / "i.tar", [layer_tar([("file", "usr/../../evil.so",
                                                                              elf["helper"])])]),
    "escaping symlink": lambda d, elf: docker_archive(d / "i.tar", [layer_tar([
        ("symlink", "usr/lib/escape", "../../../../tmp"), ("file", "usr/lib/escape/evil.so", elf["helper"])])]),
    "absolute escaping symlink": lambda d, elf: docker_archive(d / "i.tar", [layer_tar([
        ("symlink", "usr/lib/root", "/../../etc")])]),
    "not an image": lambda d, elf: _plain_tar(d / "plain.tar"),
    "gzipped archive": lambda d, elf: _gzipped(docker_archive(d / "i.tar", [base_layer(elf)])),
}


def _gzipped(path: Path) -> Path:
    out = path.with_name(path.name + ".gz")
    out.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return out


def _plain_tar(out: Path) -> Path:
    out.write_bytes(layer_tar([("file", "README", b"hello\n")]))
    return out


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_or_hostile_image_is_an_input_error(elf, tmp_path, case, capsys):
    work = tmp_path / "work"
    work.mkdir()
    img = BROKEN[case](work, elf)
    before = sorted(p for p in tmp_path.rglob("*"))
    rc, out, err_text = cli(capsys, "check", img)
    assert rc == EXIT_INPUT, out + err_text
    assert "Traceback" not in out + err_text
    err = [line for line in out.splitlines() if line.strip().startswith("error:")]
    assert len(err) == 1, out
    expect = {"digest mismatch": "digest mismatch", "blobs digest mismatch": "digest mismatch",
              "config of wrong types": "layer digests", "nested manifest": "not valid JSON",
              "damaged header": "digest mismatch", "missing blob": "missing blob", "oci digest mismatch": "digest",
              "oci missing blob": "missing blob", "dotdot member": "unsafe member path",
              "escaping symlink": "escapes the image root", "absolute escaping symlink": "escapes the image root",
              "not an image": "not a container image", "gzipped archive": "decompress it first"}[case]
    assert expect in err[0]
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written
    assert not os.path.exists("/evil.so") and not Path(tmp_path.anchor, "tmp", "evil.so").exists()


@pytest.mark.parametrize("how", [None, "gzip"])
def test_workers_give_the_same_report(elf, tmp_path, how):
    img = oci_layout(tmp_path / "oci.tar", [base_layer(elf), bad_layer(elf)], CREATED[:2], ENV, how=how, as_tar=True)
    reports = [check_paths([str(img)], load_policy(None), jobs=jobs).to_dict() for jobs in (1, 2)]
    for r in reports:
        r.pop("elapsed_s", None)
    assert reports[0] == reports[1]
    assert reports[0]["exit_code"] == EXIT_VIOLATION


@pytest.mark.parametrize("how", [None, "zstd"])
def test_runtime_loading_evidence_is_found_inside_an_image(elf, tmp_path, how):
    """dlsym names and a library name built in code: the same evidence as for the file on disk."""
    from test_discovery import CUDNN_API, runtime_loader

    lib = runtime_loader(tmp_path / "build/libprovider.so", "libcudnn.so.9", CUDNN_API)
    on_disk = {(f.rule, f.kind, f.subject) for f in audit(lib).files[0].findings}
    assert ("nvidia.cudnn", "assembled-name", "libcudnn.so.9") in on_disk
    img = oci_layout(tmp_path / "oci", [base_layer(elf), layer_tar([("file", "opt/libprovider.so", lib.read_bytes())])],
                     how=how)
    fr = by_path(audit(img))[f"{img}!/opt/libprovider.so"]
    assert {(f.rule, f.kind, f.subject) for f in fr.findings} == on_disk


def test_oci_nested_index_picks_this_machines_platform(elf, tmp_path):
    """index.json -> an image index (multi-platform, with a buildx attestation) -> manifests."""
    import hashlib

    def nest(files, _names):
        top = json.loads(files["index.json"])
        amd64 = top["manifests"][0]
        other = dict(amd64, platform={"architecture": "arm64", "os": "linux"})
        attest = dict(amd64, platform={"architecture": "unknown", "os": "unknown"})
        inner = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                            "manifests": [attest, other, amd64]}).encode()
        digest = hashlib.sha256(inner).hexdigest()
        files[f"blobs/sha256/{digest}"] = inner
        files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{digest}",
             "size": len(inner)}]}).encode()

    img = oci_layout(tmp_path / "oci", [base_layer(elf), bad_layer(elf)], CREATED[:2], ENV, tamper=nest)
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the index names amd64 and arm64 only")
    report = audit(img)
    assert report.exit_code == EXIT_VIOLATION
    assert f"{img}!/usr/lib/libbad.so" in by_path(report)


def test_archive_limits_apply_to_image_files(elf, tmp_path, capsys):
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf)], CREATED[:2], ENV)
    limit = len(elf["app"]) + 1  # libapp.so fits; libc and the rest do not
    rc, out, _ = cli(capsys, "check", "--max-member-size", str(limit), "--format", "json", img)
    assert rc == EXIT_INPUT
    verdicts = {f["path"].split("!", 1)[1]: (f["verdict"], f["error"]) for f in json.loads(out)["files"]}
    assert verdicts["/app/libapp.so"][0] == "pass"
    assert verdicts[TRIPLET_LIBC][0] == "error" and "--max-member-size" in verdicts[TRIPLET_LIBC][1]


def test_a_layer_writes_through_a_lower_layers_directory_symlink(elf, tmp_path):
    """Merged /usr: /lib -> usr/lib in the base; a layer's lib/x86_64-linux-gnu/libbad.so lands in
    /usr/lib/x86_64-linux-gnu (extraction follows the symlink) and /lib stays a symlink."""
    base = layer_tar([
        ("symlink", "lib", "usr/lib"),
        ("file", "usr/lib/x86_64-linux-gnu/libc.so.6", elf["libc"]),
        ("file", "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", elf["ldso"]),
    ])
    upper = layer_tar([("file", "lib/x86_64-linux-gnu/libbad.so", elf["bad"])])
    gone = layer_tar([("whiteout", "lib/x86_64-linux-gnu/libbad.so")])
    img = docker_archive(tmp_path / "a.tar", [base, upper])
    files = by_path(audit(img))
    bad = files[f"{img}!/usr/lib/x86_64-linux-gnu/libbad.so"]
    assert bad.layer["index"] == 2
    libc = next(c for c in bad.tree.children if c.name == "libc.so.6")
    assert libc.status == "trusted" and libc.path == f"{img}!/lib/x86_64-linux-gnu/libc.so.6"  # via the symlink
    img2 = docker_archive(tmp_path / "b.tar", [base, upper, gone])
    assert not [p for p in by_path(audit(img2)) if "libbad" in p]


def test_dependencies_are_named_inside_the_image(elf, tmp_path):
    """A library's dependency is named IMAGE!/path, and its matches stay under its own result."""
    top = layer_tar([("file", "app/libtop.so", elf["top"])])
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf), top], CREATED[:2] + ["COPY top"], ENV)
    files = by_path(audit(img))
    found = [f for f in files[f"{img}!/app/libtop.so"].findings if f.kind == "imported-symbol"]
    assert [(f.subject, f.in_file, f.matches_in) for f in found] == [
        ("cudnnCreate", f"{img}!/usr/lib/libbad.so", f"{img}!/usr/lib/libbad.so")]
    assert files[f"{img}!/app/libtop.so"].tree.children[0].path == f"{img}!/usr/lib/libbad.so"


def _verdicts(report, prefix: str) -> dict[str, tuple]:
    """Each audited file under `prefix`: (verdict, finding kinds and subjects, layer index), by its path in it."""
    return {f.path[len(prefix):]: (f.verdict, sorted((x.kind, x.subject) for x in f.findings),
                                   (f.layer or {}).get("index"))
            for f in report.files if f.path.startswith(prefix)}


def test_images_in_a_folder_are_audited_as_when_named(elf, tmp_path, capsys):
    """As wheels met in a folder are: a docker save tar, an OCI layout tar and an OCI layout
    folder are each audited as an image (not walked, not skipped); a tar that is no image has its
    members read (none here needs it: counted)."""
    dist = tmp_path / "dist"
    (dist / "nested").mkdir(parents=True)
    layers = [base_layer(elf), bad_layer(elf)]
    docker = docker_archive(dist / "app.tar", layers, CREATED[:2], ENV)
    oci_tar = oci_layout(dist / "oci.tar", layers, CREATED[:2], ENV, how="gzip", as_tar=True)
    oci_dir = oci_layout(dist / "nested/oci", layers, CREATED[:2], ENV)
    (dist / "notes.tar").write_bytes(layer_tar([("file", "README", b"not an image\n")]))
    (dist / "libbad.so").write_bytes(elf["bad"])
    report = audit(dist)
    for img in (docker, oci_tar, oci_dir):
        alone = audit(img)
        assert _verdicts(report, f"{img}!") == _verdicts(alone, f"{img}!") != {}
        assert _verdicts(report, f"{img}!")["/usr/lib/libbad.so"][0] == "fail"
    assert not [f.path for f in report.files if "/nested/oci/" in f.path]  # its blobs are not walked
    assert {f.path: f.verdict for f in report.files if "!" not in f.path} == {str(dist / "libbad.so"): "fail"}
    assert report.skipped["tar"] == 1  # notes.tar: read, nothing in it to audit
    rc, out, _ = cli(capsys, "check", dist, "--format", "json")
    doc = json.loads(out)
    assert rc == EXIT_VIOLATION and doc["summary"]["skipped"]["tar"] == 1
    # inspect lists the same files as check
    rc, out, _ = cli(capsys, "inspect", "--json", "--no-deps", dist)
    assert sorted(f["path"] for f in json.loads(out)["files"]) == sorted(f.path for f in report.files)


def test_a_compressed_image_in_a_folder_is_an_error_not_loose_files(elf, tmp_path):
    """A gzipped `docker save` is not read as a tarball (its layers' files would be audited as
    loose files, resolved on this machine): an error, as when it is named."""
    dist = tmp_path / "dist"
    dist.mkdir()
    docker = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf)], CREATED[:2], ENV)
    (dist / "app.tar.gz").write_bytes(gzip.compress(docker.read_bytes()))
    report = audit(dist)
    assert [(f.path, f.verdict) for f in report.files] == [(str(dist / "app.tar.gz"), "error")]
    assert report.files[0].error.startswith("a compressed container image: decompress it first")


def test_workers_send_back_no_matches_of_a_dependency_audited_in_the_run(elf, tmp_path, monkeypatch):
    """A worker's result leaves out the matches of findings in an image file that is itself
    audited in the run (the report lists them once, under that file): a torch image's
    libtorch_cpu names would otherwise travel back with every file that loads it."""
    import audit.linkage.check as check

    top = layer_tar([("file", "app/libtop.so", elf["top"])])
    img = docker_archive(tmp_path / "app.tar", [base_layer(elf), bad_layer(elf), top], CREATED[:2] + ["COPY top"], ENV)
    shipped = {}

    def in_order(fn, items, jobs, order=None):  # the workers' function, run here to see what it returns
        out = [fn(x) for x in items]
        for r in out:
            shipped[r.path] = [(f.in_file, len(f.matches)) for f in r.findings if f.kind == "imported-symbol"]
        return out

    monkeypatch.setattr(check, "map_ordered", in_order)
    report = check_paths([str(img)], load_policy(None), jobs=2)
    assert shipped[f"{img}!/app/libtop.so"] == [("/usr/lib/libbad.so", 0)]
    assert shipped[f"{img}!/usr/lib/libbad.so"] == [(None, 1)]  # its own matches travel with it
    monkeypatch.undo()
    serial = check_paths([str(img)], load_policy(None), jobs=1).to_dict()
    parallel = report.to_dict()
    for r in (serial, parallel):
        r.pop("elapsed_s", None)
    assert serial == parallel
