"""The compression experiment: one pre-trained BERT, fine-tuned on one embedded classification task, compressed by
each of ptmjax's methods; every row's parameters, bytes on disk, accuracy and inference throughput.

Run: python experiments/compression/run.py [--full | --smoke]

The backbone is the BERT demo model made deeper (`runs/bert_demo.gin` with `Setting.num_layers` layers), pre-trained
once; `runs/bert_classify_demo.gin` fine-tunes it at each seed (the float baseline). Each compression method then
starts from the baseline of the same seed (compression_methods.py): distilled students, post-training quantization
(`ptmjax quantize`), quantization-aware training (`@fake_quantized()`, then `ptmjax quantize` of the run),
magnitude pruning (`MagnitudePruning`), head pruning (`ptmjax prune-heads`), LayerDrop's layer pruning
(`ptmjax prune-layers`, i.e. `compress.layerdrop.prune_layers`) and early exit (DeeBERT's exits, run layer by
layer). Training goes through ptmjax's trainer (`parse_gin` + `training.run.train`) and the commands through
`ptmjax.cli.main`, all in this process. Every row is scored on the task's whole validation split by the head's
jitted forward pass, checked example by example against the evaluator `ptmjax eval` uses
(compression_scoring.py); its throughput is timed at the end, all rows in the same process, interleaved over 3
rounds (median). Runs go under
runs/compression/<setting>/ (git-ignored); a run or folder with its result.json is reused, so an interrupted
experiment continues (delete the folder to start over). Outputs next to this script: results[_<setting>].json,
results[_<setting>].md and compression[_<setting>].png (no suffix for the reduced setting, whose table the
README states).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(EXPERIMENT_DIR))  # the compression_*.py modules beside this script

import compression_report as report  # noqa: E402
from compression_methods import FLOAT, TASK, Setting, rows  # noqa: E402
from compression_scoring import measure, scorer, throughputs  # noqa: E402

from ptmjax.tools import results_files  # noqa: E402

SCRIPT = "experiments/compression/run.py"  # how the README's table marker names this script
REPO_DIR = EXPERIMENT_DIR.parents[1]
METRIC = "accuracy"

SETTINGS = {
    "reduced": Setting("reduced", num_layers=4, pretrain_steps=600, finetune_steps=300, compress_steps=100,
                       seeds=(0, 1, 2), inputs_length=64),
    "full": Setting("full", num_layers=8, pretrain_steps=3000, finetune_steps=1000, compress_steps=300,
                    seeds=(0, 1, 2, 3, 4), inputs_length=128),
    "smoke": Setting("smoke", num_layers=4, pretrain_steps=4, finetune_steps=10, compress_steps=10, seeds=(0,),
                     inputs_length=32),  # the harness end to end, in minutes
}


def training_wall(runs_dir: pathlib.Path) -> float:
    """Seconds the setting's training runs took, from the records they wrote when they finished (reused runs
    included)."""
    records = (json.loads(path.read_text()) for path in runs_dir.glob("**/result.json"))
    return sum(record["wall_s"] for record in records if "wall_s" in record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--full", action="store_true", help="the full setting: 8 layers, longer training, 5 seeds")
    which.add_argument("--smoke", action="store_true", help="a few steps and one seed: the harness end to end")
    args = parser.parse_args()
    setting = SETTINGS["full" if args.full else "smoke" if args.smoke else "reduced"]
    from ptmjax.training import compilation_cache

    compilation_cache.use_compilation_cache()
    results = compare(setting, REPO_DIR / "runs" / "compression" / setting.name)
    suffix = "" if setting.name == "reduced" else f"_{setting.name}"
    text = report.markdown(results)
    results_files.publish(EXPERIMENT_DIR, suffix, results, text, report.plot, "compression",
                          (SCRIPT, tables) if setting.name == "reduced" else None)  # the setting the README states
    print(text)


def compare(setting: Setting, runs_dir: pathlib.Path) -> dict:
    """Every row of `setting` made (or reused) under `runs_dir` at each seed, measured and timed: the results
    file's record."""
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    folders = {row.name: [row.make(setting, runs_dir, seed) for seed in setting.seeds] for row in rows(setting)}
    measured = {row.name: [measure(folder, row.exit_threshold) for folder in folders[row.name]]
                for row in rows(setting)}
    speed = throughputs({row.name: scorer(folders[row.name][0], row.exit_threshold) for row in rows(setting)})
    results = {
        "measured": results_files.run_record(),
        "setting": dataclasses.asdict(setting), "task": TASK, "metric": METRIC,
        "wall_s": time.perf_counter() - start, "training_wall_s": training_wall(runs_dir),
        "load_1min": [load_before, os.getloadavg()[0]],
        "rows": [{"name": row.name, "group": row.group, "layers": row.layers(setting), "how": row.how,
                  "exit_threshold": row.exit_threshold, "seeds": measured[row.name], "throughput": speed[row.name]}
                 for row in rows(setting)],
    }
    results["summary"] = report.summary(results, FLOAT)
    return results


def tables() -> dict[str, str]:
    """The README's table (its `reduced` marker), from results.json."""
    return {"reduced": report.table(json.loads((EXPERIMENT_DIR / "results.json").read_text()))}


if __name__ == "__main__":
    main()
