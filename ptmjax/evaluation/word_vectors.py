"""Word vectors scored on the standard sets that the gensim wheel ships in its test data: the Google analogy
questions (questions-words.txt, 19,544), WordSim-353 (wordsim353.tsv) and SimLex-999 (simlex999.txt).

Both scores read the files as gensim's `KeyedVectors.evaluate_word_analogies` and `evaluate_word_pairs` do,
case-insensitively (the vocabulary is lower-case), and give the same numbers on the same vectors:

* Analogies: a question counts when its four words are among the first `restrict_vocab` words (the most
  frequent); its answer is 3CosAdd over those words, the question's three left out
  (`models.word2vec.analogy_predictions`). Accuracy is over the counted questions; coverage is their share.
* Similarity: the Spearman correlation between the human scores and the cosines of the pairs whose two words
  are in the vocabulary; coverage is their share of the pairs.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
import scipy.stats

from ptmjax.models.word2vec import analogy_predictions, unit_rows

ANALOGIES = "questions-words.txt"
SIMILARITY_SETS = {"WordSim-353": "wordsim353.tsv", "SimLex-999": "simlex999.txt"}


def gensim_test_file(name: str) -> pathlib.Path:
    """The path of `name` in the installed gensim wheel's test data."""
    try:
        distribution = importlib.metadata.distribution("gensim")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{name} comes with gensim's test data; pip install -e '.[test]' (or gensim)") from None
    found = [f for f in distribution.files or () if f.name == name and "test_data" in f.parts]
    if not found:
        raise FileNotFoundError(f"gensim {distribution.version} has no test_data/{name}; install gensim>=4.3")
    return pathlib.Path(distribution.locate_file(found[0]))


def analogy_questions(path: pathlib.Path) -> list[tuple[str, str, str, str]]:
    """The questions (a, b, c, expected) of an analogy file, lower-cased, its ': section' lines skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [tuple(line.lower().split()) for line in lines if not line.startswith(": ") and len(line.split()) == 4]


def analogy_accuracy(words: Sequence[str], vectors: np.ndarray, path: pathlib.Path | None = None,
                     restrict_vocab: int = 300_000) -> dict[str, float]:
    """{'accuracy', 'correct', 'answered', 'questions', 'coverage'} of 3CosAdd on the analogy questions (default:
    gensim's questions-words.txt); `words` are the rows of `vectors`, most frequent first."""
    questions = analogy_questions(path or gensim_test_file(ANALOGIES))
    restrict = min(restrict_vocab, len(words))
    index = {word: i for i, word in enumerate(words[:restrict])}
    answered = np.array([[index[w] for w in q] for q in questions if all(w in index for w in q)], np.int32)
    correct = 0
    if len(answered):
        a, b, c, expected = (jnp.asarray(column) for column in answered.T)
        correct = int((analogy_predictions(jnp.asarray(vectors), a, b, c, restrict) == expected).sum())
    return {"accuracy": correct / len(answered) if len(answered) else float("nan"), "correct": correct,
            "answered": len(answered), "questions": len(questions), "coverage": len(answered) / len(questions)}


def word_pairs(path: pathlib.Path) -> list[tuple[str, str, float]]:
    """The (word, word, human score) rows of a tab-separated similarity file, lower-cased, '#' lines skipped."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line and line[0] != "#"]
    return [(a.lower(), b.lower(), float(score)) for a, b, score in rows]


def similarity_correlation(words: Sequence[str], vectors: np.ndarray, path: pathlib.Path) -> dict[str, float]:
    """{'spearman', 'pairs', 'coverage'}: the Spearman correlation of the human scores with the cosines, over the
    pairs of `path` whose words are both in `words`."""
    pairs = word_pairs(path)
    index = {word: i for i, word in enumerate(words)}
    found = [(index[a], index[b], score) for a, b, score in pairs if a in index and b in index]
    unit = np.asarray(unit_rows(jnp.asarray(vectors)))
    cosines = [float((unit[a] * unit[b]).sum()) for a, b, _ in found]
    spearman = scipy.stats.spearmanr([s for *_, s in found], cosines).statistic if len(found) > 1 else float("nan")
    return {"spearman": float(spearman), "pairs": len(found), "coverage": len(found) / len(pairs)}


def standard_scores(words: Sequence[str], vectors: np.ndarray, restrict_vocab: int = 300_000) -> dict[str, dict]:
    """{'analogies': analogy_accuracy, 'WordSim-353': ..., 'SimLex-999': similarity_correlation} on gensim's
    files."""
    scores = {"analogies": analogy_accuracy(words, vectors, restrict_vocab=restrict_vocab)}
    for name, filename in SIMILARITY_SETS.items():
        scores[name] = similarity_correlation(words, vectors, gensim_test_file(filename))
    return scores
