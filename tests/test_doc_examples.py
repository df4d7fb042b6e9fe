"""The pages' examples run as written: every bash and Python block marked `<!-- run -->` on the README, docs/ and
the experiments' READMEs (tests/test_docs.py checks that every other block says why it is not run).

All pages share one fresh folder, as a user's working folder, so that a page finds the runs an earlier one made;
a page whose prose names a run made elsewhere gets it first (PREREQUISITES). The pages' own paths for a user's
files (`/path/to/...`, `/data/books`) become files of that folder: a tiny Hugging Face BertForMaskedLM with its
WordPiece tokenizer, and text files of the embedded corpus. Every `ptmjax train` trains for 4 steps (TINY)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
from test_docs import PAGES, RUN, examples, page_id

from ptmjax.data import corpus

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["train.num_steps = 4", "train.eval_every = 2", "train.checkpoint_every = 2", "train.eval_batches = 1",
        "train.inference_eval_examples = 4", "train.show_progress = False"]
PREREQUISITES = {  # page -> (the run folder its prose says it starts from, the command that makes it)
    "docs/inference.md": ("runs/demo", "ptmjax train"),
    "docs/scale.md": ("runs/demo", "ptmjax train"),
    "docs/probing.md": ("runs/bert_demo", "ptmjax train --gin_file runs/bert_demo.gin"),
    "experiments/decoding/README.md": ("runs/demo", "ptmjax train"),
}
USER_FILES = {"prompts.txt": "Return the sum of a and b.\nOpen the file and return its lines.\n"}
RUN_PAGES = [page for page in PAGES if any(RUN.fullmatch(marker) for marker, _, _ in examples(page))]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> pathlib.Path:
    """The user's working folder, with the files the pages name as a user's own."""
    path = tmp_path_factory.mktemp("pages")
    for name, text in USER_FILES.items():
        (path / name).write_text(text)
    books = path / "data" / "books"
    books.mkdir(parents=True)
    docstrings = corpus.stdlib_docstrings("train")
    (books / "train-0.txt").write_text("\n".join(docstrings[:200]))
    (books / "valid.txt").write_text("\n".join(docstrings[200:240]))
    save_tiny_bert(path / "hf_bert")
    return path


def save_tiny_bert(path: pathlib.Path) -> None:
    """A random BertForMaskedLM (2 layers of width 32) and a 300-piece WordPiece tokenizer trained on the corpus."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_folders import saved, wordpiece_tokenizer

    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    saved(path, tokenizer, transformers.BertForMaskedLM(config))


def in_folder(code: str, folder: pathlib.Path) -> str:
    """The block with the pages' paths for a user's files made paths of `folder`."""
    for placeholder in ("/path/to/hf_dir", "/path/to/hf_bert"):
        code = code.replace(placeholder, str(folder / "hf_bert"))
    code = code.replace("/path/to/", f"{folder}/").replace("/data/books", str(folder / "data" / "books"))
    return code.replace("/tmp/two_hosts", str(folder / "two_hosts"))


def tiny_shell(code: str) -> str:
    """A bash block as the test runs it: `ptmjax` from this environment, every `ptmjax train` 4 steps long."""
    bindings = " ".join(f'--gin_bindings="{binding}"' for binding in TINY)
    code = code.replace(".venv/bin/ptmjax", "ptmjax")
    return re.sub(r"\bptmjax train\b", f"ptmjax train {bindings}", code)


def run(command: list[str], folder: pathlib.Path, what: str) -> None:
    env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"{what} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("page", RUN_PAGES, ids=page_id)
def test_the_pages_examples_run_as_written(page, folder):
    name = page_id(page)
    if name in PREREQUISITES and not (folder / PREREQUISITES[name][0]).exists():
        run(["bash", "-euc", tiny_shell(PREREQUISITES[name][1])], folder, f"{name}'s prerequisite")
    for marker, language, code in examples(page):
        if not RUN.fullmatch(marker):
            continue
        code = in_folder(code, folder)
        what = f"{name}: the {language} block `{code.splitlines()[0]}`"
        if language == "bash":
            run(["bash", "-euc", tiny_shell(code)], folder, what)
        else:
            run([sys.executable, "-c", code], folder, what)
