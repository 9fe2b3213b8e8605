"""llamafactory-zebra: AMD's Zebra MLA + Gated DeltaNet hybrids for transformers and LLaMA-Factory.

Importing the package registers ``model_type="zebra"`` with transformers' Auto classes.
"""

__version__ = "0.1.0"
