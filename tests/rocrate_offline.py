"""Run roc-validator on a crate with no network: python3 rocrate_offline.py CRATE_DIR JOBS_JSON.

JOBS_JSON is a list of {"profile", "severity", "skip": [check ids]}; prints one JSON object with each
job's verdict and issues, and every URL the validator asked for.

roc-validator fetches everything remote (the crate's JSON-LD @context, for its own checks and for
rdflib's JSON-LD parser, which it routes through the same client) with `requests`. Here every request
reaches requests' transport adapter, which is replaced: a URL listed in SERVED gets the file shipped in
tests/fixtures/jsonld/, any other URL a 404, and each is recorded so the test can say what was asked.
Sockets are disabled as well, so anything that tried to go around `requests` fails loudly instead of
quietly using the network. Run in its own process: the patches and roc-validator's global state (its
HTTP client singleton, rdflib's patched loader) stay out of the test session.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "jsonld"
SERVED = {"https://w3id.org/ro/crate/1.2/context": FIXTURES / "ro-crate-1.2-context.jsonld"}
asked: list[str] = []


def _send(self, request, **kwargs):
    asked.append(request.url)
    response = requests.Response()
    response.request, response.url = request, request.url
    path = SERVED.get(request.url)
    if path is None:
        response.status_code, response.reason, response._content = 404, "Not Found", b""
    else:
        response.status_code, response.reason = 200, "OK"
        response.headers["Content-Type"] = "application/ld+json"
        response._content = path.read_bytes()
    return response


def _no_network(*args, **kwargs):
    raise OSError("network disabled: roc-validator must be served from tests/fixtures/jsonld")


def main(crate: str, jobs_json: str) -> None:
    HTTPAdapter.send = _send
    socket.socket.connect = _no_network
    socket.create_connection = _no_network
    from rocrate_validator import services  # after the patches: nothing may connect at import either

    results = []
    for job in json.loads(jobs_json):
        settings = services.ValidationSettings(
            rocrate_uri=crate, profile_identifier=job["profile"], requirement_severity=job["severity"],
            skip_checks=job.get("skip") or None, no_cache=True)  # no cache: every request reaches _send
        result = services.validate(settings)
        results.append({**job, "passed": result.passed(), "issues": [
            {"check": i.identifier, "severity": i.severity.name, "message": i.message,
             "entity": i.violatingEntity, "property": i.violatingProperty}
            for i in result.get_issues()]})
    print(json.dumps({"results": results, "asked": sorted(set(asked))}))


if __name__ == "__main__":
    main(*sys.argv[1:])
