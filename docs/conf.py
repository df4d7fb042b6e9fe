"""Sphinx configuration of the ptmjax documentation site: the Markdown guides of docs/ (MyST) and an API
reference generated from the package's docstrings (sphinx-autodoc2, which reads the source without importing
it, and parses the docstrings as the Markdown they are written in). docs/documentation.md says how to build it."""

project = "ptmjax"
author = "the ptmjax authors"
extensions = ["myst_parser", "autodoc2"]
root_doc = "index"
exclude_patterns = ["_build"]

# Headings get GitHub's anchors, so that the guides' `page.md#heading` links resolve here as on GitHub.
myst_heading_anchors = 4

autodoc2_packages = [{"path": "../ptmjax", "auto_mode": True}]
autodoc2_output_dir = "_api"
autodoc2_render_plugin = "myst"
autodoc2_docstring_parser_regexes = [(r".*", "myst")]
autodoc2_hidden_objects = ["private", "dunder", "inherited"]

html_theme = "sphinx_book_theme"
html_title = "ptmjax"
html_theme_options = {"show_toc_level": 2}
