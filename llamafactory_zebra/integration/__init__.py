"""Everything that connects llamafactory-zebra to LLaMA-Factory; ``activation`` is the entry point."""
