"""DSSE: the PAE against the spec's test vector, signatures against openssl as an independent oracle."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.errors import EXIT_USAGE
from audit.signing import dsse
from audit.signing.keys import generate_keypair, load_signing_key
from conftest import require_tool


def test_pae_spec_test_vector():
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_pae_counts_bytes_not_characters():
    assert dsse.pae("t\u00e9", "\u00e9".encode()) == b"DSSEv1 3 t\xc3\xa9 2 \xc3\xa9"
    assert dsse.pae("", b"") == b"DSSEv1 0  0 "


def test_envelope_shape_and_round_trip():
    key = generate_keypair()
    body = json.dumps({"_type": "https://in-toto.io/Statement/v1"}).encode()
    env = dsse.sign(body, key)
    obj = json.loads(env.to_json())
    assert set(obj) == {"payloadType", "payload", "signatures"}
    assert obj["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(obj["payload"], validate=True) == body  # standard base64
    assert obj["signatures"][0]["keyid"] == key.keyid
    assert len(base64.b64decode(obj["signatures"][0]["sig"])) == 64
    back = dsse.loads(env.to_json())
    assert back.payload == body and back.verify(key.public)


def test_any_change_breaks_the_signature():
    key = generate_keypair()
    env = dsse.sign(b'{"a": 1}', key)
    assert env.verify(key.public)
    for i in range(len(env.payload)):
        p = bytearray(env.payload)
        p[i] ^= 0x01
        assert not dsse.Envelope(env.payload_type, bytes(p), env.signatures).verify(key.public)
    # the type is authenticated too
    assert not dsse.Envelope("application/json", env.payload, env.signatures).verify(key.public)
    sig = bytearray(env.signatures[0].sig)
    sig[0] ^= 0x01
    assert not dsse.Envelope(env.payload_type, env.payload,
                             (dsse.Signature(key.keyid, bytes(sig)),)).verify(key.public)
    assert not env.verify(generate_keypair().public)
    # truncated or empty signatures are a failed check, not an exception
    short = (dsse.Signature("", env.signatures[0].sig[:63]), dsse.Signature("", b""))
    assert not dsse.Envelope(env.payload_type, env.payload, short).verify(key.public)
    # every signature present must verify: a good one does not excuse the others, in either order
    mixed = dsse.Envelope(env.payload_type, env.payload, short[:1] + env.signatures + short[1:])
    assert not mixed.verify(key.public) and mixed.failing(key.public) == [0, 2]
    assert dsse.Envelope(env.payload_type, env.payload, env.signatures * 2).failing(key.public) == []
    assert not dsse.Envelope(env.payload_type, env.payload, ()).verify(key.public)  # none: not verified


def test_signature_matches_openssl(tmp_path):
    """Ed25519 is deterministic: openssl signing our PAE with the same key gives the same bytes."""
    openssl = require_tool("openssl")
    key = load_signing_key(None)
    (tmp_path / "k.pem").write_bytes(key.private_pem())
    pae = dsse.pae("http://example.com/HelloWorld", b"hello world")
    (tmp_path / "pae.bin").write_bytes(pae)
    subprocess.run([openssl, "pkeyutl", "-sign", "-inkey", str(tmp_path / "k.pem"), "-rawin",
                    "-in", str(tmp_path / "pae.bin"), "-out", str(tmp_path / "sig.bin")], check=True)
    env = dsse.sign(b"hello world", key, payload_type="http://example.com/HelloWorld")
    assert env.signatures[0].sig == (tmp_path / "sig.bin").read_bytes()


def test_rfc8032_known_answer():
    """RFC 8032 section 7.1 TEST 1 (empty message): the signing primitive under the envelope."""
    sk = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    sig = Ed25519PrivateKey.from_private_bytes(sk).sign(b"")
    assert sig.hex() == ("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
                         "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")


def test_base64_is_standard_padded_and_canonical_only():
    assert dsse.b64decode("e30=", "x") == b"{}"
    assert dsse.b64decode("", "x") == b""
    assert dsse.b64decode("+/8=", "x") == b"\xfb\xff"
    # unpadded, URL-safe, over-padded, whitespace, a stray bit after the last byte, junk, not a string
    for bad in ("e30", "-_8=", "e30===", "e30=\n", "e 30", "e31=", "e3@0", "é", 5):
        with pytest.raises(dsse.MalformedEnvelope, match="standard padded base64|not a base64 string") as exc:
            dsse.b64decode(bad, "x")
        assert exc.value.exit_code == EXIT_USAGE
    # the oracle: Python's own decoder, lenient mode, reads the stray-bit text as the same bytes
    assert base64.b64decode("e31=") == b"{}"


@pytest.mark.parametrize("obj, msg", [
    ([], "not a JSON object"),
    ({"payload": "e30=", "signatures": [{"sig": "AA=="}]}, "payloadType missing"),
    ({"payloadType": "t", "signatures": [{"sig": "AA=="}]}, "payload missing"),
    ({"payloadType": "t", "payload": "e30=", "signatures": []}, "signatures missing or empty"),
    ({"payloadType": "t", "payload": "e30=", "signatures": [{"keyid": "k"}]}, "has no sig"),
    ({"payloadType": "t", "payload": "e30=", "signatures": [{"sig": "AA==", "keyid": 3}]}, "keyid"),
    ({"payloadType": "t", "payload": "e30=", "signatures": [{"sig": "AA=="}], "note": "trust me"},
     "unknown field 'note'"),
    ({"payloadType": "t", "payload": "e30=", "signatures": [{"sig": "AA==", "keyid": "", "cert": "x"}]},
     r"signatures\[0\]: unknown field 'cert'"),
    ({"payloadType": "t", "payload": "e30", "signatures": [{"sig": "AA=="}]}, "payload is not standard padded"),
])
def test_malformed_envelopes(obj, msg):
    with pytest.raises(dsse.MalformedEnvelope, match=msg):
        dsse.parse(obj, "x")
