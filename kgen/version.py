"""kgen's version: in cache keys, tuned-table names and manifests."""

__version__ = "0.1.0"
