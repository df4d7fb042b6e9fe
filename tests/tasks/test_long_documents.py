"""Long-document tasks over whole stdlib source files: the files, their split, the LM pieces against the
vocabulary's own encoding sliced by hand, and the module-summary examples."""

import hashlib
import sys
import textwrap

import numpy as np
import pytest
import seqio

from ptmjax.data import corpus, stdlib_sources
from ptmjax.tasks import long_documents


def test_source_files_are_the_corpus_modules_and_their_package_files():
    files = dict(stdlib_sources.source_files())
    root = stdlib_sources.stdlib_root()
    assert files["argparse"] == root / "argparse.py"
    assert files["json"] == root / "json" / "__init__.py" and files["json.decoder"] == root / "json" / "decoder.py"
    assert files["http.client"] == root / "http" / "client.py"
    assert "math" not in files  # built in: no source file
    assert not [name for name in files if ".test." in f".{name}." or ".tests." in f".{name}."]
    names = list(files)
    assert names.index("abc") < names.index("argparse") < names.index("json") < names.index("json.decoder")
    assert {name.split(".")[0] for name in names} <= {module.split(".")[0] for module in corpus.STDLIB_MODULES}


def test_split_by_the_hash_of_the_module_name():
    train, validation = (dict(stdlib_sources.stdlib_sources(split)) for split in corpus.SPLITS)
    assert not set(train) & set(validation)
    for name in [*train, *validation]:
        bucket = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % 100
        assert (name in validation) == (bucket < stdlib_sources.VALIDATION_PERCENT), name
    every = {name for name, path in stdlib_sources.source_files() if path.read_text(encoding="utf-8").strip()}
    assert set(train) | set(validation) == every
    assert 0.08 < len(validation) / len(every) < 0.25
    assert validation["json"] == (stdlib_sources.stdlib_root() / "json" / "__init__.py").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        stdlib_sources.stdlib_sources("test")


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the file list is CPython 3.11's")
def test_sizes_on_cpython_3_11():
    assert [len(stdlib_sources.stdlib_sources(split)) for split in corpus.SPLITS] == [176, 28]
    assert [len(long_documents.module_summary_examples(split)) for split in corpus.SPLITS] == [115, 16]


def test_long_lm_rows_are_consecutive_pieces_of_one_file_without_eos():
    task = seqio.get_mixture_or_task(long_documents.LONG_LM_TASK)
    vocabulary = task.output_features["targets"].vocabulary
    length = 512
    rows = [row["targets"].tolist() for row in
            task.get_dataset({"targets": length}, "validation", shuffle=False, use_cached=False).as_numpy_iterator()]
    expected = []
    for _, text in stdlib_sources.stdlib_sources("validation"):
        # The task's tokenizer (TF's SentencePiece op): on a tie in zipfile's source it segments one string
        # differently from `vocabulary.encode` (Python's SentencePiece), so that is not the reference here.
        ids = vocabulary.encode_tf(text).numpy().tolist()
        expected += [ids[start:start + length] for start in range(0, len(ids), length)]
    assert rows == expected
    assert sum(len(row) == length for row in rows) > 100  # long files: many full rows
    assert not any(vocabulary.eos_id in row for row in rows)


def test_module_summary_and_body_cuts_the_docstring_out():
    source = textwrap.dedent('''\
        # A comment stays.
        """Read and write
        things, in two lines.

        More detail here.
        """
        import os
        x = "Read and write"
        ''')
    summary, body = stdlib_sources.module_summary_and_body(source)
    assert summary == "Read and write things, in two lines."
    assert body == '# A comment stays.\nimport os\nx = "Read and write"\n'
    assert stdlib_sources.module_summary_and_body("import os\n") is None  # no docstring
    assert stdlib_sources.module_summary_and_body('"""Too short."""\n') is None
    assert stdlib_sources.module_summary_and_body('"""plistlib.py -- a tool."""\n') is not None
    assert stdlib_sources.module_summary_and_body('"""--- not a summary ---"""\n') is None
    assert stdlib_sources.module_summary_and_body("def broken(:\n") is None
    repeated = ('"""Class representing message documents."""\n'
                'class A:\n    """Class representing message\n    documents."""\n')
    assert stdlib_sources.module_summary_and_body(repeated) is None


def test_module_summary_task_encodes_the_cut_source_and_its_summary():
    task = seqio.get_mixture_or_task(long_documents.MODULE_SUMMARY_TASK)
    vocabulary = task.output_features["targets"].vocabulary
    lengths = {"inputs": 1024, "targets": 64}
    examples = list(task.get_dataset(lengths, "validation", shuffle=False, use_cached=False).as_numpy_iterator())
    pairs = long_documents.module_summary_examples("validation")
    assert len(examples) == len(pairs)
    validation = dict(stdlib_sources.stdlib_sources("validation"))
    json_summary = ("JSON (JavaScript Object Notation) <https://json.org> is a subset of JavaScript syntax "
                    "(ECMA-262 3rd edition) used as a lightweight data interchange format.")
    assert stdlib_sources.module_summary_and_body(validation["json"])[0] == json_summary
    for example, (body, summary) in zip(examples, pairs, strict=True):
        assert summary not in body
        inputs = vocabulary.encode_tf(f"summarize: {body}").numpy().tolist()  # the task's tokenizer (see above)
        np.testing.assert_array_equal(example["inputs"], [*inputs[:lengths["inputs"] - 1], vocabulary.eos_id])
        targets = vocabulary.encode_tf(summary).numpy().tolist()
        np.testing.assert_array_equal(example["targets"], [*targets[:lengths["targets"] - 1], vocabulary.eos_id])
    assert max(len(vocabulary.encode(f"summarize: {body}")) for body, _ in pairs) > 8 * lengths["inputs"]
