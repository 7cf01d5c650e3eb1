"""DSSE envelopes (Dead Simple Signing Envelope v1) signed with Ed25519.

Envelope: {"payloadType", "payload" (standard base64), "signatures": [{"keyid", "sig"}]}.
The signature covers PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body, lengths in
ASCII decimal of the byte lengths; so the type is authenticated along with the body.

What we accept is what we write, and docs/verify.md's openssl procedure checks the same:
* payload and sig are standard base64 with padding (RFC 4648 section 4), exactly as re-encoding their
  bytes gives them back: no URL-safe alphabet, no missing padding, no whitespace, no stray bits;
* no field beyond payloadType, payload, signatures and, in each signature, keyid and sig: nothing
  unsigned rides along looking signed;
* every signature present must verify (`Envelope.failing` names the ones that do not).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.errors import UsageError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
ENVELOPE_FIELDS = ("payloadType", "payload", "signatures")
SIGNATURE_FIELDS = ("keyid", "sig")


class MalformedEnvelope(UsageError):
    """An envelope that is not DSSE at all (bad JSON, fields, base64): a malformed bundle, exit 2."""


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str, what: str) -> bytes:
    """Strict base64: the standard alphabet with padding, and canonical (what b64encode gives back)."""
    if not isinstance(text, str):
        raise MalformedEnvelope(f"{what} is not a base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        data = None
    if data is None or b64encode(data) != text:
        raise MalformedEnvelope(f"{what} is not standard padded base64")
    return data


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

    def failing(self, public: Ed25519PublicKey) -> list[int]:
        """Indices of the signatures that do not verify under `public` (keyid is only a hint)."""
        message = pae(self.payload_type, self.payload)
        bad = []
        for i, s in enumerate(self.signatures):
            try:
                public.verify(s.sig, message)
            except InvalidSignature:
                bad.append(i)
        return bad

    def verify(self, public: Ed25519PublicKey) -> bool:
        """True when there is a signature and every one verifies under `public`."""
        return bool(self.signatures) and not self.failing(public)


def sign(body: bytes, key, payload_type: str = PAYLOAD_TYPE) -> Envelope:
    """Sign `body` with a SigningKey (audit.signing.keys) into an envelope."""
    sig = key.sign(pae(payload_type, body))
    return Envelope(payload_type, body, (Signature(key.keyid, sig),))


def parse(obj, what: str = "envelope") -> Envelope:
    """An Envelope from parsed JSON; MalformedEnvelope when it is not a DSSE envelope."""
    if not isinstance(obj, dict):
        raise MalformedEnvelope(f"{what}: not a JSON object")
    _no_unknown(obj, ENVELOPE_FIELDS, what)
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
        _no_unknown(s, SIGNATURE_FIELDS, f"{what}: signatures[{i}]")
        keyid = s.get("keyid", "")
        if not isinstance(keyid, str):
            raise MalformedEnvelope(f"{what}: signatures[{i}].keyid is not a string")
        out.append(Signature(keyid, b64decode(s["sig"], f"{what}: signatures[{i}].sig")))
    return Envelope(ptype, b64decode(payload, f"{what}: payload"), tuple(out))


def _no_unknown(obj: dict, known: tuple[str, ...], what: str) -> None:
    extra = sorted(k for k in obj if k not in known)
    if extra:
        shown = ", ".join(repr(k)[:40] for k in extra[:3])
        raise MalformedEnvelope(f"{what}: unknown field {shown} (only {', '.join(known)} are allowed)")


def loads(text: str | bytes, what: str = "envelope") -> Envelope:
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise MalformedEnvelope(f"{what}: not JSON ({exc})") from None
    return parse(obj, what)
