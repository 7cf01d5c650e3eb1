"""Jinja2 templates for the HTML report, installed with the package."""
