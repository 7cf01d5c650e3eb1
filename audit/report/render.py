"""Render report.html with Jinja2: autoescape on for every template, StrictUndefined.

Templates are read through importlib.resources (package `audit.templates`), so an installed,
non-editable tool finds them. The CSS is our own file, included verbatim; every value that
comes from evidence is escaped by autoescape (no `|safe`, no Markup anywhere).
"""

from __future__ import annotations

import os
import tempfile
from audit.resources import data_root
from pathlib import Path

import jinja2

TEMPLATE = "report.html.j2"


def _load(name: str) -> str:
    try:
        return data_root("templates").joinpath(name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise jinja2.TemplateNotFound(name) from exc


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        # .html/.j2/.xml/.svg escaped; our stylesheet (.css) is included as-is: it holds no values.
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "htm", "xml", "j2", "svg"),
                                            disabled_extensions=("css",), default_for_string=True,
                                            default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["num"] = _num
    env.filters["pct"] = lambda x, d=1: "n/a" if x is None else f"{100 * float(x):.{d}f}%"
    return env


def _num(x, spec: str = ".3g") -> str:
    if x is None:
        return "n/a"
    try:
        return format(float(x), spec)
    except (TypeError, ValueError):
        return str(x)


def render_report(model) -> str:
    data = model.to_dict() if hasattr(model, "to_dict") else model
    return environment().get_template(TEMPLATE).render(**data)


def write_report(model, path: Path) -> Path:
    html = render_report(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(html)
    os.replace(tmp, path)
    return path
