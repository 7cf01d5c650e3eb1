"""A wheel member whose LZMA stream cannot be decoded (invalid properties: what the contract
fuzzer's "compression method changed" mutation makes) is that member's error, exit 3, never an
internal error (exit 4); an undecodable METADATA is an error too, and the SBOM then names the
wheel by its file name only."""

from __future__ import annotations

import json
import zipfile

from linkage_fixtures import cc_shared

from audit.cli import main


def _lzma_wheel(path, members: dict[str, bytes], broken: str):
    """A wheel with every member LZMA-compressed (zipfile), `broken`'s properties byte set to
    one no LZMA decoder accepts (lc+lp+pb > 4)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_LZMA) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(broken)
    at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 4  # after version, size
    raw[at] = 0xFF
    path.write_bytes(bytes(raw))
    return path


def test_an_undecodable_lzma_member_is_that_members_error(tmp_path, capsys):
    lib = cc_shared(tmp_path / "libok.so", "int ok(void) { return 0; }")
    meta = b"Name: lz\nVersion: 1\n"
    whl = _lzma_wheel(tmp_path / "lz-1-py3-none-any.whl",
                      {"lz-1.dist-info/METADATA": meta, "lz/libok.so": lib.read_bytes(),
                       "lz/libbad.so": lib.read_bytes()}, "lz/libbad.so")
    for fmt in ("json", "cyclonedx"):
        try:
            main(["check", str(whl), "--format", fmt])
        except SystemExit as exc:
            rc = exc.code
        out = capsys.readouterr()
        assert rc == 3, out.err
        doc = json.loads(out.out)
        text = json.dumps(doc)
        assert "lz/libbad.so" in text and "cannot read member" in text
    broken_meta = _lzma_wheel(tmp_path / "lz-2-py3-none-any.whl",
                              {"lz-2.dist-info/METADATA": meta, "lz/libok.so": lib.read_bytes()},
                              "lz-2.dist-info/METADATA")
    try:
        main(["check", str(broken_meta), "--format", "cyclonedx"])
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    assert rc == 3, out.err  # every member is read: one that cannot be is an error
    wheel = json.loads(out.out)["components"][0]
    assert wheel["name"] == "lz-2-py3-none-any.whl" and "purl" not in wheel
