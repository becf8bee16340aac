"""Helpers every package may use (CLI plumbing, free ports, YAML writing); imports none of them.

This is the neutral floor: trainer, serving, pipeline, infra and stacks import from here instead of
from one another, and tests/test_layering.py keeps this package free of project imports.
"""
