"""Everything that connects llamafactory-zebra to LLaMA-Factory; ``activation`` is the entry point."""

# What a changed LLaMA-Factory seam's error ends with (``seams.py`` has the table).
SEAM_HINT = (
    "llamafactory-zebra supports LLaMA-Factory 0.9.x (set LLAMAFACTORY_ZEBRA_DISABLE=1 to run LLaMA-Factory "
    "without the plugin)"
)
