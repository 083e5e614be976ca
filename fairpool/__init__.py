"""fairpool: share scarce compute between teams and pipelines."""

from fairpool.settings import ResourceSettings

__all__ = ["ResourceSettings"]
__version__ = "0.1.0"
