"""promptcache: a caching reverse proxy for LLM APIs."""

__version__ = "0.1.0"
