"""Build a Zebra hybrid from a Transformer: ``convert_checkpoint(BASE, OUT, ConversionOptions(...))``.

MLA layers come from the base's attention by truncated SVD (``mla_init``), GDN layers by copying its
projections (``gdn_init``), everything else verbatim; ``selection`` picks the MLA layers (evenly or
by KL sensitivity), ``hybrid_plan`` decides the layer kinds and dimensions, ``report`` measures what
the ranks kept. See ``docs/convert.md``.
"""

from .hybrid_plan import ConversionOptions, uniform_mla_layers
from .pipeline import ConversionResult, convert_checkpoint
from .source import SUPPORTED_ARCHITECTURES, ConversionInputError

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "ConversionInputError",
    "ConversionOptions",
    "ConversionResult",
    "convert_checkpoint",
    "uniform_mla_layers",
]
