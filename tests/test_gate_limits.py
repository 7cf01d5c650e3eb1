"""The gate never stalls and never fails with an internal error, whatever its inputs hold: long
library names, star-heavy policy patterns, huge or deeply nested policies and baselines, deep
NEEDED chains, FIFOs and sparse files in a bundle, unreadable inputs. Each case ends within its
limit with a documented exit code and at most one `error:` line, never a traceback.

Every input is built here: shared objects by gcc (names edited by patchelf, or copied with their
same-length names replaced as a binary editor would), policies, baselines and bundles as files.
"""

from __future__ import annotations

import fnmatch
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_tool

from audit.linkage.judging.patterns import combined_bytes_regex, compile_globs, soname_stem

REPO = Path(__file__).resolve().parent.parent
# The documented limits (policy.py, resolve.py)
MAX_PATTERNS = 2048  # globs in one policy
MAX_AFFIXES = 8  # symbol-prefixes, symbol-suffixes
MAX_DEPTH = 256  # libraries in one NEEDED chain


def audit(*args, timeout: float = 60, prefix: tuple[str, ...] = (), cwd=None) -> subprocess.CompletedProcess:
    """`python -m audit ARGS` in a child process; a hang fails the test at `timeout`."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([*prefix, sys.executable, "-m", "audit", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    return proc


def one_error(proc: subprocess.CompletedProcess, *contains: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for text in contains:
        assert text in lines[0], lines[0]
    return lines[0]


def shared(out: Path, source: str, *flags: str) -> Path:
    gcc = require_tool("gcc")
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *flags], check=True, timeout=60)
    return out


# ---------------------------------------------------------------- library names


@pytest.mark.parametrize("needed", ["lib-" + "a" * 100_000, "a" + ".1" * 50_000, "lib" + ".so.1" * 20_000,
                                    "x" + ".7" * 50_000 + ".dll", "lib" + "-aaaaaaaa" * 12_000 + "!"],
                         ids=["dash-hex", "dotted-digits", "so-versions", "dll-versions", "hex-pieces"])
def test_a_long_needed_name_is_judged_in_every_format_and_inspect(tmp_path, needed):
    patchelf = require_tool("patchelf")
    lib = shared(tmp_path / "liblong.so", "int f(void) { return 1; }\n")
    subprocess.run([patchelf, "--add-needed", needed, str(lib)], check=True, timeout=60)
    outs = {fmt: tmp_path / f"out.{fmt}" for fmt in ("json", "sarif", "junit", "github")}
    proc = audit("check", lib, "--format", "text", *[a for fmt, p in outs.items() for a in ("--format", f"{fmt}={p}")],
                 timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # an unresolved library is a warning
    assert all(p.stat().st_size > 0 for p in outs.values())
    proc = audit("inspect", lib, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _reference_stem(name: str) -> str:
    """soname_stem as the regexes it replaced computed it (exponential-free only on short names)."""
    base = name.rsplit("/", 1)[-1]
    m = (re.match(r"^(.+?)\.so(?:\.[0-9A-Za-z_+-]+)*$", base)
         or re.match(r"^(.+?)(?:\.[0-9]+)*\.(?:dylib|dll)$", base))
    stem = m.group(1) if m else base
    return re.sub(r"(?:-r[0-9]+-[0-9a-f]{6,}(?:\.[0-9]+)*|(?:-[0-9a-f]{8,40})+)$", "", stem) or stem


def test_soname_stem_agrees_with_the_reference_regexes_on_short_names():
    rng = random.Random(7)
    pieces = [".so", ".", "-", "r", "0", "7", "a", "f", "g", "\n", ".dll", ".dylib", "-r0-", "abcdef", "12345678", "/"]
    for _ in range(20_000):
        name = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        assert soname_stem(name) == _reference_stem(name), repr(name)
    for name in ("libcublas.so.12.3", "libscipy_openblas64_-32a4b2a6.so", "libopenblaso-r0-d77a1985.3.15.so",
                 "@loader_path/.dylibs/libfoo.1.dylib", "foo-0123456789abcdef0123456789abcdef.dll"):
        assert soname_stem(name) == _reference_stem(name)


# ---------------------------------------------------------------- policy patterns


def test_globs_match_as_fnmatch_does():
    rng = random.Random(11)
    for _ in range(5_000):
        pat = "".join(rng.choice(["*", "?", "a", "b", "[ab]", "[!a]", "**"]) for _ in range(rng.randint(1, 7)))
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 9)))
        want = fnmatch.fnmatchcase(text, pat)
        assert bool(compile_globs([pat]).match(text)) == want, (pat, text)
        assert bool(combined_bytes_regex([pat]).search(text.encode())) == want, (pat, text)


def _policy(path: Path, symbols: list[str], extra: str = "") -> Path:
    path.write_text(f'name = "p"\n{extra}\n[[rules]]\nid = "r"\nreason = "test"\nsymbols = {json.dumps(symbols)}\n')
    return path


def test_a_star_heavy_glob_against_a_long_symbol_ends(tmp_path):
    long_name = "a" * 100_000
    lib = shared(tmp_path / "libsym.so", f'int f(void) __asm__("{long_name}");\nint f(void) {{ return 1; }}\n')
    policy = _policy(tmp_path / "stars.toml", ["*a*a*a*a*a*a*a*a*a*a*a*a*b"])
    proc = audit("check", lib, "--policy", policy, "--format", "json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    # the same glob still finds what it should: a name of a's that ends in b
    lib2 = shared(tmp_path / "libsym2.so", f'int f(void) __asm__("{long_name}b");\nint f(void) {{ return 1; }}\n')
    proc = audit("check", lib2, "--policy", policy, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_a_policy_of_100k_globs_is_refused_at_once(tmp_path):
    policy = _policy(tmp_path / "huge.toml", [f"sym{i:06d}_*" for i in range(100_000)])
    lib = shared(tmp_path / "libx.so", "int f(void) { return 1; }\n")
    proc = audit("check", lib, "--policy", policy, timeout=60)
    assert proc.returncode == 2
    one_error(proc, f"at most {MAX_PATTERNS}")


def test_too_many_symbol_affixes_are_refused(tmp_path):
    prefixes = [f"p{i}_" for i in range(MAX_AFFIXES + 1)]
    policy = _policy(tmp_path / "affixes.toml", ["cublas*"], f"symbol-prefixes = {json.dumps(prefixes)}")
    proc = audit("policy", "show", "--policy", policy, timeout=60)
    assert proc.returncode == 2
    one_error(proc, "symbol-prefixes", f"at most {MAX_AFFIXES}")


def test_symbol_lists_too_large_with_their_affixed_forms_are_refused(tmp_path):
    (tmp_path / "big.names").write_text("".join(f"vendor_fn{i}\n" for i in range(300_000)))
    (tmp_path / "lists.toml").write_text('name = "p"\nsymbol-prefixes = ["a_", "b_", "c_"]\n[[rules]]\nid = "r"\n'
                                         'reason = "test"\nsymbol-lists = ["big.names"]\n')
    proc = audit("policy", "show", "--policy", tmp_path / "lists.toml", timeout=60)
    assert proc.returncode == 2
    one_error(proc, "symbol lists of 1200000 names", "at most 1048576")


def test_a_glob_longer_than_1024_characters_is_refused_in_one_short_line(tmp_path):
    policy = _policy(tmp_path / "long.toml", ["a" * 5_000 + "*"])
    proc = audit("policy", "show", "--policy", policy, timeout=60)
    assert proc.returncode == 2
    assert len(one_error(proc, "longer than 1024 characters")) < 300


def test_the_shipped_policy_still_loads():
    proc = audit("policy", "show", timeout=60)
    assert proc.returncode == 0 and "[[rules]]" in proc.stdout


def test_a_deeply_nested_toml_policy_is_a_policy_error(tmp_path):
    policy = tmp_path / "deep.toml"
    policy.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    proc = audit("policy", "show", "--policy", policy, timeout=60)
    assert proc.returncode == 2
    one_error(proc, "deep.toml")


# ---------------------------------------------------------------- dependency chains


def _chain(d: Path, n: int) -> Path:
    """libq00000.so NEEDs libq00001.so ... NEEDs libq{n-1}.so (RUNPATH $ORIGIN), the last one a
    missing libq{n}.so. One object is linked; each copy gets its own same-length SONAME and NEEDED."""
    (d / "stub").mkdir(parents=True)
    stub = shared(d / "stub" / "libq00001.so", "int g(void) { return 2; }\n", "-Wl,-soname,libq00001.so")
    tmpl = shared(d / "tmpl.so", "int f(void) { return 1; }\n", "-Wl,-soname,libq00000.so", "-Wl,--no-as-needed",
                  str(stub), "-Wl,-rpath,$ORIGIN")
    data = tmpl.read_bytes()
    assert data.count(b"libq00000.so\0") == 1 and data.count(b"libq00001.so\0") == 1
    for i in range(n):
        (d / f"libq{i:05d}.so").write_bytes(data.replace(b"libq00001.so\0", b"libq%05d.so\0" % (i + 1))
                                            .replace(b"libq00000.so\0", b"libq%05d.so\0" % i))
    return d / "libq00000.so"


def test_a_needed_chain_1200_deep_is_an_error_not_a_crash(tmp_path):
    top = _chain(tmp_path / "chain", 1200)
    proc = audit("check", top, "--format", "json", timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert f"deeper than {MAX_DEPTH} libraries" in json.loads(proc.stdout)["files"][0]["error"]
    proc = audit("inspect", top, timeout=120)
    assert proc.returncode == 3
    one_error(proc, f"deeper than {MAX_DEPTH} libraries")
    # at the limit the whole tree is judged and written
    at_limit = tmp_path / "chain" / f"libq{1200 - MAX_DEPTH - 1:05d}.so"
    proc = audit("check", at_limit, "--format", "json", timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    node, depth = json.loads(proc.stdout)["files"][0]["resolved"], 0
    while any(c["name"].startswith("libq") for c in node["children"]):
        node, depth = next(c for c in node["children"] if c["name"].startswith("libq")), depth + 1
    assert depth == MAX_DEPTH + 1 and node["status"] == "unresolved", (depth, node)


# ---------------------------------------------------------------- baselines


def test_a_deeply_nested_baseline_is_a_usage_error(tmp_path):
    lib = shared(tmp_path / "libx.so", "int f(void) { return 1; }\n")
    base = tmp_path / "deep.json"
    base.write_text('{"schema": "sovereign-audit.linkage/1", "files": [' + "[" * 50_000 + "]" * 50_000 + "]}")
    proc = audit("check", lib, "--baseline", base, timeout=60)
    assert proc.returncode == 2
    one_error(proc, "--baseline")


@pytest.mark.parametrize("finding", [
    {"matches": [{"names": 5}]}, {"matches": [{"names": "abc"}]}, {"matches": {"names": []}},
    {"matches": [7]}, {"examples": 3}, {"examples": [1, 2]}, {"count": "many"},
], ids=["names-int", "names-str", "matches-dict", "match-int", "examples-int", "examples-ints", "count-str"])
def test_a_baseline_of_the_wrong_shape_is_a_usage_error(tmp_path, finding):
    lib = shared(tmp_path / "libx.so", "int f(void) { return 1; }\n")
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"schema": "sovereign-audit.linkage/1", "files": [
        {"path": str(lib), "findings": [{"rule": "r", "kind": "needed", "subject": "libcublas.so.12", **finding}]}]}))
    proc = audit("check", lib, "--baseline", base, timeout=60)
    assert proc.returncode == 2, proc.stderr
    one_error(proc, "--baseline")


# ---------------------------------------------------------------- verify and report


@pytest.fixture
def signed(tmp_path, fixture_root):
    from test_verify import make_bundle

    so = shared(tmp_path / "libk.so", "int k(void) { return 1; }\n")
    root, key = make_bundle(tmp_path / "bundle", so)
    pub = tmp_path / "signer.pub"
    pub.write_bytes(key.public_pem)
    return root, pub


def _list_in_manifest(root: Path, entry: dict) -> None:
    m = json.loads((root / "manifest.json").read_text())
    m["files"].append(entry)
    (root / "manifest.json").write_text(json.dumps(m))


def test_verify_with_a_fifo_as_key_ends(signed, tmp_path):
    root, _ = signed
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    proc = audit("verify", root, "--key", fifo, timeout=30)
    assert proc.returncode == 3
    one_error(proc, "not a regular file")


def test_verify_fails_a_sparse_200_gib_member_on_its_size_without_reading_it(signed):
    root, pub = signed
    with open(root / "artifacts" / "big.bin", "wb") as fh:
        fh.truncate(200 << 30)
    _list_in_manifest(root, {"path": "artifacts/big.bin", "sha256": "0" * 64, "size": 1})
    proc = audit("verify", root, "--key", pub, timeout=30)
    assert proc.returncode == 1
    assert f"FAIL artifacts/big.bin: size {200 << 30} does not match manifest.json (1)" in proc.stdout


def test_verify_of_a_name_with_an_unpaired_surrogate_is_a_failure(signed):
    root, pub = signed
    _list_in_manifest(root, {"path": "artifacts/x\ud800y", "sha256": "0" * 64, "size": 1})
    proc = audit("verify", root, "--key", pub, "--json", timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert any("unpaired surrogate" in line for line in json.loads(proc.stdout)["failures"])


def test_report_into_a_bundle_whose_run_record_is_a_fifo_ends(tmp_path):
    from test_verify import EVIDENCE

    evidence = tmp_path / "evidence"
    evidence.mkdir()
    for stage, obj in EVIDENCE.items():
        (evidence / f"{stage}.json").write_text(json.dumps(obj))
    out = tmp_path / "out"
    (out / "evidence").mkdir(parents=True)
    (out / "ro-crate-metadata.json").write_text("{}")
    os.mkfifo(out / "evidence" / "run.json")
    proc = audit("report", evidence, "--out", out, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    assert "no readable run record" in proc.stderr


# ---------------------------------------------------------------- unreadable inputs


def _unprivileged() -> tuple[str, ...]:
    """A command prefix under which a mode-000 file cannot be read: root without the capabilities
    that override file modes (the interpreter may live where another user cannot reach)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv not on PATH (util-linux)")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


@pytest.fixture
def unreadable(tmp_path, signed):
    root, pub = signed
    d = tmp_path / "locked"
    d.mkdir()
    lib = shared(d / "libx.so", "int f(void) { return 1; }\n")
    key = d / "key.pem"
    key.write_bytes(pub.read_bytes())
    evidence = d / "evidence"
    evidence.mkdir()
    (evidence / "run.json").write_text("{}")
    bundle = d / "bundle"
    shutil.copytree(root, bundle)
    for p in (lib, key, evidence, bundle):
        p.chmod(0)
    prefix = _unprivileged()
    probe = subprocess.run([*prefix, "cat", str(key)], capture_output=True, timeout=30)
    if probe.returncode == 0:
        pytest.skip("this user reads mode-000 files")
    yield {"lib": lib, "key": key, "evidence": evidence, "bundle": bundle, "good": root, "prefix": prefix}
    for p in (lib, key, evidence, bundle):
        p.chmod(0o755)


def test_check_and_inspect_of_an_unreadable_file_exit_3(unreadable):
    u = unreadable
    proc = audit("check", u["lib"], prefix=u["prefix"])
    assert proc.returncode == 3 and "Permission denied" in proc.stdout, proc.stdout + proc.stderr
    proc = audit("inspect", u["lib"], prefix=u["prefix"])
    assert proc.returncode == 3
    one_error(proc, "Permission denied")


def test_verify_of_an_unreadable_bundle_or_key_exits_3(unreadable, tmp_path):
    u = unreadable
    proc = audit("verify", u["bundle"], prefix=u["prefix"])
    assert proc.returncode == 3
    one_error(proc, "Permission denied")
    proc = audit("verify", u["good"], "--key", u["key"], prefix=u["prefix"])
    assert proc.returncode == 3
    one_error(proc, "Permission denied")
    proc = audit("verify", tmp_path / "nowhere", prefix=u["prefix"])
    assert proc.returncode == 3
    one_error(proc, "no such folder")


def test_report_of_unreadable_evidence_or_key_exits_3(unreadable, tmp_path):
    u = unreadable
    proc = audit("report", u["evidence"], "--out", tmp_path / "o1", prefix=u["prefix"])
    assert proc.returncode == 3
    one_error(proc, "Permission denied")
    proc = audit("report", u["good"], "--key", u["key"], "--out", tmp_path / "o2", prefix=u["prefix"])
    assert proc.returncode == 3
    one_error(proc, "Permission denied")
