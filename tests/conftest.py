"""Shared test fixtures. Fixture binaries are built by real compilers at test time."""

from __future__ import annotations

import shutil

import pytest

def require_tool(name: str) -> str:
    """Return the tool's path, or skip the test saying which package provides it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH (make test installs it; nvcc comes with CUDA)")
    return path


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory):
    """One folder per session where fixture builders put what they compile."""
    return tmp_path_factory.mktemp("fixtures")
