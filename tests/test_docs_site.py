"""The documentation site builds with warnings as errors, the command docs/documentation.md gives, and holds the
guides and the API reference generated from the docstrings. Needs the `docs` extra; about 5 minutes on 2 cores."""

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_site_builds_without_warnings_with_the_guides_and_the_api_reference(tmp_path):
    for module in ("sphinx", "myst_parser", "autodoc2", "sphinx_book_theme"):
        pytest.importorskip(module, reason="pip install -e '.[docs]'")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "Pre-training runs from gin files" in (tmp_path / "index.html").read_text()  # the README's table
    for guide in sorted((ROOT / "docs").glob("*.md")):
        assert (tmp_path / f"{guide.stem}.html").exists(), guide.name
    loading = (tmp_path / "_api" / "ptmjax" / "ptmjax.inference.loading.html").read_text()
    assert "the most ids an input may have" in loading  # `ptmjax.load`'s docstring
