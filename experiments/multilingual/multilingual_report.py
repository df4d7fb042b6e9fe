"""The multilingual experiment's summary over seeds, its Markdown and JSON results, and its plot."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from ptmjax.tools import results_files

SCRIPT = "experiments/multilingual/run.py"  # how the README's table markers name this script
COLUMNS = {  # summary key -> its column heading
    "pretrain_loss": "pre-training loss",
    "retrieval_en_to_x": "retrieval en->X (acc@1, %)",
    "retrieval_x_to_en": "retrieval X->en (acc@1, %)",
    "transfer": "zero-shot X accuracy (%)",
    "english": "English accuracy (%)",
    "bleu": "translation en->X BLEU",
    "chrf": "translation en->X chrF",
}
TRANSLATION_SCORES = {"bleu": "BLEU", "chrf": "chrF"}  # the metric's key -> its name


def slug(name: str) -> str:
    """A folder name for an arm's name."""
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_").replace("__", "_")


def headline(run: dict[str, Any]) -> dict[str, float]:
    """One run's figures of `COLUMNS`: means over the non-English languages, in percent (the loss as it is;
    BLEU and chrF on their 0-100 scales, means over the translated languages, only for runs that have them:
    those measured before measure (c) have none)."""
    retrieval = run["retrieval"].values()
    translated = run.get("translation", {}).values()
    others = [v["accuracy"] for language, v in run["classification"].items() if language != "en"]
    return {
        "pretrain_loss": run["pretrain_loss"],
        "retrieval_en_to_x": 100 * float(np.mean([v["en_to_x"] for v in retrieval])),
        "retrieval_x_to_en": 100 * float(np.mean([v["x_to_en"] for v in retrieval])),
        "transfer": 100 * float(np.mean(others)),
        "english": 100 * run["classification"]["en"]["accuracy"],
        **({key: float(np.mean([v[key] for v in translated])) for key in TRANSLATION_SCORES} if translated else {}),
    }


def interval(values: Sequence[float]) -> list[float]:
    """The 95% t-interval of the mean over seeds: mean -+ t(0.975, n-1) * sd / sqrt(n)."""
    values = np.asarray(values, float)
    if len(values) < 2:
        return [float(values.mean())] * 2
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return [float(values.mean() - half), float(values.mean() + half)]


def over_seeds(values: list[float]) -> dict[str, Any]:
    """{'mean', 'ci95': its 95% t-interval, 'seeds': the values}."""
    return {"mean": float(np.mean(values)), "ci95": interval(values), "seeds": values}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """{arm: {figure: {mean, ci95, seeds}}, per-language means too} over the runs of each arm, arms in run order."""
    summary = {}
    for arm in dict.fromkeys(run["arm"] for run in runs):
        own = [run for run in runs if run["arm"] == arm]
        figures = {key: [headline(run)[key] for run in own] for key in headline(own[0])}
        languages = {language: {
            "accuracy": float(np.mean([100 * r["classification"][language]["accuracy"] for r in own])),
            **({"en_to_x": float(np.mean([100 * r["retrieval"][language]["en_to_x"] for r in own])),
                "x_to_en": float(np.mean([100 * r["retrieval"][language]["x_to_en"] for r in own]))}
               if language in own[0]["retrieval"] else {}),
        } for language in own[0]["classification"]}
        translation = {locale: {key: over_seeds([r["translation"][locale][key] for r in own])
                                for key in TRANSLATION_SCORES} for locale in own[0].get("translation", {})}
        summary[arm] = {**{key: over_seeds(v) for key, v in figures.items()}, "languages": languages,
                        "translation": translation}
    return summary


def cell(figure: dict[str, Any], fmt: str) -> str:
    low, high = figure["ci95"]
    return f"{fmt.format(figure['mean'])} [{fmt.format(low)}, {fmt.format(high)}]"


def measured_columns(results: dict[str, Any]) -> dict[str, str]:
    """The `COLUMNS` that the results hold (no translation in results from before measure (c))."""
    return {key: name for key, name in COLUMNS.items() if key in next(iter(results["summary"].values()))}


def main_table(results: dict[str, Any]) -> str:
    """The README's table: every arm's figures, mean [95% interval over seeds]."""
    columns = measured_columns(results)
    lines = ["| pre-training | " + " | ".join(columns.values()) + " |", "|---" * (len(columns) + 1) + "|"]
    for arm, figures in results["summary"].items():
        cells = [cell(figures[key], "{:.2f}" if key == "pretrain_loss" else "{:.1f}") for key in columns]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def language_table(results: dict[str, Any]) -> str:
    """Per language, mean over seeds: retrieval en->X / X->en and the classifier's accuracy."""
    languages = list(next(iter(results["summary"].values()))["languages"])
    lines = ["| pre-training | " + " | ".join(languages) + " |", "|---" * (len(languages) + 1) + "|"]
    for arm, figures in results["summary"].items():
        cells = []
        for language in languages:
            v = figures["languages"][language]
            retrieval = f"{v['en_to_x']:.0f} / {v['x_to_en']:.0f} / " if "en_to_x" in v else ""
            cells.append(f"{retrieval}{v['accuracy']:.0f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def translation_table(results: dict[str, Any]) -> str:
    """Per translated language: BLEU and chrF, mean [95% interval over seeds]."""
    locales = list(next(iter(results["summary"].values()))["translation"])
    headings = [f"en->{locale} {name}" for locale in locales for name in TRANSLATION_SCORES.values()]
    lines = ["| pre-training | " + " | ".join(headings) + " |", "|---" * (len(headings) + 1) + "|"]
    for arm, figures in results["summary"].items():
        scores = figures["translation"]
        cells = [cell(scores[locale][key], "{:.1f}") for locale in locales for key in TRANSLATION_SCORES]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def tables(results: dict[str, Any] | None = None, out_dir: pathlib.Path | None = None) -> dict[str, str]:
    """The README's generated tables, from the committed results.json unless `results` is given."""
    if results is None:
        results = json.loads(((out_dir or pathlib.Path(__file__).parent) / "results.json").read_text())
    translated = "bleu" in measured_columns(results)
    return {"summary": main_table(results), **({"translation": translation_table(results)} if translated else {})}


def markdown(results: dict[str, Any]) -> str:
    s = results["setting"]
    return "\n".join([
        f"# Multilingual comparison ({s['name']} setting)", "",
        f"Measured {results['measured']['date']} on {results['measured']['machine']} (commit "
        f"{results['measured']['commit']}), `{results['measured']['command']}`; {results['wall_s'] / 60:.0f} minutes "
        f"in all, 1-minute load average {results['load_1min']:.1f} at the end.", "",
        f"Setting: {json.dumps(s)}", "",
        f"Mean over {len(s['seeds'])} seeds [95% t-interval over the seeds]; 'X': the mean over "
        f"{', '.join(results['locales'])}.",
        "", main_table(results), "",
        "Per language, mean over seeds: retrieval en->X / X->en (acc@1, %) / classifier accuracy (%); "
        f"held-out pairs per language: {results['retrieval_pairs']}; labelled test messages: "
        f"{results['classification_examples']}; majority-class accuracy: {results['majority']}.", "",
        language_table(results), "",
        f"Translation (greedy, {results['translation_pairs']} held-out pairs per language), mean [95% t-interval "
        "over the seeds]:", "", translation_table(results), "",
        "First translations of seed " + str(results["runs"][0]["seed"]) + " (reference -> prediction):", "",
        *[f"- {r['arm']}, en->{locale}: " + "; ".join(f"{reference!r} -> {prediction!r}"
                                                      for reference, prediction in v["examples"])
          for r in results["runs"][:len(results["summary"])] for locale, v in r["translation"].items()], "",
        "Seeds (pre-training loss; retrieval en->X; zero-shot accuracy; BLEU; chrF):", "",
        *[f"- {arm}: " + "; ".join(", ".join(f"{v:.3g}" for v in figures[key]["seeds"])
                                   for key in ("pretrain_loss", "retrieval_en_to_x", "transfer", "bleu", "chrf"))
          for arm, figures in results["summary"].items()], "",
        "Pre-training and evaluation time per run (s): " + ", ".join(
            f"{r['arm']} seed {r['seed']}: {r['pretrain_s']:.0f} + {r['eval_s']:.0f}" for r in results["runs"]), "",
    ])


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Bars with 95% intervals: retrieval both ways, zero-shot accuracy and translation scores, per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [key for key in measured_columns(results) if key != "pretrain_loss"]
    arms = list(results["summary"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        figures = results["summary"][arm]
        means = [figures[k]["mean"] for k in keys]
        errors = np.array([[m - figures[k]["ci95"][0], figures[k]["ci95"][1] - m]
                           for k, m in zip(keys, means, strict=True)]).T
        ax.bar(np.arange(len(keys)) + i * width, means, width, yerr=errors, capsize=3, label=arm)
    labels = [COLUMNS[k].replace(" (", "\n(").replace("translation ", "translation\n") for k in keys]
    ax.set_xticks(np.arange(len(keys)) + width * (len(arms) - 1) / 2, labels, fontsize=7)
    ax.axhline(100 * results["majority_mean"], color="grey", linestyle=":", label="majority class (classifier)")
    ax.set_ylabel("% (BLEU, chrF: 0-100)")
    ax.set_title(f"Monolingual vs multilingual pre-training, {results['setting']['name']} setting "
                 f"(mean of {len(results['setting']['seeds'])} seeds, 95% interval)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(setting: Any, locales: Sequence[str], runs: list[dict[str, Any]], out_dir: pathlib.Path,
          wall_s: float, majority: dict[str, float]) -> dict[str, Any]:
    """results[_<setting>].json, .md and the plot; the reduced setting also rewrites the README's table."""
    suffix = "" if setting.name == "reduced" else f"_{setting.name}"
    first = runs[0]
    results = {
        "measured": results_files.run_record(), "setting": dataclasses.asdict(setting), "locales": list(locales),
        "wall_s": wall_s, "load_1min": os.getloadavg()[0], "summary": summarise(runs),
        "retrieval_pairs": {k: v["pairs"] for k, v in first["retrieval"].items()},
        "classification_examples": {k: v["examples"] for k, v in first["classification"].items()},
        "translation_pairs": {k: v["pairs"] for k, v in first["translation"].items()},
        "majority": majority, "majority_mean": float(np.mean([v for k, v in majority.items() if k != "en"])),
        "runs": runs,
    }
    results_files.publish(out_dir, suffix, results, markdown(results), plot, "multilingual",
                          (SCRIPT, lambda: tables(results)) if setting.name == "reduced" else None)
    return results
