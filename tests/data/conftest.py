"""Data tests share one freshly trained vocabulary in a per-session cache dir."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """Points PTMJAX_CACHE_DIR at an empty directory for the whole session."""
    previous = os.environ.get("PTMJAX_CACHE_DIR")
    os.environ["PTMJAX_CACHE_DIR"] = str(tmp_path_factory.mktemp("ptmjax_cache"))
    yield
    if previous is None:
        del os.environ["PTMJAX_CACHE_DIR"]
    else:
        os.environ["PTMJAX_CACHE_DIR"] = previous
