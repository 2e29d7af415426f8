"""WindVE: collaborative CPU + accelerator text-embedding service."""

__version__ = "0.1.0"
