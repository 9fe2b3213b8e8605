"""The recipe's datasets for LLaMA-Factory: registry entries, converters, row checks, packing report.

Nothing here patches LLaMA-Factory; ``integration/datasets.py`` wires these pieces in.
"""
