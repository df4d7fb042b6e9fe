"""The pages' examples run as written: every bash and Python block marked `<!-- run -->` on the README, docs/ and
the experiments' READMEs (tests/test_docs.py checks that every other block says why it is not run).

All pages share one fresh folder, as a user's working folder, so that a page finds the runs an earlier one made;
a page whose prose names a run made elsewhere gets it first (PREREQUISITES). The pages' own paths for a user's
files (`/path/to/...`, `/data/books`) become files of that folder: tiny Hugging Face folders (save_hf_folders)
and text files of the embedded corpus. Every `ptmjax train` trains for 4 steps (TINY)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
from test_docs import PAGES, RUN, examples, page_id

from ptmjax.data import corpus

pytestmark = pytest.mark.slow

TINY = ["train.num_steps = 4", "train.eval_every = 2", "train.checkpoint_every = 2", "train.eval_batches = 1",
        "train.inference_eval_examples = 4", "train.show_progress = False"]
PREREQUISITES = {  # page -> (the run folder its prose says it starts from, the command that makes it)
    "docs/inference.md": ("runs/demo", "ptmjax train"),
    "docs/scale.md": ("runs/demo", "ptmjax train"),
    "docs/probing.md": ("runs/bert_demo", "ptmjax train --gin_file runs/bert_demo.gin"),
    "experiments/decoding/README.md": ("runs/demo", "ptmjax train"),
}
USER_FILES = {name: "Return the sum of a and b.\nOpen the file and return its lines.\n"
              for name in ("prompts.txt", "texts.txt")}
RUN_PAGES = [page for page in PAGES if any(RUN.fullmatch(marker) for marker, _, _ in examples(page))]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> pathlib.Path:
    """The user's working folder, with the files and Hugging Face folders the pages name as a user's own."""
    path = tmp_path_factory.mktemp("pages")
    for name, text in USER_FILES.items():
        (path / name).write_text(text)
    books = path / "data" / "books"
    books.mkdir(parents=True)
    docstrings = corpus.stdlib_docstrings("train")
    (books / "train-0.txt").write_text("\n".join(docstrings[:200]))
    (books / "valid.txt").write_text("\n".join(docstrings[200:240]))
    save_hf_folders(path)
    return path


def save_hf_folders(path: pathlib.Path) -> None:
    """Random tiny transformers models with tokenizers trained on the corpus: `hf_bert` a BertForMaskedLM,
    `bert_base` a BertModel, `sentence_transformer` a BertModel with sentence-transformers' files, `hf_t5` a T5
    with its own SentencePiece model, `byt5`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_folders import (
        SMALL_BERT,
        SMALL_T5,
        save_sentencepiece_t5,
        saved,
        wordpiece_tokenizer,
        write_sentence_transformers_files,
    )

    tokenizer = wordpiece_tokenizer(transformers.BertTokenizer)
    bert = transformers.BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SMALL_BERT)
    torch.manual_seed(0)
    for name, model_class in (("hf_bert", "BertForMaskedLM"), ("bert_base", "BertModel"),
                              ("sentence_transformer", "BertModel")):
        saved(path / name, tokenizer, getattr(transformers, model_class)(bert))
    write_sentence_transformers_files(path / "sentence_transformer", pooling="mean", max_seq_length=32)
    save_sentencepiece_t5(path / "hf_t5")
    byte_tokenizer = transformers.ByT5Tokenizer()
    saved(path / "byt5", byte_tokenizer, transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=len(byte_tokenizer), feed_forward_proj="gated-gelu", tie_word_embeddings=False, **SMALL_T5)))


def in_folder(code: str, folder: pathlib.Path) -> str:
    """The block with the pages' paths for a user's files made paths of `folder` (/path/to/hf_dir: hf_bert)."""
    code = code.replace("/path/to/hf_dir", "/path/to/hf_bert").replace("/path/to/", f"{folder}/")
    code = code.replace("/data/books", str(folder / "data" / "books"))
    return code.replace("/tmp/two_hosts", str(folder / "two_hosts"))


def tiny_shell(code: str) -> str:
    """A bash block as the test runs it: `ptmjax` from this environment, comments dropped, and every
    `ptmjax train` 4 steps long (TINY bound last, so that they override the page's own bindings)."""
    bindings = "".join(f' --gin_bindings="{binding}"' for binding in TINY)
    code = re.sub(r"\s+#.*$", "", code.replace("\\\n", " ").replace(".venv/bin/ptmjax", "ptmjax"), flags=re.M)
    return re.sub(r"(\bptmjax train\b[^&;|\n]*?)(\s*(?:&|;|\|)|$)", rf"\1{bindings}\2", code, flags=re.M)


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
