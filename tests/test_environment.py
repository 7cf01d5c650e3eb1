"""Environment capture: schema, the fields the report relies on, JSON-ready, one-line strings."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys

from audit.evidence.environment import capture


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def test_capture_is_complete_and_json_ready():
    env = capture()
    assert env["schema"] == "sovereign-audit.environment/1"
    json.dumps(env, allow_nan=False)
    for key in ("captured_at", "host", "os", "cpu", "python", "torch", "gpus", "toolchain", "env"):
        assert key in env
    assert env["host"] == " ".join(platform.node().split())
    assert env["python"].startswith(sys.version.split()[0])
    assert env["cpu"]["logical_cores"] >= 1
    assert set(env["toolchain"]) >= {"nvcc", "hipcc", "gcc"}
    # a tool that is installed has its version recorded, as the tool itself prints it
    for tool in ("nvcc", "hipcc", "gcc"):
        if shutil.which(tool):
            text = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=120).stdout
            assert env["toolchain"][tool] and env["toolchain"][tool] in text.splitlines(), (tool, env["toolchain"][tool])
    assert all("\n" not in s and len(s) <= 200 for s in _strings(env))


def test_torch_and_gpu_fields_agree():
    import torch

    env = capture()
    t = env["torch"]
    assert t["version"] == torch.__version__
    assert t["cuda_available"] == torch.cuda.is_available()
    assert len(t["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
