"""Python sources that hand a vendor library's name to a loader (ctypes, cffi, numpy, torch):
read from files, folders, wheels and conda packages, judged as dlopen strings, and never a
pass on what could not be read. The sources are real Python (each is parsed by this interpreter
in a test of its own); what matters is which names the reader finds, and where."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_VIOLATION
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from audit.python_source import reader
from audit.python_source.reader import loads_in, read_python
from tests.cli_runner import cli as cli_audit

LOADS = '''\
import ctypes, ctypes.util, os
from pathlib import Path

LIBS = ["libcudnn.so.9", "libcublasLt.so.12"]
for lib in LIBS:
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
ctypes.cdll.LoadLibrary(os.path.join("/usr/lib", "libcublas.so.12"))
handle = ctypes.windll.cufft64_11
sparse = ctypes.cdll["libcusparse.so.12"]
ctypes.util.find_library("cusolver")
major = 9
ctypes.CDLL(f"libcudnn_ops.so.{major}")
ctypes.CDLL("libnvinfer.so.%d" % major)
ctypes.CDLL(Path("/opt") / "libcusolverMg.so.11")
'''

INERT = '''\
"""ctypes.CDLL("libcublas.so.12") in a docstring is prose."""
import ctypes, glob, os
# ctypes.CDLL("libcudnn.so.9") in a comment
print("ctypes.CDLL('libcublas.so.12')")
cuda_libs = {"cublas": "libcublas.so.*[0-9]", "cudnn": "libcudnn.so.*[0-9]"}

def preload(folder, pattern):
    for path in glob.glob(os.path.join(folder, pattern)):
        ctypes.CDLL(path)  # a name found at run time: not judged

for folder, pattern in cuda_libs.items():
    preload(folder, pattern)
ctypes.CDLL("libc.so.6")
'''


def names(source: str | bytes) -> set[tuple[str, int]]:
    data = source.encode() if isinstance(source, str) else source
    hits, _ = loads_in(data)
    return {(h.text, h.line) for h in hits}


def test_every_loader_form_and_spelling_is_read():
    compile(LOADS, "loads.py", "exec")  # real Python 3
    assert names(LOADS) == {
        ("libcudnn.so.9", 6), ("libcublasLt.so.12", 6),  # a for over a named list
        ("libcublas.so.12", 7),  # os.path.join's last part
        ("cufft64_11.dll", 8),  # windll's attribute: a DLL of that name
        ("libcusparse.so.12", 9),  # cdll's item
        ("libcusolver.so", 10),  # find_library's bare name, as the file the loader finds
        ("libcudnn_ops.so", 12), ("libnvinfer.so", 13),  # templates with their fields left empty
        ("libcusolverMg.so.11", 14),  # Path / name
    }


def test_names_found_at_run_time_and_prose_are_not_loads():
    compile(INERT, "inert.py", "exec")
    assert names(INERT) == {("libc.so.6", 13)}


def test_a_source_without_any_loader_name_is_not_parsed(monkeypatch):
    def no_parse(*a, **k):
        raise AssertionError("parsed")

    monkeypatch.setattr(reader.ast, "parse", no_parse)
    assert loads_in(b"import os\nx = 'libcublas.so.12'\n") == ([], None)


@pytest.mark.parametrize("source", [
    b'print "python 2"\nimport ctypes\nctypes.CDLL("libcublas.so.12")\n',  # not Python 3
    b'import ctypes\n\x00\nctypes.CDLL("libcublas.so.12")\n',  # a NUL byte
    b'import ctypes\nx = ' + b"(" * 300 + b"1" + b")" * 300 + b'\nctypes.CDLL("libcublas.so.12")\n',  # nested past the parser
])
def test_a_source_that_does_not_parse_is_read_by_pattern(source):
    with pytest.raises((SyntaxError, ValueError)):
        compile(source, "x.py", "exec")
    hits, warning = loads_in(source)
    assert [(h.text, h.line) for h in hits] == [("libcublas.so.12", 3)]
    assert warning and "read by pattern" in warning


def test_deeply_nested_expressions_do_not_recurse_without_bound():
    chain = "+".join(['"x"'] * 50_000)  # left-nested 50,000 deep: the parser's or our recursion limit
    src = f'import ctypes\ny = {chain}\nctypes.CDLL("libcudnn.so.9")\n'.encode()
    hits, _ = loads_in(src)
    assert [(h.text, h.line) for h in hits] == [("libcudnn.so.9", 3)]


def test_a_large_source_is_read_by_pattern_and_one_past_the_limit_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_PARSED_BYTES", 1000)
    big = tmp_path / "big.py"
    big.write_bytes(b"# pad\n" * 400 + b'import ctypes\nctypes.CDLL("libcublas.so.12")\n')
    info = read_python(big)
    assert [h.text for h in info.library_strings] == ["libcublas.so.12"]
    assert any("read by pattern" in w for w in info.warnings)
    monkeypatch.setattr(reader, "MAX_SOURCE_BYTES", 1000)
    with pytest.raises(Exception, match="over the 1000-byte limit"):
        read_python(big)


def audit(*paths):
    return check_paths([str(p) for p in paths], load_policy(None), ResolveOptions.from_cli())


def test_a_folder_s_loading_source_fails_by_its_call_and_the_others_are_counted(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "loads.py").write_text(LOADS)
    (tmp_path / "pkg" / "inert.py").write_text(INERT)
    (tmp_path / "pkg" / "plain.py").write_text("import os\n")
    report = audit(tmp_path / "pkg")
    files = {Path(f.path).name: f for f in report.files}
    assert sorted(files) == ["inert.py", "loads.py"]  # plain.py names no loader: not read
    assert report.skipped.get("python_no_load") == 1
    assert files["inert.py"].verdict == "pass" and not files["inert.py"].findings
    loads = files["loads.py"]
    assert loads.verdict == "fail" and loads.format == "python"
    by_rule = {f.rule: f for f in loads.findings}
    cudnn = by_rule["nvidia.cudnn"]
    assert cudnn.kind == "dlopen-string" and cudnn.failing
    assert {n for m in cudnn.matches for n in m.names} == {"libcudnn.so.9", "libcudnn_ops.so"}
    assert cudnn.matches[0].where == "line 6, ctypes.CDLL()" or "line 6, ctypes.CDLL()" in {m.where for m in cudnn.matches}
    assert "the source hands it to ctypes.CDLL()" in cudnn.detail
    assert {"nvidia.cublas", "nvidia.cublaslt", "nvidia.cusparse", "nvidia.cusolver", "nvidia.tensorrt"} <= set(by_rule)


def test_a_named_source_is_read_even_without_a_loader(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("import os\n")
    report = audit(plain)
    assert [(f.verdict, f.format) for f in report.files] == [("pass", "python")]


def test_a_wheel_s_loading_source_is_audited(tmp_path):
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("demo/__init__.py", "import os\n")
        zf.writestr("demo/_load.py", 'import ctypes\n_lib = ctypes.CDLL("libcudnn.so.9")\n')
    report = audit(whl)
    assert [(f.path, f.verdict) for f in report.files] == [(f"{whl}!/demo/_load.py", "fail")]
    (finding,) = report.files[0].findings
    assert (finding.rule, finding.kind, finding.subject, finding.where) == (
        "nvidia.cudnn", "dlopen-string", "libcudnn.so.9", "line 2, ctypes.CDLL()")
    assert report.skipped.get("python_no_load") == 1


def test_a_wheel_s_source_over_the_member_limit_is_an_error_not_a_skip(tmp_path, capsys):
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo/big.py", "# " + "x" * 5000 + '\nimport ctypes\nctypes.CDLL("libcudnn.so.9")\n')
    rc, out, _ = cli_audit(capsys, "check", str(whl), "--max-member-size", "1000")
    assert rc == EXIT_INPUT and "demo/big.py" in out and "--max-member-size" in out


def test_a_conda_package_s_loading_source_is_audited(tmp_path):
    from tests.test_conda import BUILDERS

    entries = [("lib/python3.11/site-packages/demo/_load.py", "file", b'import ctypes\nctypes.CDLL("libcublas.so.12")\n'),
               ("lib/python3.11/site-packages/demo/__init__.py", "file", b"import os\n")]
    for fmt, build in BUILDERS.items():
        pkg = build(tmp_path, entries)
        report = audit(pkg)
        assert [(f.path, f.verdict) for f in report.files] == [
            (f"{pkg}!/lib/python3.11/site-packages/demo/_load.py", "fail")], fmt
        assert [(f.rule, f.kind, f.subject) for f in report.files[0].findings] == [
            ("nvidia.cublas", "dlopen-string", "libcublas.so.12")]


def test_cli_output_of_a_loading_source(tmp_path, capsys):
    src = tmp_path / "load.py"
    src.write_text('import ctypes\nctypes.CDLL("libcudnn.so.9")\n')
    rc, out, _ = cli_audit(capsys, "check", str(src))
    assert rc == EXIT_VIOLATION
    assert "dlopen-string: libcudnn.so.9  (line 2, ctypes.CDLL())" in out
    rc, out, _ = cli_audit(capsys, "inspect", str(src))
    assert rc == EXIT_OK and "Python source" in out and "Mach-O" not in out


@pytest.mark.parametrize("how", [None, "gzip"])
def test_an_image_s_loading_source_is_audited_and_a_deleted_one_is_not(tmp_path, how):
    """A layer's Python file that calls ctypes with cuDNN's name is judged (read in place, or
    looked at while the compressed layer streams by); one a later layer deletes is gone."""
    from tests.image_fixtures import layer_tar, oci_layout

    site = "usr/lib/python3/dist-packages/demo"
    base = layer_tar([("dir", "usr"), ("dir", "usr/lib"), ("dir", "usr/lib/python3"),
                      ("dir", "usr/lib/python3/dist-packages"), ("dir", site),
                      ("file", f"{site}/__init__.py", b"import os\n"),
                      ("file", f"{site}/_load.py", b'import ctypes\nctypes.CDLL("libcudnn.so.9")\n'),
                      ("file", f"{site}/_old.py", b'import ctypes\nctypes.CDLL("libcublas.so.12")\n')])
    top = layer_tar([("whiteout", f"{site}/_old.py")])
    image = oci_layout(tmp_path / f"img-{how}", [base, top], how=how)
    report = audit(image)
    assert [(f.path, f.verdict) for f in report.files] == [(f"{image}!/{site}/_load.py", "fail")]
    assert [(f.rule, f.kind, f.subject, f.where) for f in report.files[0].findings] == [
        ("nvidia.cudnn", "dlopen-string", "libcudnn.so.9", "line 2, ctypes.CDLL()")]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_lines_are_numbered_and_quoted_as_python_numbers_them(end):
    src = end.join([b"import ctypes", b"# \x0c form feed, \x0b vertical tab: not line ends", b"",
                    b'ctypes.CDLL("libcudnn.so.9")', b""])
    compile(src, "x.py", "exec")
    (hit,), _ = loads_in(src)
    assert (hit.line, hit.context) == (4, 'ctypes.CDLL("libcudnn.so.9")')
    assert src[hit.offset:].startswith(b"ctypes.CDLL")


def test_a_wheel_s_pth_file_loads_at_every_start_up(tmp_path):
    """site.py executes a .pth line that starts with "import" each time Python starts; the path
    lines around it are not code (and do not make the file unreadable)."""
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("demo-init.pth", '/opt/demo/extra\nimport ctypes; ctypes.CDLL("libcublas.so.12")\n../lib\n')
        zf.writestr("plain.pth", "/opt/demo/lib\n")
    report = audit(whl)
    assert [(f.path, f.verdict, f.warnings) for f in report.files] == [(f"{whl}!/demo-init.pth", "fail", [])]
    assert [(f.rule, f.subject, f.where) for f in report.files[0].findings] == [
        ("nvidia.cublas", "libcublas.so.12", "line 2, ctypes.CDLL()")]


ALIASED = b'''\
import ctypes
from ctypes import CDLL as L, windll as W
Load = ctypes.cdll.LoadLibrary
G = getattr(ctypes, "CDLL")
L("libcudnn.so.9")
W.cublas64_12
Load("libcublasLt.so.12")
G("libcusparse.so.12")
getattr(ctypes, "CDLL")("libcusolver.so.11")
exec("import ctypes; ctypes.CDLL('libnvinfer.so.10')")
code = "exec('import ctypes; ctypes.CDLL(\\\\'libcublas.so.12\\\\')')"
exec(code)
__import__("ctypes").CDLL("libcudnn_ops.so.9")
tf.load_op_library("libnvinfer_plugin.so.10")
'''


def test_loaders_under_other_names_and_code_in_exec_strings_are_read():
    compile(ALIASED, "aliased.py", "exec")
    assert names(ALIASED) == {
        ("libcudnn.so.9", 5), ("cublas64_12.dll", 6), ("libcublasLt.so.12", 7), ("libcusparse.so.12", 8),
        ("libcusolver.so.11", 9), ("libnvinfer.so.10", 10), ("libcublas.so.12", 12), ("libcudnn_ops.so.9", 13),
        ("libnvinfer_plugin.so.10", 14)}


def test_an_sdist_s_loading_source_is_audited(tmp_path):
    """An sdist met in a folder: its Python files that call a loader are read (the others, and its
    C sources, are not written out)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in {"demo-1.0/PKG-INFO": b"Name: demo\n", "demo-1.0/demo/__init__.py": b"import os\n",
                           "demo-1.0/demo/_load.py": b'import ctypes\nctypes.CDLL("libcudnn.so.9")\n',
                           "demo-1.0/src/x.c": b"int x;\n"}.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "demo-1.0.tar.gz").write_bytes(buf.getvalue())
    report = audit(tmp_path / "dist")
    assert [(f.path, f.verdict) for f in report.files] == [
        (f"{tmp_path}/dist/demo-1.0.tar.gz!/demo-1.0/demo/_load.py", "fail")]
