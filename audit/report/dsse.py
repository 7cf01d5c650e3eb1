"""DSSE envelopes (Dead Simple Signing Envelope v1) signed with Ed25519.

Envelope: {"payloadType", "payload" (standard base64), "signatures": [{"keyid", "sig"}]}.
The signature covers PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body, lengths in
ASCII decimal of the byte lengths; so the type is authenticated along with the body.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.errors import UsageError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
_B64_STD = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_B64_URL = re.compile(r"^[A-Za-z0-9_-]*={0,2}$")


class MalformedEnvelope(UsageError):
    """An envelope that is not DSSE at all (bad JSON, fields, base64): a malformed bundle, exit 2."""


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str, what: str) -> bytes:
    """Strict base64: standard alphabet (what we write) or URL-safe (DSSE allows either), padded or not."""
    if not isinstance(text, str):
        raise MalformedEnvelope(f"{what} is not a base64 string")
    padded = text + "=" * (-len(text) % 4)
    try:
        if _B64_STD.match(text):
            return base64.b64decode(padded, validate=True)
        if _B64_URL.match(text):
            return base64.urlsafe_b64decode(padded)
    except (binascii.Error, ValueError):
        pass
    raise MalformedEnvelope(f"{what} is not valid base64")


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes

    def to_dict(self) -> dict:
        return {"keyid": self.keyid, "sig": b64encode(self.sig)}


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"payloadType": self.payload_type, "payload": b64encode(self.payload),
                "signatures": [s.to_dict() for s in self.signatures]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def verify(self, public: Ed25519PublicKey) -> bool:
        """True when at least one signature verifies under `public` (keyid is only a hint)."""
        message = pae(self.payload_type, self.payload)
        for s in self.signatures:
            try:
                public.verify(s.sig, message)
                return True
            except InvalidSignature:
                continue
        return False


def sign(body: bytes, key, payload_type: str = PAYLOAD_TYPE) -> Envelope:
    """Sign `body` with a SigningKey (audit.report.keys) into an envelope."""
    sig = key.sign(pae(payload_type, body))
    return Envelope(payload_type, body, (Signature(key.keyid, sig),))


def parse(obj, what: str = "envelope") -> Envelope:
    """An Envelope from parsed JSON; MalformedEnvelope when it is not a DSSE envelope."""
    if not isinstance(obj, dict):
        raise MalformedEnvelope(f"{what}: not a JSON object")
    ptype, payload, sigs = obj.get("payloadType"), obj.get("payload"), obj.get("signatures")
    if not isinstance(ptype, str):
        raise MalformedEnvelope(f"{what}: payloadType missing")
    if not isinstance(payload, str):
        raise MalformedEnvelope(f"{what}: payload missing")
    if not isinstance(sigs, list) or not sigs:
        raise MalformedEnvelope(f"{what}: signatures missing or empty")
    out = []
    for i, s in enumerate(sigs):
        if not isinstance(s, dict) or not isinstance(s.get("sig"), str):
            raise MalformedEnvelope(f"{what}: signatures[{i}] has no sig")
        keyid = s.get("keyid", "")
        if not isinstance(keyid, str):
            raise MalformedEnvelope(f"{what}: signatures[{i}].keyid is not a string")
        out.append(Signature(keyid, b64decode(s["sig"], f"{what}: signatures[{i}].sig")))
    return Envelope(ptype, b64decode(payload, f"{what}: payload"), tuple(out))


def loads(text: str | bytes, what: str = "envelope") -> Envelope:
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise MalformedEnvelope(f"{what}: not JSON ({exc})") from None
    return parse(obj, what)
