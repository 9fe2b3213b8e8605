"""Worker functions for the multi-process sequence-parallel tests (spawned, so importable by name)."""
