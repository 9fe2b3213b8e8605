"""Memory planning for Zebra training: parameter inventory, model states by ZeRO stage, activations by kernel.

``llamafactory-zebra plan`` (``cli/plan_cmd.py``) is the user-facing side; docs/planning.md explains the model.
"""
