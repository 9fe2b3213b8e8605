"""``llamafactory-zebra`` subcommands; each module registers itself with ``add_parser``."""
