"""ptmjax's GloVe against ptmjax's own word2vec (skip-gram) on the same sentences of the embedded corpus, timed and
scored on gensim's shipped sets; gensim has no GloVe, so word2vec is the row to compare with.

    python benchmarks/glove_vs_word2vec.py [--dim 100] [--window 10] [--min_count 5] [--epochs 25] [--batch 512]
        [--seeds 0,1,2] [--save]

GloVe runs under `GloVeConfig` (x_max 100, alpha 3/4, AdaGrad at 0.05) with the flags given; word2vec under
`Word2VecConfig`'s defaults (window 5, 5 negatives, 5 epochs) at the same dim and min_count, so both have the same
vocabulary. Seconds are the wall time of the whole call (vocabulary, co-occurrence counts for GloVe, training, and
the first seed's compilation). GloVe's throughput is its nonzero co-occurrence entries times the epochs over
those seconds, word2vec's the corpus's words times its epochs (benchmarks/word2vec_vs_gensim.py). Scores as there
(`evaluation.word_vectors.standard_scores`), each figure a range over the seeds. Prints a table and a few nearest
neighbours; asserts nothing about time. `--save` keeps the results in benchmarks/results/glove_vs_word2vec.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from word2vec_vs_gensim import SCORE_HEADER, figure, markdown, measured, report, score_cells, seeded_runs  # noqa: E402

from ptmjax.data import cooccurrence, word2vec_examples  # noqa: E402
from ptmjax.training import glove, word2vec  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "glove_vs_word2vec.json"
METHODS = ("GloVe", "word2vec skip-gram")


def run(method: str, glove_config: glove.GloVeConfig, sentences: list[list[str]], entries: int) -> dict:
    """One method's timed training, throughput and scores; `entries` is the count of nonzero co-occurrences."""
    start = time.perf_counter()
    if method == "GloVe":
        result, work = glove.train_glove(glove_config, sentences), entries * glove_config.epochs
    else:
        config = word2vec.Word2VecConfig(dim=glove_config.dim, min_count=glove_config.min_count, seed=glove_config.seed)
        result, work = word2vec.train_word2vec(config, sentences), sum(map(len, sentences)) * config.epochs
    seconds = time.perf_counter() - start
    return {"per_s": work / seconds, "losses": list(result.losses),
            **measured(list(result.vocabulary.words), result.vectors, seconds)}


def table(entry: dict) -> str:
    """A Markdown table of GloVe's and word2vec's results."""
    units = {"GloVe": "entries/s", "word2vec skip-gram": "words/s"}
    return markdown(["", "throughput", "seconds", *SCORE_HEADER],
                    [[method, f"{figure(runs, ('per_s',), '{:,.0f}')} {units[method]}",
                      figure(runs, ("seconds",), "{:.1f}"), *score_cells(runs)]
                     for method, runs in entry["runs"].items()])


def tables() -> dict[str, str]:
    """The table of benchmarks/results/glove_vs_word2vec.json, named glove."""
    entries = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    return {name: table(entry) for name, entry in entries.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = glove.GloVeConfig()
    for name in ("dim", "window", "min_count", "epochs", "batch"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds; each figure is given as a range")
    parser.add_argument("--save", action="store_true", help="keep the results in benchmarks/results/")
    args = parser.parse_args()
    config = dataclasses.replace(defaults, **{name: getattr(args, name)
                                              for name in ("dim", "window", "min_count", "epochs", "batch")})
    sentences = word2vec.corpus_sentences()
    vocabulary = word2vec_examples.build_vocabulary(sentences, config.min_count)
    entries = len(cooccurrence.cooccurrences([vocabulary.ids(s) for s in sentences], len(vocabulary.words),
                                             config.window)[2])
    print(f"{len(sentences)} sentences, {sum(map(len, sentences)):,} words, {entries:,} nonzero co-occurrences; "
          f"{config}; {os.cpu_count()} CPU cores\n")
    runs = seeded_runs(METHODS, config, args.seeds, lambda method, seeded: run(method, seeded, sentences, entries))
    report(runs, config, table, (RESULTS, "glove") if args.save else None)


if __name__ == "__main__":
    main()
