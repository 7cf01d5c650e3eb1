"""Hostile archives: a wheel member past the size or compression-ratio limit is refused (exit 3,
one line) without being unpacked; members are streamed, so a large one costs disk, not memory;
the report is the same whether members are audited in one process or several."""

from __future__ import annotations

import json
import re
import zipfile

import pytest
from linkage_fixtures import linkage_libs  # noqa: F401  (fixture)

from audit.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE
from audit.linkage.check import check_paths
from audit.linkage.containers.inputs import ArchiveLimits
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from cli_runner import cli

MiB = 1 << 20


def zeros_wheel(path, header: bytes, zeros: int, extra: dict) -> None:
    """A wheel whose member pkg/big.so is a real ELF header and then `zeros` zero bytes, written
    in streaming mode (never whole in memory), beside ordinary members."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("pkg/big.so", "w", force_zip64=True) as out:
            out.write(header)
            chunk = bytes(MiB)
            for _ in range(zeros // MiB):
                out.write(chunk)
        for name, src in extra.items():
            zf.write(src, name)


@pytest.fixture
def bomb(linkage_libs, tmp_path):  # noqa: F811
    whl = tmp_path / "bomb-1.0-py3-none-linux_x86_64.whl"
    header = linkage_libs["clean"].read_bytes()[:64]  # the ELF header of a gcc-built library
    zeros_wheel(whl, header, 72 * MiB, {"pkg/libclean.so": linkage_libs["clean"]})
    return whl


def test_member_over_the_size_limit_is_refused_in_one_line(bomb, capsys):
    rc, out, _ = cli(capsys, "check", "--max-member-size", "16M", bomb)
    assert rc == EXIT_INPUT
    assert len([ln for ln in out.splitlines() if "--max-member-size" in ln]) == 1  # why, in one line
    rc, out, _ = cli(capsys, "check", "--max-member-size", "16M", "--format", "json", bomb)
    doc = json.loads(out)
    verdicts = {f["path"].rsplit("!/", 1)[1]: f["verdict"] for f in doc["files"]}
    assert verdicts == {"pkg/big.so": "error", "pkg/libclean.so": "pass"}  # the rest is still audited


def test_member_over_the_ratio_limit_is_refused_and_a_raised_limit_lets_it_through(bomb, capsys):
    rc, out, _ = cli(capsys, "check", "--format", "json", bomb)  # defaults: 100:1 from 64 MiB; zeros compress ~1000:1
    doc = json.loads(out)
    big = [f for f in doc["files"] if f["path"].endswith("big.so")][0]
    assert rc == EXIT_INPUT and big["verdict"] == "error" and "--max-member-ratio" in big["error"]
    assert "\n" not in big["error"]
    rc, out, _ = cli(capsys, "check", "--max-member-ratio", "100000", "--format", "json", bomb)
    doc = json.loads(out)
    big = [f for f in doc["files"] if f["path"].endswith("big.so")][0]
    assert big["verdict"] != "error" and big["size"] == 64 + 72 * MiB  # unpacked whole, then read


def test_a_small_member_may_compress_as_well_as_it_likes(linkage_libs, tmp_path, capsys):  # noqa: F811
    whl = tmp_path / "small-1.0-py3-none-linux_x86_64.whl"  # like cuDNN's 2 MB engine at 327:1
    zeros_wheel(whl, linkage_libs["clean"].read_bytes()[:64], 2 * MiB, {})
    rc, out, _ = cli(capsys, "check", "--format", "json", whl)
    assert json.loads(out)["files"][0]["verdict"] != "error"


def test_archive_total_limit(bomb, capsys):
    rc, out, _ = cli(capsys, "check", "--max-member-ratio", "100000", "--max-archive-size", "8M",
                     "--format", "json", bomb)
    doc = json.loads(out)
    assert rc == EXIT_INPUT and any("--max-archive-size" in (f["error"] or "") for f in doc["files"])


def test_limits_must_be_sizes(bomb, capsys):
    for args in (["--max-member-size", "lots"], ["--max-archive-size", "0"], ["--max-member-ratio", "0.5"],
                 ["--jobs", "0"]):
        rc, _, err = cli(capsys, "check", *args, bomb)
        assert rc == EXIT_USAGE and err.count("\n") == 1


def test_the_report_does_not_depend_on_the_number_of_workers(linkage_libs, tmp_path):  # noqa: F811
    whl = tmp_path / "demo-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        for key in ("clean", "origin_top", "static_cublas", "dlopen_cuda"):
            zf.write(linkage_libs[key], f"demo/{key}.so")
        zf.write(linkage_libs["origin_mid"], "demo/deps/libmiddle.so")
    policy = load_policy(None)
    docs = []
    for jobs in (1, 2):
        report = check_paths([str(whl), str(linkage_libs["clean"].parent)], policy, ResolveOptions(), jobs=jobs,
                             limits=ArchiveLimits())
        doc = report.to_dict()
        doc.pop("elapsed_s", None)
        text = json.dumps(doc, sort_keys=True).replace(str(tmp_path), "TMP")
        docs.append(re.sub(r"sovereign-audit-wheel-[A-Za-z0-9_]+", "UNPACKED", text))
    assert len(json.loads(docs[0])["files"]) > 5
    assert docs[0] == docs[1]
    assert EXIT_OK != report.exit_code  # the demo holds vendor evidence: the comparison is not of empties
