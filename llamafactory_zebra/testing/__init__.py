"""Offline stand-ins for the hub assets tests, examples and the quickstart need (no network, milliseconds),
and the builders both test venvs share (neither imports LLaMA-Factory)."""
