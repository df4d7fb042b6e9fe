"""Task tests share the data tests' freshly trained vocabulary cache (one per session)."""

from data.conftest import _session_cache_dir  # noqa: F401
