"""Where the shipped data lives: the policies and templates.

Installed, they are the packages `audit.policies` and `audit.templates` (pyproject maps the
top-level folders there). Run straight from a checkout without installing (PYTHONPATH=., as on a
device machine with no network), those packages do not exist; the folders beside `audit/` do.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def data_root(kind: str):
    """A Traversable for `policies` or `templates`: the installed package, else the checkout folder."""
    try:
        return resources.files(f"audit.{kind}")
    except ModuleNotFoundError:
        folder = _CHECKOUT / kind
        if folder.is_dir():
            return folder
        raise
