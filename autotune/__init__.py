"""autotune: search the transformers inference stack for the fastest, leanest configuration."""

__version__ = "0.1.0"
