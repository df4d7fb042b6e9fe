"""ptmjax's word2vec against gensim's `Word2Vec`, the reference a user would pick, in one process: both trained on
the embedded corpus's sentences with the same settings, timed, and scored on gensim's shipped sets.

    python benchmarks/word2vec_vs_gensim.py [--architecture skipgram|cbow] [--dim 100] [--window 5]
        [--negatives 5] [--min_count 5] [--sample 1e-3] [--epochs 5] [--batch 128] [--seeds 0,1,2] [--save]

Both get the same sentences (`training.word2vec.corpus_sentences()`), vocabulary rule, dimension, window,
negatives, subsampling rate, epochs and learning rates; gensim runs with workers=2. words/s is the corpus's words
times the epochs over the wall time of the whole call (vocabulary, training, and for ptmjax's first seed the
compilation, which later seeds find cached). Each run is
scored by `evaluation.word_vectors.standard_scores`: Google analogies (3CosAdd, accuracy over the questions whose
four words are in the vocabulary, and that share: the coverage), WordSim-353 and SimLex-999 (Spearman over the
pairs in the vocabulary, and their share). Every figure is given over the seeds as a range. The corpus is small
(docstrings: about 78,000 words), so the coverage is low and the scores say little about either method beyond
their agreement. Prints a table and a few nearest neighbours; asserts nothing about time. `--save` keeps the
results in benchmarks/results/word2vec_vs_gensim.json, keyed by architecture.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from ptmjax.evaluation import word_vectors  # noqa: E402
from ptmjax.tools import results_files  # noqa: E402
from ptmjax.training import word2vec  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "word2vec_vs_gensim.json"
FRAMEWORKS = ("ptmjax", "gensim")
INSPECTED = ("file", "string", "thread", "true")
SETS = ("WordSim-353", "SimLex-999")
SCORE_HEADER = ("analogy accuracy (questions, coverage)", *(f"{s} Spearman (pairs, coverage)" for s in SETS))


def train_gensim(config: word2vec.Word2VecConfig, sentences: list[list[str]]) -> tuple[list[str], np.ndarray]:
    """gensim `Word2Vec` under `config`'s settings, workers=2 -> (its words, most frequent first; their vectors)."""
    from gensim.models import Word2Vec

    model = Word2Vec(sentences, sg=int(config.architecture == "skipgram"), vector_size=config.dim,
                     window=config.window, negative=config.negatives, hs=0, min_count=config.min_count,
                     sample=config.sample, epochs=config.epochs, alpha=config.alpha, min_alpha=config.min_alpha,
                     seed=config.seed, workers=2)
    return list(model.wv.index_to_key), model.wv.vectors


def run(framework: str, config: word2vec.Word2VecConfig, sentences: list[list[str]]) -> dict:
    """One framework's timed training and scores, with the nearest neighbours of INSPECTED."""
    start = time.perf_counter()
    if framework == "ptmjax":
        result = word2vec.train_word2vec(config, sentences)
        words, vectors = list(result.vocabulary.words), result.vectors
    else:
        words, vectors = train_gensim(config, sentences)
    seconds = time.perf_counter() - start
    return {"words_per_s": sum(map(len, sentences)) * config.epochs / seconds, **measured(words, vectors, seconds)}


def measured(words: list[str], vectors: np.ndarray, seconds: float) -> dict:
    """A trained run's seconds, vocabulary size, standard scores and the nearest neighbours of INSPECTED."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    neighbours = {}
    for word in INSPECTED:
        if word in words:
            cosines = np.einsum("vd,d->v", unit, unit[words.index(word)])
            neighbours[word] = [words[i] for i in np.argsort(-cosines)[1:6]]
    return {"seconds": seconds, "vocabulary": len(words), "scores": word_vectors.standard_scores(words, vectors),
            "neighbours": neighbours}


def figure(runs: list[dict], path: tuple[str, ...], fmt: str, scale: float = 1) -> str:
    """The figure at `path` in each run, as a range over the runs."""
    def value(run: dict) -> float:
        for key in path:
            run = run[key]
        return run * scale

    return results_files.spread([value(run) for run in runs], fmt)


def score_cells(runs: list[dict]) -> list[str]:
    """The analogy and similarity cells of one framework's row (SCORE_HEADER), each a range over the seeds."""
    scores = runs[0]["scores"]  # the vocabulary, so the coverage, is the same for every seed
    return [f"{figure(runs, ('scores', 'analogies', 'accuracy'), '{:.1f}', 100)}% of "
            f"{scores['analogies']['answered']} ({scores['analogies']['coverage']:.2%})",
            *(f"{figure(runs, ('scores', name, 'spearman'), '{:.3f}')} ({scores[name]['pairs']} pairs, "
              f"{scores[name]['coverage']:.1%})" for name in SETS)]



def rows(entry: dict) -> list[list[str]]:
    """The table's rows, one per framework, each figure a range over the seeds."""
    return [[framework, figure(runs, ("words_per_s",), "{:,.0f}"), figure(runs, ("seconds",), "{:.1f}"),
             *score_cells(runs)] for framework, runs in ((f, entry["runs"][f]) for f in FRAMEWORKS)]


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def table(entry: dict) -> str:
    """A Markdown table of one architecture's results."""
    return markdown(["", "words/s", "seconds", *SCORE_HEADER], rows(entry))


def tables() -> dict[str, str]:
    """A table per architecture in benchmarks/results/word2vec_vs_gensim.json, named word2vec-ARCHITECTURE."""
    import json

    entries = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    return {f"word2vec-{architecture}": table(entry) for architecture, entry in entries.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = word2vec.Word2VecConfig()
    parser.add_argument("--architecture", choices=word2vec.ARCHITECTURES, default=defaults.architecture)
    for name in ("dim", "window", "negatives", "min_count", "epochs", "batch"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    parser.add_argument("--sample", type=float, default=defaults.sample)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds; each figure is given as a range")
    parser.add_argument("--save", action="store_true", help="keep the results in benchmarks/results/")
    args = parser.parse_args()
    config = word2vec.Word2VecConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(defaults)
                                        if f.name in vars(args)})
    sentences = word2vec.corpus_sentences()
    importlib.import_module("gensim.models")  # its import is not timed
    print(f"{len(sentences)} sentences, {sum(map(len, sentences)):,} words; {config}; {os.cpu_count()} CPU cores\n")
    runs = seeded_runs(FRAMEWORKS, config, args.seeds, lambda framework, seeded: run(framework, seeded, sentences))
    report(runs, config, table, (RESULTS, config.architecture) if args.save else None)


def seeded_runs(names: tuple[str, ...], config: Any, seeds: str, run_one: Callable[[str, Any], dict]) -> dict:
    """{name: [run_one(name, config at each seed of `seeds`, '0,1,2')]}, the names taking turns within a seed."""
    runs = {name: [] for name in names}
    for seed in (int(s) for s in seeds.split(",")):
        for name in names:
            runs[name].append(run_one(name, dataclasses.replace(config, seed=seed)))
            print(f"  {name}, seed {seed}: {runs[name][-1]['seconds']:.1f} s", flush=True)
    return runs


def report(runs: dict, config: Any, render: Callable[[dict], str], saved: tuple[pathlib.Path, str] | None) -> None:
    """Prints the table `render` gives and the first seed's nearest neighbours; keeps the entry under `saved`'s
    key in its results file when given."""
    entry = {"measured": results_files.run_record(), "config": dataclasses.asdict(config), "runs": runs}
    print("\n" + render(entry))
    width = max(map(len, runs))
    for name, name_runs in runs.items():
        for word, nearest in name_runs[0]["neighbours"].items():
            print(f"{name:<{width}} {word:<8} {', '.join(nearest)}")
    if saved:
        results_files.saved_entry(*saved, entry)


if __name__ == "__main__":
    main()
