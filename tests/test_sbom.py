"""`check --format cyclonedx|spdx`: SBOMs of what was audited (docs/sbom.md).

Every document is validated twice: against the official JSON schemas (CycloneDX 1.6 with its
SPDX-licence and JSF references, SPDX 2.3; tests/fixtures/sbom/README.md says where each came
from) and with the ecosystem's own libraries (cyclonedx-python-lib's strict JSON validator,
spdx-tools' parser and validator), then read back with those libraries to find the edges a
reader needs. Inputs: a wheel of gcc-built libraries shaped like onnxruntime-gpu and numpy
(a CUDA provider that needs cuDNN, an extension that needs a renamed OpenBLAS), binaries with
ELF package and dlopen notes written by ld and gcc, and real corpus wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource

from audit.cli import main
from linkage_fixtures import cc_shared

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "tests" / "fixtures" / "sbom"
CUDA_NAME = "demo_pkg/capi/libonnxruntime_providers_cuda.so"
UMATH_NAME = "demo_pkg/core/_umath.so"
PACKAGE_NOTE = '{"type":"deb","os":"debian","name":"demo-notes","version":"1.2-3","architecture":"amd64"}'


def cli(capsys, *args, env=None):
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in args])
    finally:
        os.environ.clear()
        os.environ.update(old)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def dlopen_note_source(json_text: str, section: str = ".note.dlopen", ntype: str = "0x407c0c0a") -> str:
    """C that puts a .note.dlopen (owner FDO, type 0x407c0c0a) holding `json_text` into the
    object, as systemd's SD_ELF_NOTE_DLOPEN macro does (or another FDO note, by section and type)."""
    lit = json.dumps(json_text)
    return ("#include <stdint.h>\n"
            f"__attribute__((used, section(\"{section}\"), aligned(4))) static const struct {{\n"
            "  struct { uint32_t n_namesz, n_descsz, n_type; } nhdr; char name[4];\n"
            f"  __attribute__((aligned(4))) char json[sizeof({lit})];\n"
            f"}} note = {{ {{ 4, sizeof({lit}), {ntype} }}, \"FDO\", {lit} }};\n"
            "int noted(void) { return 1; }\n")


@pytest.fixture(scope="module")
def demo_wheel(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sbom-wheel")
    libs = d / "libs"
    cc_shared(libs / "libcudnn.so.9", "int cudnnCreate(void **h) { return 0; }", "-Wl,-soname,libcudnn.so.9")
    cc_shared(libs / "libonnxruntime_providers_cuda.so",
              "int cudnnCreate(void **h);\nint provider(void) { void *h; return cudnnCreate(&h); }",
              f"-L{libs}", "-l:libcudnn.so.9")
    blas = "libscipy_openblas64_-6bb31eeb.so"
    cc_shared(libs / blas, "void scipy_dgemm_64_(void) {}", f"-Wl,-soname,{blas}")
    cc_shared(libs / "_umath.so", "void scipy_dgemm_64_(void);\nvoid umath(void) { scipy_dgemm_64_(); }",
              f"-L{libs}", f"-l:{blas}", "-Wl,-rpath,$ORIGIN/../../demo_pkg.libs")
    noted = cc_shared(libs / "libnoted.so", dlopen_note_source(
        '[{"feature":"dnn","description":"convolutions","priority":"recommended","soname":["libcudnn.so.9"]}]'),
        "-Xlinker", f"--package-metadata={PACKAGE_NOTE}")
    whl = d / "demo_pkg-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo_pkg\nVersion: 1.0\n")
        zf.write(libs / "libonnxruntime_providers_cuda.so", CUDA_NAME)
        zf.write(libs / "libcudnn.so.9", "demo_pkg/cudnn/lib/libcudnn.so.9")
        zf.write(libs / "_umath.so", UMATH_NAME)
        zf.write(libs / blas, f"demo_pkg.libs/{blas}")
        zf.write(noted, "demo_pkg/libnoted.so")
    return whl


def _registry() -> Registry:
    reg = Registry()
    for name in ("bom-1.6.schema.json", "spdx.schema.json", "jsf-0.82.schema.json"):
        res = Resource.from_contents(json.loads((SCHEMAS / name).read_text()))
        reg = reg.with_resource(f"http://cyclonedx.org/schema/{name}", res)
    return reg


def validate_cyclonedx(text: str) -> dict:
    doc = json.loads(text)
    schema = json.loads((SCHEMAS / "bom-1.6.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema, registry=_registry(), format_checker=jsonschema.FormatChecker())
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(doc)]
    assert errors == []
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    from packageurl import PackageURL  # cyclonedx-python-lib's own purl library

    for c in cdx_components(doc):  # every purl parses, and is already in its canonical form
        if "purl" in c:
            assert PackageURL.from_string(c["purl"]).to_string() == c["purl"]
    return doc


def validate_spdx(path: Path):
    doc = json.loads(path.read_text())
    schema = json.loads((SCHEMAS / "spdx-2.3.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    assert [e.message[:200] for e in validator.iter_errors(doc)] == []
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    parsed = parse_file(str(path))
    assert [m.validation_message for m in validate_full_spdx_document(parsed)] == []
    return parsed


def sboms(capsys, tmp_path: Path, *inputs, env=None, tag="a") -> tuple[int, Path, Path, str]:
    cdx, spdx = tmp_path / f"{tag}.cdx.json", tmp_path / f"{tag}.spdx.json"
    rc, _, err = cli(capsys, "check", *inputs, "--format", f"cyclonedx={cdx}", "--format", f"spdx={spdx}", env=env)
    return rc, cdx, spdx, err


def cdx_components(doc: dict):
    todo = list(doc["components"])
    while todo:
        c = todo.pop(0)
        yield c
        todo += c.get("components", [])


def props(c: dict, name: str) -> list[str]:
    return [p["value"] for p in c.get("properties", []) if p["name"] == f"sovereign-audit:{name}"]


def bom_edges(path: Path) -> dict[str, tuple[str, list[str]]]:
    """cyclonedx-python-lib's reading: bom-ref -> (component name, the names it depends on)."""
    from cyclonedx.model.bom import Bom

    bom = Bom.from_json(json.loads(path.read_text()))
    names = {}
    todo = list(bom.components)
    while todo:
        c = todo.pop()
        names[str(c.bom_ref)] = c.name
        todo += list(c.components)
    return {str(d.ref): (names[str(d.ref)], [names[str(x.ref)] for x in d.dependencies]) for d in bom.dependencies}


def spdx_edges(parsed) -> list[tuple[str, str, str, str]]:
    """spdx-tools' reading: (from name, relationship, to name, comment)."""
    names = {p.spdx_id: p.name for p in parsed.packages}
    return [(names.get(r.spdx_element_id), r.relationship_type.name, names.get(str(r.related_spdx_element_id)),
             r.comment or "") for r in parsed.relationships]


def test_both_sboms_of_a_wheel_validate_and_show_the_cudnn_and_openblas_edges(capsys, tmp_path, demo_wheel):
    rc, cdx, spdx, err = sboms(capsys, tmp_path, demo_wheel)
    assert rc == 1, err  # cuDNN and OpenBLAS are denied
    doc = validate_cyclonedx(cdx.read_text())
    parsed = validate_spdx(spdx)

    edges = bom_edges(cdx)
    by_name = {name: deps for name, deps in edges.values()}
    assert "libcudnn.so.9" in by_name["libonnxruntime_providers_cuda.so"]
    assert "libscipy_openblas64_-6bb31eeb.so" in by_name["_umath.so"]
    rels = spdx_edges(parsed)
    assert ("libonnxruntime_providers_cuda.so", "DYNAMIC_LINK", "libcudnn.so.9",
            "sovereign-audit:edge=needed") in rels
    assert ("_umath.so", "DYNAMIC_LINK", "libscipy_openblas64_-6bb31eeb.so", "sovereign-audit:edge=needed") in rels

    # the wheel is a component with its purl, its files nested in it with their sha256
    wheel = next(c for c in doc["components"] if c["bom-ref"] == f"container:{demo_wheel}")
    assert (wheel["name"], wheel["version"], wheel["purl"]) == ("demo_pkg", "1.0", "pkg:pypi/demo-pkg@1.0")
    assert wheel["hashes"][0]["content"] == hashlib.sha256(demo_wheel.read_bytes()).hexdigest()
    cuda = next(c for c in wheel["components"] if c["name"] == "libonnxruntime_providers_cuda.so")
    assert len(cuda["hashes"][0]["content"]) == 64 and props(cuda, "verdict") == ["fail"]
    assert props(cuda, "edge:needed")[0] == f"{demo_wheel}!/demo_pkg/cudnn/lib/libcudnn.so.9"
    findings = [json.loads(v) for v in props(cuda, "finding")]
    assert any(f["rule"] == "nvidia.cudnn" and f["mechanism"] == "needed" and f["reason"] and f["failing"]
               for f in findings)
    assert any(pkg.name == "demo_pkg" and pkg.external_references[0].locator == "pkg:pypi/demo-pkg@1.0"
               for pkg in parsed.packages)


def test_package_and_dlopen_notes_name_the_file_and_its_declared_edge(capsys, tmp_path, demo_wheel):
    rc, cdx, spdx, err = sboms(capsys, tmp_path, demo_wheel)
    doc = json.loads(cdx.read_text())
    noted = next(c for c in cdx_components(doc) if c["bom-ref"].endswith("!/demo_pkg/libnoted.so"))
    assert (noted["version"], noted["purl"]) == ("1.2-3", "pkg:deb/debian/demo-notes@1.2-3?arch=amd64")
    assert props(noted, "edge:dlopen-declared") == [f"{demo_wheel}!/demo_pkg/cudnn/lib/libcudnn.so.9"]
    assert json.loads(props(noted, "dlopen-declared")[0])["soname"] == ["libcudnn.so.9"]
    rels = spdx_edges(validate_spdx(spdx))
    assert ("libnoted.so", "DYNAMIC_LINK", "libcudnn.so.9",
            "sovereign-audit:edge=dlopen-declared (recommended, dnn)") in rels


def test_same_input_gives_the_same_bytes_and_the_date_is_settable(capsys, tmp_path, demo_wheel):
    _, cdx1, spdx1, _ = sboms(capsys, tmp_path, demo_wheel, tag="one")
    _, cdx2, spdx2, _ = sboms(capsys, tmp_path, demo_wheel, tag="two")
    assert cdx1.read_bytes() == cdx2.read_bytes() and spdx1.read_bytes() == spdx2.read_bytes()
    _, cdx3, spdx3, _ = sboms(capsys, tmp_path, demo_wheel, tag="dated", env={"SOURCE_DATE_EPOCH": "1767225600"})
    d1, d3 = json.loads(cdx1.read_text()), json.loads(cdx3.read_text())
    assert d1["metadata"]["timestamp"] == "1970-01-01T00:00:00Z"
    assert d3["metadata"]["timestamp"] == "2026-01-01T00:00:00Z"
    assert d1["serialNumber"] != d3["serialNumber"]  # derived from the content, date included
    assert json.loads(spdx3.read_text())["creationInfo"]["created"] == "2026-01-01T00:00:00Z"


@pytest.mark.parametrize("epoch", ["yesterday", "-5", "99999999999999"])
def test_a_source_date_epoch_that_is_not_a_date_is_a_usage_error(capsys, tmp_path, demo_wheel, epoch):
    rc, cdx, spdx, err = sboms(capsys, tmp_path, demo_wheel, env={"SOURCE_DATE_EPOCH": epoch})
    assert rc == 2 and err.startswith(f"error: SOURCE_DATE_EPOCH={epoch}: ") and len(err.splitlines()) == 1
    assert not cdx.exists() and not spdx.exists()  # nothing half-written


def test_a_bad_source_date_epoch_is_refused_before_the_audit(capsys, tmp_path, monkeypatch):
    import audit.linkage.check as check

    def no_audit(*a, **k):
        raise AssertionError("audited before the usage error")

    monkeypatch.setattr(check, "check_paths", no_audit)
    rc, _, _, err = sboms(capsys, tmp_path, tmp_path, env={"SOURCE_DATE_EPOCH": "soon"})
    assert rc == 2 and "SOURCE_DATE_EPOCH=soon" in err


def test_a_file_that_cannot_be_audited_is_in_the_sbom_with_its_error(capsys, tmp_path, demo_wheel):
    bad = tmp_path / "libbad.so"
    cc_shared(bad, dlopen_note_source('[{"soname": "not a list"}]'))
    rc, cdx, spdx, err = sboms(capsys, tmp_path, demo_wheel, bad)
    assert rc == 3
    doc = validate_cyclonedx(cdx.read_text())
    validate_spdx(spdx)
    comp = next(c for c in doc["components"] if c["bom-ref"] == str(bad))
    assert props(comp, "verdict") == ["error"] and ".note.dlopen" in props(comp, "error")[0]
    assert props(doc["metadata"], "verdict") == ["error"]


def test_an_unreadable_package_note_is_a_warning_not_a_name(capsys, tmp_path):
    # ld --package-metadata refuses text that is not JSON: the note is written by the compiler
    lib = cc_shared(tmp_path / "libodd.so", dlopen_note_source('{"name": "x"', ".note.package", "0xcafe1a7e"))
    rc, cdx, spdx, err = sboms(capsys, tmp_path, lib)
    assert rc == 0, err
    comp = next(c for c in validate_cyclonedx(cdx.read_text())["components"] if c["bom-ref"] == str(lib))
    assert "purl" not in comp and "version" not in comp
    out = subprocess.run([sys.executable, "-m", "audit", "check", str(lib), "--format", "json"],
                         capture_output=True, text=True)
    assert ".note.package at" in out.stdout and "not JSON" in out.stdout


def test_help_lists_both_sbom_formats_with_an_example(capsys):
    rc, out, _ = cli(capsys, "check", "--help")
    assert rc == 0
    assert "--format cyclonedx=sbom.cdx.json" in out and "--format spdx=sbom.spdx.json" in out
    assert "CycloneDX 1.6" in out and "SPDX 2.3" in out


# ---------------------------------------------------------------- real wheels


CORPUS = Path(os.environ.get("SOVEREIGN_AUDIT_WHEELS", "/work/cache/wheels"))


def _corpus_numpy() -> Path:
    sys.path.insert(0, str(REPO / "bench"))
    import corpus

    w = next(w for w in corpus.load_expectations() if w.name == "numpy")
    try:
        return corpus.fetch(w, REPO / "tests" / "_fixtures_build" / "corpus-wheels",
                            [str(CORPUS)] if CORPUS.is_dir() else [])
    except RuntimeError as exc:
        try:
            socket.create_connection(("pypi.org", 443), timeout=5).close()
        except OSError:
            pytest.skip("the package index (pypi.org) cannot be reached to download numpy's wheel")
        raise AssertionError(str(exc)) from None


def test_numpy_wheel_sboms_validate_and_show_the_openblas_edge(capsys, tmp_path):
    """numpy's extensions NEED the OpenBLAS that auditwheel bundled into numpy.libs (readelf -d
    _multiarray_umath...so: NEEDED libscipy_openblas64_-*.so)."""
    whl = _corpus_numpy()
    rc, cdx, spdx, err = sboms(capsys, tmp_path, whl)
    assert rc == 1, err
    validate_cyclonedx(cdx.read_text())
    parsed = validate_spdx(spdx)
    edges = bom_edges(cdx)
    umath = [deps for name, deps in edges.values() if name.startswith("_multiarray_umath.")]
    assert umath and any(d.startswith("libscipy_openblas64_-") for d in umath[0])
    assert any((a or "").startswith("_multiarray_umath.") and rel == "DYNAMIC_LINK" and (b or "").startswith(
        "libscipy_openblas64_-") for a, rel, b, _ in spdx_edges(parsed))
    wheel = next(c for c in json.loads(cdx.read_text())["components"] if c["bom-ref"].startswith("container:"))
    assert wheel["purl"] == "pkg:pypi/numpy@2.4.6"


ORT_GPU = CORPUS / "onnxruntime_gpu-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.slow
@pytest.mark.skipif(not ORT_GPU.is_file(), reason=f"{ORT_GPU.name} is not in the wheel cache (bench/corpus.py fetches it)")
def test_onnxruntime_gpu_sboms_show_cudnn_reached_through_the_cuda_provider(capsys, tmp_path):
    """libonnxruntime_providers_cuda.so loads cuDNN by a name it assembles in code and calls it
    through dlsym (bench/corpus_expectations.toml); libonnxruntime_providers_tensorrt.so NEEDS
    libcudnn.so.9. Both edges are readable with the ecosystem's libraries."""
    rc, cdx, spdx, err = sboms(capsys, tmp_path, ORT_GPU)
    assert rc == 1, err
    validate_cyclonedx(cdx.read_text())
    rels = spdx_edges(validate_spdx(spdx))
    edges = {name: deps for name, deps in bom_edges(cdx).values()}
    assert "libcudnn.so.9" in edges["libonnxruntime_providers_tensorrt.so"]
    assert any("cuDNN" in d or d.startswith("libcudnn") for d in edges["libonnxruntime_providers_cuda.so"])
    assert any(a == "libonnxruntime_providers_cuda.so" and "dlopen" in c and ("cudnn" in (b or "").lower())
               for a, _, b, c in rels)


# ---------------------------------------------------------------- images


@pytest.mark.parametrize("how", [None, "gzip"])
def test_image_files_named_by_dpkg_records_and_nested_in_the_image(capsys, tmp_path, how):
    """This machine's own libc and dpkg's real records of it (dpkg-query -s libc6, its .list,
    /etc/os-release) in an image: the file is named pkg:deb/debian/libc6@VERSION, under the image
    (its ID the config's digest), with the layer that added it."""
    from image_fixtures import layer_tar, oci_layout

    status = subprocess.run(["dpkg-query", "-s", "libc6"], capture_output=True, text=True)
    listing = Path("/var/lib/dpkg/info/libc6:amd64.list")
    if status.returncode != 0 or not listing.is_file():
        pytest.skip("this machine has no dpkg record of libc6:amd64")
    version = next(line.split(": ", 1)[1] for line in status.stdout.splitlines() if line.startswith("Version: "))
    release = Path("/etc/os-release").read_text()
    distro = dict(line.split("=", 1) for line in release.splitlines() if "=" in line)
    app = cc_shared(tmp_path / "libapp.so", "int app(void) { return 0; }", "-lc")
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve().read_bytes()
    layer = layer_tar([("dir", "usr"), ("dir", "usr/lib"), ("dir", "usr/lib/x86_64-linux-gnu"),
                       ("symlink", "lib", "usr/lib"), ("file", "usr/lib/x86_64-linux-gnu/libc.so.6", libc),
                       ("file", "app/libapp.so", app.read_bytes()), ("dir", "etc"),
                       ("file", "etc/os-release", release.encode()),
                       ("file", "var/lib/dpkg/status", status.stdout.encode()),
                       ("file", "var/lib/dpkg/info/libc6:amd64.list", listing.read_bytes())])
    image = oci_layout(tmp_path / "img", [layer], created_by=["COPY . /"], how=how)
    rc, cdx, spdx, err = sboms(capsys, tmp_path, image)
    doc = validate_cyclonedx(cdx.read_text())
    validate_spdx(spdx)
    top = next(c for c in doc["components"] if c["bom-ref"] == f"container:{image}")
    assert top["type"] == "container" and props(top, "image-id")[0].startswith("sha256:")
    libc_comp = next(c for c in top["components"] if c["bom-ref"] == f"{image}!/usr/lib/x86_64-linux-gnu/libc.so.6")
    qual = f"arch=amd64&distro={distro['ID'].strip(chr(34))}-{distro['VERSION_ID'].strip(chr(34))}"
    assert libc_comp["purl"] == f"pkg:deb/{distro['ID'].strip(chr(34))}/libc6@{version.replace('+', '%2B')}?{qual}"
    assert props(libc_comp, "package-source") == ["dpkg"] and props(libc_comp, "layer-digest")[0].startswith("sha256:")
    appc = next(c for c in top["components"] if c["bom-ref"] == f"{image}!/app/libapp.so")
    assert "purl" not in appc  # no package owns it
    assert props(appc, "edge:needed") == [f"{image}!/usr/lib/x86_64-linux-gnu/libc.so.6"]


# ---------------------------------------------------------------- conda packages


@pytest.mark.parametrize("fmt", ["conda", "tar.bz2"])
def test_conda_package_named_by_its_index_json(capsys, tmp_path, fmt):
    from test_conda import BUILDERS

    d = tmp_path / "c"
    d.mkdir()
    lib = cc_shared(d / "libpkg.so.1.2", "int pkg(void){return 1;}\n", "-Wl,-soname,libpkg.so.1")
    pkg = BUILDERS[fmt](tmp_path, [("lib/libpkg.so.1.2", "file", lib.read_bytes()),
                                   ("lib/libpkg.so.1", "symlink", "libpkg.so.1.2")])
    rc, cdx, spdx, err = sboms(capsys, tmp_path, pkg)
    assert rc == 0, err
    doc = validate_cyclonedx(cdx.read_text())
    validate_spdx(spdx)
    top = doc["components"][0]
    assert top["bom-ref"] == f"container:{pkg}" and props(top, "container") == ["conda"]
    assert top["purl"] == f"pkg:conda/demo@1.0?build=0&type={fmt}"
    assert [c["name"] for c in top["components"]] == ["libpkg.so.1.2"]


@pytest.mark.parametrize("fmt", ["deb", "rpm", "tar"])
def test_debian_rpm_and_tar_packages_are_containers_named_by_their_metadata(capsys, tmp_path, fmt):
    """A .deb (dpkg-deb) is named by its control file, an .rpm (rpmbuild) by its header, a
    tarball by its digest; each CONTAINS the library it installs (they were left out)."""
    from conftest import require_tool
    from linkage_fixtures import tarball
    from test_archive_inputs import _rpm, dpkg_deb

    lib = cc_shared(tmp_path / "src" / "libfk.so", "int fk(void){return 1;}\n")
    if fmt == "deb":
        pkg = dpkg_deb(tmp_path, {"usr/lib/libfk.so": lib.read_bytes()})
        want = ("pkg:deb/x@1?arch=amd64", "usr/lib/libfk.so")
    elif fmt == "rpm":
        require_tool("rpmbuild")
        pkg = _rpm(tmp_path, lib)
        want = ("pkg:rpm/fk@1.0-1?arch=x86_64", "usr/lib/libfk.so")
    else:
        pkg = tmp_path / "fk-1.0.tar.gz"
        pkg.write_bytes(tarball({"fk/libfk.so": lib.read_bytes()}))
        want = (None, "fk/libfk.so")
    rc, cdx, spdx, err = sboms(capsys, tmp_path, pkg)
    assert rc == 0, err
    doc = validate_cyclonedx(cdx.read_text())
    validate_spdx(spdx)
    top = doc["components"][0]
    assert top["bom-ref"] == f"container:{pkg}" and props(top, "container") == [fmt]
    assert top.get("purl") == want[0]
    assert top["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(pkg.read_bytes()).hexdigest()}]
    assert [c["bom-ref"] for c in top["components"]] == [f"{pkg}!/{want[1]}"]


def test_a_finding_in_a_dependency_is_on_the_dependency(capsys, tmp_path):
    """libapp.so (audited) needs libmid.so (found through its RUNPATH, not audited), which
    imports CBLAS from OpenBLAS: the finding and its edge start at libmid's component."""
    deps = tmp_path / "deps"
    cc_shared(deps / "libopenblas.so.0", "void cblas_dgemm(void) {}", "-Wl,-soname,libopenblas.so.0")
    cc_shared(deps / "libmid.so", "void cblas_dgemm(void);\nvoid mid(void) { cblas_dgemm(); }",
              f"-L{deps}", "-l:libopenblas.so.0", "-Wl,-soname,libmid.so", f"-Wl,-rpath,{deps}")
    app = cc_shared(tmp_path / "app" / "libapp.so", "void mid(void);\nvoid app(void) { mid(); }",
                    f"-L{deps}", "-lmid", f"-Wl,-rpath,{deps}")
    rc, cdx, spdx, err = sboms(capsys, tmp_path, app)
    assert rc == 1, err
    doc = validate_cyclonedx(cdx.read_text())
    validate_spdx(spdx)
    comps = {c["bom-ref"]: c for c in cdx_components(doc)}
    mid = comps[f"lib:{deps / 'libmid.so'}"]
    assert any(json.loads(v)["rule"] == "blas.cblas" for v in props(mid, "finding"))
    assert props(mid, "edge:imported-symbols") == ["vendor:blas.cblas"]
    assert f"lib:{deps / 'libopenblas.so.0'}" in props(mid, "edge:needed")
    assert "vendor:blas.cblas" not in props(comps[str(app)], "edge:imported-symbols")
    assert len(mid["hashes"][0]["content"]) == 64


# ---------------------------------------------------------------- hostile names

from test_gate_escaping import NEEDED, SONAME, assert_inert, decoded, hostile, strings  # noqa: E402,F401
from test_gate_escaping import cli as gate_cli  # noqa: E402


def test_hostile_names_are_inert_and_exact_in_both_sboms(hostile, tmp_path):  # noqa: F811
    """The hostile folder of tests/test_gate_escaping (DT_NEEDED, DT_SONAME, symbol, file and
    member names carrying workflow commands, terminal escapes and bytes that are not UTF-8): no
    line of either document is a runner command, each string is the same once parsed, and both
    still validate."""
    files = {fmt: tmp_path / f"out.{fmt}.json" for fmt in ("cyclonedx", "spdx")}
    proc = gate_cli("check", "--policy", hostile / "hostile.toml", hostile / "tree",
                    *[a for fmt, p in files.items() for a in ("--format", f"{fmt}={p}")])
    assert proc.returncode == 1, proc.stderr
    for fmt, path in files.items():
        text = path.read_bytes().decode("utf-8")
        assert_inert(text)
        values = " ".join(strings(json.loads(text)))
        assert NEEDED in values and SONAME in values
        assert "\\u005b" in text  # `##[` written as an escape
    for fmt in ("cyclonedx", "spdx"):  # and to standard output
        proc = gate_cli("check", "--policy", hostile / "hostile.toml", hostile / "tree", "--format", fmt)
        out, err = decoded(proc)
        assert_inert(out)
        assert_inert(err)
    validate_cyclonedx(files["cyclonedx"].read_text())
    validate_spdx(files["spdx"])


# ---------------------------------------------------------------- static archives


def test_static_archive_members_nest_in_the_archive_and_the_archive_in_its_wheel(capsys, tmp_path):
    """An ar archive of gcc objects (one calls CBLAS), alone and inside a wheel: its members are
    nested in the archive's component (sha256 of the whole .a), that one in the wheel's."""
    for name, src in (("a.c", "void cblas_dgemm(void);\nvoid a(void) { cblas_dgemm(); }\n"),
                      ("b.c", "int b(void) { return 2; }\n")):
        (tmp_path / name).write_text(src)
        subprocess.run(["gcc", "-c", "-fPIC", "-o", tmp_path / name.replace(".c", ".o"), tmp_path / name], check=True)
    ar = tmp_path / "libdemo.a"
    subprocess.run(["ar", "rcs", ar, tmp_path / "a.o", tmp_path / "b.o"], check=True)
    whl = tmp_path / "demo_ar-2.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("demo_ar-2.0.dist-info/METADATA", "Name: demo-ar\nVersion: 2.0\n")
        zf.write(ar, "demo_ar/lib/libdemo.a")
    rc, cdx, spdx, err = sboms(capsys, tmp_path, ar, whl)
    assert rc == 1, err
    doc = validate_cyclonedx(cdx.read_text())
    rels = spdx_edges(validate_spdx(spdx))
    digest = hashlib.sha256(ar.read_bytes()).hexdigest()
    alone = next(c for c in doc["components"] if c["bom-ref"] == f"container:{ar}")
    assert props(alone, "container") == ["static-archive"] and alone["hashes"][0]["content"] == digest
    assert sorted(c["name"] for c in alone["components"]) == ["a.o", "b.o"]
    wheel = next(c for c in doc["components"] if c["bom-ref"] == f"container:{whl}")
    inner = next(c for c in wheel["components"] if c["bom-ref"] == f"container:{whl}!/demo_ar/lib/libdemo.a")
    assert inner["hashes"][0]["content"] == digest and sorted(c["name"] for c in inner["components"]) == ["a.o", "b.o"]
    assert ("demo-ar", "CONTAINS", "libdemo.a", "sovereign-audit:edge=member") in rels
    assert ("libdemo.a", "CONTAINS", "a.o", "sovereign-audit:edge=member") in rels


def test_a_conda_package_whose_header_lies_about_a_size_is_refused_at_once(capsys, tmp_path):
    """A .tar.bz2 whose first member declares ~2^80 bytes over a stream of a few hundred: reading
    the package's identity must not step over it block by block (tars.py); the package is an
    error (exit 3) and the SBOMs are still written."""
    import bz2
    import io
    import tarfile
    import time

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        ti = tarfile.TarInfo("lib/libx.so")
        ti.size = 1 << 80  # written as GNU base-256 (tarfile writes what it is given)
        tf.addfile(ti)  # no data follows
    pkg = tmp_path / "evil-1.0-0.tar.bz2"
    pkg.write_bytes(bz2.compress(buf.getvalue()))
    start = time.monotonic()
    rc, cdx, spdx, err = sboms(capsys, tmp_path, pkg)
    assert rc == 3 and time.monotonic() - start < 30
    validate_cyclonedx(cdx.read_text())


def test_a_library_is_described_by_the_node_that_loaded_it(capsys, tmp_path):
    """libapp.so needs libA and libB; libA needs libB too. ld.so loads breadth first, so libB is
    loaded by libapp and shown "already loaded" under libA, a node a depth-first walk meets
    first: libB's component still has its digest and how the loader found it."""
    deps = tmp_path / "deps"
    cc_shared(deps / "libB.so", "int b(void) { return 2; }", "-Wl,-soname,libB.so")
    cc_shared(deps / "libA.so", "int b(void);\nint a(void) { return b(); }", f"-L{deps}", "-lB",
              "-Wl,-soname,libA.so", f"-Wl,-rpath,{deps}")
    app = cc_shared(tmp_path / "app" / "libapp.so", "int a(void);\nint b(void);\nint app(void) { return a() + b(); }",
                    f"-L{deps}", "-lA", "-lB", f"-Wl,-rpath,{deps}")
    rc, cdx, spdx, err = sboms(capsys, tmp_path, app)
    assert rc == 0, err
    comps = {c["bom-ref"]: c for c in cdx_components(validate_cyclonedx(cdx.read_text()))}
    lib_b = comps[f"lib:{deps / 'libB.so'}"]
    assert lib_b["hashes"][0]["content"] == hashlib.sha256((deps / "libB.so").read_bytes()).hexdigest()
    assert props(lib_b, "found-by") != ["loaded"] and props(lib_b, "not-hashed") == []
    assert props(comps[f"lib:{deps / 'libA.so'}"], "edge:needed")[0] == f"lib:{deps / 'libB.so'}"


def test_a_run_that_audited_nothing_still_gives_valid_documents_about_its_input(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, cdx, spdx, err = sboms(capsys, tmp_path, empty)
    assert rc == 3
    doc = validate_cyclonedx(cdx.read_text())
    validate_spdx(spdx)  # SPDX needs something the document DESCRIBES
    [comp] = doc["components"]
    assert comp["bom-ref"] == f"input:{empty}" and "nothing was audited" in props(comp, "error")[0]


def test_a_stub_finding_points_at_its_vendor_not_at_a_file_named_after_an_api(capsys, tmp_path):
    """Implib.so trampolines are a dlopen-string finding whose subject is an API name: the SBOM's
    edge goes to the vendor (cuBLAS), never to an 'unresolved' library called cublasCreate_v2."""
    from conftest import require_tool
    from test_trampolines import build_shim

    lib = build_shim(tmp_path, require_tool("gcc"))
    code, out, err = cli(capsys, "check", lib, "--format", "cyclonedx", env={"SOURCE_DATE_EPOCH": "0"})
    assert code == 1, err
    bom = json.loads(out)
    names = {c["bom-ref"]: c["name"] for c in bom["components"]}
    targets = {names.get(t, t) for d in bom["dependencies"] for t in d.get("dependsOn", [])}
    assert "cuBLAS" in targets
    assert not {t for t in targets if t.startswith("cublas")}, targets
