"""Long context at equal training compute: full attention at 512 against sparse attention at 2,048 (sliding windows of
128 and 256, a window with global tokens) and Transformer-XL with a memory of 512, as causal LMs over whole
standard-library source files, scored by position; and T5 at 512 against LongT5 at 2,048 on a long-input task (a
module's docstring summary from its whole source).

Run: python experiments/long_context/run.py [--setting reduced|full|smoke] [--report_only]

Every run goes through ptmjax's own trainer (`parse_gin` + `run.train`): the model's gin file, then `lm.gin` or
`summary.gin` next to this script, then the arm's and the setting's bindings. Each arm trains for the steps that
give it the reference arm's training FLOPs (`training_flops`). The seeds are outermost (seed 0 of every arm, then
seed 1, ...), so a partial run has whole seeds. Runs go under runs/long_context/<setting>/<arm>/seed<n>/
(git-ignored); a run whose result.json exists is reused (delete the folder to start over), and `--report_only`
writes the results of the runs that exist, naming those that do not. Outputs next to this script:
results_<setting>.json, results_<setting>.md and long_context_<setting>.png; the reduced setting also rewrites
the README's tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import time
from collections.abc import Sequence
from typing import Any

import gin
import jax
import numpy as np
import seqio
from flax.core import meta
from scipy import stats

from ptmjax.gin_files import parse_gin
from ptmjax.models import flops as model_flops
from ptmjax.models.gpt2 import GPT2Config
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import long_documents
from ptmjax.tools import aot_compile, results_files
from ptmjax.training import run as training_run
from ptmjax.training.callbacks.callback import Callback, StepEvent

EXPERIMENT_DIR = pathlib.Path(__file__).resolve().parent
SCRIPT = "experiments/long_context/run.py"
RUNS_DIR = EXPERIMENT_DIR.parents[1] / "runs" / "long_context"
LM, SUMMARY = "lm", "summary"
ROW = 2048  # the LM validation rows scored by position, and the long arms' row
BUCKET = 512
BATCH_TOKENS = 8192  # LM tokens per step in every LM arm
SUMMARY_TARGETS = 64
TXL_AVAILABLE = importlib.util.find_spec("ptmjax.training.recurrent_memory") is not None


@dataclasses.dataclass(frozen=True)
class Arm:
    label: str
    kind: str  # LM or SUMMARY
    model_gin: str
    bindings: tuple[str, ...]
    length: int  # LM: the row (a Transformer-XL segment); summary: the inputs
    memory: int = 0  # Transformer-XL's memory length

    @property
    def batch_size(self) -> int:
        return BATCH_TOKENS // self.length if self.kind == LM else 8


def _gpt2(max_length: int, *pattern: str) -> tuple[str, ...]:
    return ("train.model = @GPT2()", "GPT2.config = @GPT2Config()", "GPT2Config.attention_kernel = 'blockwise'",
            f"GPT2Config.max_length = {max_length}", *pattern)


def _window(size: int) -> tuple[str, ...]:
    return "GPT2Config.attention_pattern = @SlidingWindow()", f"SlidingWindow.size = {size}"


GLOBAL_EVERY = 128
TXL_BINDINGS = (
    "train.model = @TransformerXL()", "TransformerXL.config = @TransformerXLConfig()",
    "TransformerXLConfig.memory_length = 512", "train.pack = False", "train.objective = @RecurrentMemory()",
    f"RecurrentMemory.rows = {BATCH_TOKENS // 512}",
    f"SegmentStreamFeatureConverter.rows = {BATCH_TOKENS // 512}", "SegmentStreamFeatureConverter.segment_length = 512",
)
ARMS = {
    "full_512": Arm("full attention, 512", LM, "models/gpt2_tiny.gin", _gpt2(512), 512),
    "window_128": Arm("sliding window 128, 2048", LM, "models/gpt2_tiny.gin", _gpt2(ROW, *_window(128)), ROW),
    "window_256": Arm("sliding window 256, 2048", LM, "models/gpt2_tiny.gin", _gpt2(ROW, *_window(256)), ROW),
    "global_local": Arm(
        f"window 128 + global every {GLOBAL_EVERY}, 2048", LM, "models/gpt2_tiny.gin",
        _gpt2(ROW, "GPT2Config.attention_pattern = @AnyOf()", "AnyOf.patterns = [@SlidingWindow(), @GlobalTokens()]",
              "SlidingWindow.size = 128", f"GlobalTokens.positions = {list(range(0, ROW, GLOBAL_EVERY))}"), ROW),
    "txl_512": Arm("Transformer-XL, segments 512, memory 512", LM, "models/txl_tiny.gin", TXL_BINDINGS, 512,
                   memory=512),
    "t5_512": Arm("T5, full attention, inputs 512", SUMMARY, "models/t5_1_1_tiny.gin", (), 512),
    "longt5_tglobal_2048": Arm("LongT5 transient-global, inputs 2048", SUMMARY, "models/longt5_tiny.gin",
                               ("train.model = @LongT5()", "LongT5.config = @LongT5Config()"), ROW),
    "longt5_local_2048": Arm("LongT5 local, inputs 2048", SUMMARY, "models/longt5_tiny.gin",
                             ("train.model = @LongT5()", "LongT5.config = @LongT5Config()",
                              "LongT5Config.encoder_attention_type = 'local'"), ROW),
}
REFERENCE = {LM: "full_512", SUMMARY: "t5_512"}


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    lm_steps: int  # the reference LM arm's steps (full attention at 512); the others' follow from FLOPs
    summary_steps: int  # T5's at 512
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    eval_rows: int | None = None  # validation rows of ROW tokens scored by position (None: every full row)


_TXL = ("txl_512",) if TXL_AVAILABLE else ()
_LM_ARMS = ("full_512", "window_128", "window_256", "global_local", *_TXL)
SETTINGS = {
    # In the order that gives a shared machine's partial run the most: the references, one window, the summary
    # pair, then the other LM arms.
    "reduced": Setting("reduced", lm_steps=100, summary_steps=150, seeds=(0, 1, 2), eval_rows=32,
                       arms=("full_512", "window_128", "t5_512", "longt5_tglobal_2048", *_TXL, "global_local",
                             "window_256")),
    "full": Setting("full", lm_steps=1500, summary_steps=1000, seeds=(0, 1, 2, 3, 4),
                    arms=(*_LM_ARMS, "t5_512", "longt5_tglobal_2048", "longt5_local_2048")),
    "smoke": Setting("smoke", lm_steps=3, summary_steps=3, seeds=(0,),
                     arms=(*_LM_ARMS, "t5_512", "longt5_tglobal_2048"), eval_rows=2),
}


def parse(arm: Arm, extra: Sequence[str] = ()) -> None:
    """Clears gin and parses the arm's model file, its kind's run file and bindings, then `extra`."""
    gin.clear_config()
    files = [arm.model_gin, str(EXPERIMENT_DIR / f"{arm.kind}.gin")]
    parse_gin(files, [*arm.bindings, f"train.batch_size = {arm.batch_size}",
                      f"train.task_feature_lengths = {feature_lengths(arm)!r}", *extra])


def feature_lengths(arm: Arm) -> dict[str, int]:
    if arm.kind == SUMMARY:
        return {"inputs": arm.length, "targets": SUMMARY_TARGETS}
    # Transformer-XL's converter cuts whole documents into segments: the length bounds a document (no file is longer).
    return {"targets": 65536 if arm.memory else arm.length}


def allowed_pairs(arm: Arm) -> int:
    """The (query, key) pairs of one row that causality, the pattern and (Transformer-XL) a full memory allow."""
    if arm.memory:
        return sum(arm.memory + i + 1 for i in range(arm.length))
    parse(arm)
    pattern = GPT2Config().attention_pattern
    gin.clear_config()
    positions = np.arange(arm.length)
    allowed = positions[None, :] <= positions[:, None]
    if pattern is not None:
        allowed &= np.asarray(pattern.allowed(positions, positions))
    return int(allowed.sum())


def training_flops(arm: Arm) -> float:
    """Training FLOPs of one step (3x the forward, as ptmjax/models/flops.py counts them), with attention counted
    over the pairs the arm allows (`allowed_pairs`), not the whole square: a summary arm's from flops.py (LongT5's
    local and global blocks as it computes them); an LM arm's from GPT-2 tiny's layers, where a Transformer-XL
    layer also projects its memory's keys, values and relative positions and scores content and position."""
    if arm.kind == SUMMARY:
        parse(arm)
        config = training_run.run_spec_from_gin().model.config
        gin.clear_config()
        return model_flops.t5_training_flops(config, arm.batch_size, arm.length, SUMMARY_TARGETS)
    gin.clear_config()
    gin.parse_config_file(str(EXPERIMENT_DIR.parents[1] / "gin_configs" / "models" / "gpt2_tiny.gin"))
    config = GPT2Config(max_length=arm.length)  # Transformer-XL's layers have GPT-2 tiny's sizes
    gin.clear_config()
    inner, length, keys = config.num_heads * config.head_dim, arm.length, arm.memory + arm.length
    scores = 6 if arm.memory else 4  # Transformer-XL: content and position scores, then values
    attention = (model_flops.attention_flops(config, length, keys) - 4 * length * keys * inner
                 + scores * allowed_pairs(arm) * inner + (2 * config.d_model * inner * keys if arm.memory else 0))
    per_row = sum(attention + model_flops.feed_forward_flops(config, i) * length for i in range(config.num_layers))
    per_row += 2 * config.d_model * config.vocab_size * length
    return 3.0 * per_row * arm.batch_size


def steps_of(setting: Setting, arm: Arm) -> int:
    """The steps that give `arm` the training FLOPs of its kind's reference arm at the setting's steps."""
    reference = ARMS[REFERENCE[arm.kind]]
    base = setting.lm_steps if arm.kind == LM else setting.summary_steps
    return max(1, round(base * training_flops(reference) / training_flops(arm)))


class FinalParams(Callback):
    """Keeps the parameters of the run's last step."""

    params: Any = None

    def on_step(self, event: StepEvent) -> None:
        if event.final:
            self.params = event.state.params


def validation_rows(limit: int | None) -> np.ndarray:
    """int32 [rows, ROW]: the full ROW-token pieces of the LM task's validation split, in order (the first `limit`)."""
    task = seqio.get_mixture_or_task(long_documents.LONG_LM_TASK)
    dataset = task.get_dataset({"targets": ROW}, "validation", shuffle=False, use_cached=False)
    rows = [x["targets"] for x in dataset.as_numpy_iterator() if len(x["targets"]) == ROW]
    return np.stack(rows[:limit])


def position_nll(arm: Arm, model: Any, params: Any, rows: np.ndarray, batch: int = 4) -> np.ndarray:
    """float64 [rows, ROW]: each position's negative log-likelihood in each row, every row read from its start
    (no earlier context): a GPT-2 reads it in rows of its length, each from BOS (id 0); Transformer-XL in
    segments of its length after an empty memory, each segment's memory the one the segment before left."""
    def nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
        log_probs = jax.nn.log_softmax(logits)
        return -np.take_along_axis(np.asarray(log_probs), np.asarray(targets)[..., None], -1)[..., 0]

    inputs = np.concatenate([np.zeros_like(rows[:, :1]), rows[:, :-1]], axis=1)
    total = np.zeros(rows.shape)
    if arm.memory:
        from ptmjax.models.transformer_xl import empty_memory

        step = jax.jit(lambda p, x, m: model.apply({"params": p}, x, m, method=type(model).with_memory))
        for start in range(0, len(rows), batch):
            memory = empty_memory(model.config, len(rows[start:start + batch]))
            for s in range(0, ROW, arm.length):
                logits, memory = step(params, inputs[start:start + batch, s:s + arm.length], memory)
                total[start:start + batch, s:s + arm.length] = nll(logits, rows[start:start + batch, s:s + arm.length])
        return total
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x))
    segments, targets = rows.reshape(-1, arm.length), rows.reshape(-1, arm.length)
    inputs = np.concatenate([np.zeros_like(segments[:, :1]), segments[:, :-1]], axis=1)
    per_segment = np.concatenate([nll(forward(params, inputs[i:i + batch * ROW // arm.length]),
                                      targets[i:i + batch * ROW // arm.length])
                                  for i in range(0, len(segments), batch * ROW // arm.length)])
    return per_segment.reshape(len(rows), ROW)


def peak_rss_reset() -> bool:
    """Resets this process's peak resident set size (Linux: /proc/self/clear_refs); whether it could."""
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size since the last reset (VmHWM), or None off Linux."""
    status = pathlib.Path("/proc/self/status")
    if not status.exists():
        return None
    line = next((line for line in status.read_text().splitlines() if line.startswith("VmHWM:")), None)
    return None if line is None else int(line.split()[1]) * 1024


def compiled_memory(arm: Arm, bindings: Sequence[str]) -> dict[str, Any]:
    """XLA's memory analysis and FLOPs of the arm's compiled train step on this CPU (ptmjax/tools/aot_compile.py)."""
    parse(arm, bindings)
    report = aot_compile.compile_train_step(training_run.run_spec_from_gin(),
                                            aot_compile.get_topology(aot_compile.CPU_TOPOLOGY)).report
    gin.clear_config()
    return {"total_bytes": report.memory.total, "temporaries_bytes": report.memory.temporaries,
            "arguments_bytes": report.memory.arguments, "xla_flops": report.xla_flops}


def records(model_dir: pathlib.Path) -> list[dict[str, Any]]:
    with open(model_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def train_one(setting: Setting, slug: str, seed: int) -> dict[str, Any]:
    """One run (or its result.json): its speed, memory, losses and (LM) each position's summed NLL."""
    arm, model_dir = ARMS[slug], RUNS_DIR / setting.name / slug / f"seed{seed}"
    path = model_dir / "result.json"
    if path.exists():
        return json.loads(path.read_text())
    steps = steps_of(setting, arm)
    resumed = model_dir.exists() and ModelDir(str(model_dir)).saved_steps()[-1:] == [steps]
    if not resumed:  # a run cut short starts again; one whose last step is saved is only scored
        shutil.rmtree(model_dir, ignore_errors=True)
    warmup = "warmup_cosine.warmup_steps" if arm.kind == LM else "rsqrt_with_warmup.warmup_steps"
    bindings = [f"train.seed = {seed}", f"train.num_steps = {steps}", f"train.eval_every = {steps}",
                f"train.checkpoint_every = {steps}", f"train.log_every = {max(1, min(10, steps // 10))}",
                f"{warmup} = {max(1, steps // 10)}",
                *([f"warmup_cosine.total_steps = {steps}"] if arm.kind == LM else [])]
    print(f"\n=== {arm.label} seed {seed}: {steps} steps -> {model_dir}", flush=True)
    memory = compiled_memory(arm, bindings) if seed == setting.seeds[0] else None
    parse(arm, bindings)
    model = training_run.run_spec_from_gin().model
    final = FinalParams()
    resettable, load_before, start = peak_rss_reset(), os.getloadavg()[0], time.perf_counter()
    try:
        eval_metrics, note = training_run.train(str(model_dir), callbacks=[final]).eval_metrics, None
    except ValueError as error:  # Transformer-XL: a validation lane shorter than a segment leaves its eval empty
        if ModelDir(str(model_dir)).saved_steps()[-1:] != [steps]:
            raise
        eval_metrics, note = {}, f"the trainer's final evaluation failed ({error!r}); scored from checkpoint {steps}"
    wall, rss = time.perf_counter() - start, peak_rss_bytes() if resettable else None
    gin.clear_config()
    if final.params is None:  # the run ended in its final evaluation, after saving its last step
        tokens = np.zeros((1, arm.length), np.int32)
        abstract = meta.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens)))["params"]
        final.params = ModelDir(str(model_dir)).read_params(abstract)
    logs = records(model_dir)
    result = {
        "arm": slug, "seed": seed, "steps": steps, "wall_s": wall, "load_1min": [load_before, os.getloadavg()[0]],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in logs if "tokens_per_s" in r),
        "step_time_s": statistics.median(r["step_time_s"] for r in logs if "step_time_s" in r),
        "train_loss": [(r["step"], r["loss"]) for r in logs if "loss" in r],
        "peak_rss_bytes": rss, "compiled": memory, "eval_metrics": eval_metrics,
        "note": " ".join(filter(None, [note, "scored from its saved last step: wall_s and peak RSS cover the scoring"
                                             " only" if resumed else None])) or None,
    }
    if arm.kind == LM:
        rows = validation_rows(setting.eval_rows)
        nll = position_nll(arm, model, final.params, rows)
        result["position_nll_sum"] = nll.sum(0).tolist()
        result["row_bucket_nll_sum"] = [[float(row[max(b, 1):b + BUCKET].sum()) for b in range(0, ROW, BUCKET)]
                                        for row in nll]  # position 0 left out, as in `bucket_perplexities`
        result["eval_rows"] = len(rows)
    path.write_text(json.dumps(result, indent=1))
    return result


def interval(values: Sequence[float]) -> list[float]:
    """The 95% Student-t interval of the mean of `values` (over seeds); the value itself for one seed."""
    values = np.asarray(values, np.float64)
    if values.size < 2:
        return [float(values.mean())] * 2
    half = stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    return [float(values.mean() - half), float(values.mean() + half)]


def bucket_perplexities(run: dict[str, Any]) -> list[float]:
    """Perplexity in each BUCKET of positions, then over all, position 0 (predicted from nothing) left out."""
    nll, rows = np.asarray(run["position_nll_sum"]), run["eval_rows"]
    nll[0] = np.nan
    buckets = [nll[b:b + BUCKET] for b in range(0, ROW, BUCKET)] + [nll]
    return [float(np.exp(np.nanmean(b) / rows)) for b in buckets]


def row_differences(runs: list[dict[str, Any]], reference: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per bucket, then over all: the NLL per token minus the reference arm's on the same validation row (the mean
    over the paired seeds), with a 95% t-interval over the rows: the evaluation data's uncertainty, which one seed
    also has (the seeds' is in `perplexity_vs_reference`)."""
    tokens = np.array([BUCKET - 1] + [BUCKET] * (ROW // BUCKET - 1), np.float64)

    def per_token(run: dict[str, Any]) -> np.ndarray:
        sums = np.asarray(run["row_bucket_nll_sum"], np.float64)
        return np.concatenate([sums / tokens, sums.sum(1, keepdims=True) / tokens.sum()], axis=1)

    if not runs or any("row_bucket_nll_sum" not in r for r in [*runs, *reference]):
        return []
    diff = np.mean([per_token(r) - per_token(p) for r, p in zip(runs, reference, strict=True)], axis=0)
    return [{"mean": float(column.mean()), "ci95": interval(column), "rows": int(column.size)} for column in diff.T]


def summarise(runs: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's row over its seeds: mean and 95% interval of each figure, and (paired by seed) against the
    reference arm of its kind."""
    seeds = sorted({r["seed"] for r in runs} & {r["seed"] for r in reference})
    mine, paired = ([next(r for r in group if r["seed"] == seed) for seed in seeds] for group in (runs, reference))

    def figure(values: Sequence[float]) -> dict[str, Any]:
        return {"mean": statistics.fmean(values), "ci95": interval(values), "by_seed": list(values)}

    row = {"seeds": [r["seed"] for r in runs], "steps": runs[0]["steps"],
           "tokens_per_s": figure([r["tokens_per_s"] for r in runs]),
           "tokens_per_s_vs_reference": figure([r["tokens_per_s"] / p["tokens_per_s"]
                                                for r, p in zip(mine, paired, strict=True)]),
           "peak_rss_bytes": max((r["peak_rss_bytes"] or 0) for r in runs) or None,
           "compiled": next((r["compiled"] for r in runs if r["compiled"]), None),
           "load_1min": [x for r in runs for x in r["load_1min"]], "wall_s": [r["wall_s"] for r in runs]}
    if "position_nll_sum" in runs[0]:
        ppl = np.array([bucket_perplexities(r) for r in runs])
        diff = np.array([bucket_perplexities(r) for r in mine]) - np.array([bucket_perplexities(p) for p in paired])
        row["perplexity"] = [figure(column) for column in ppl.T]
        row["perplexity_vs_reference"] = [figure(column) for column in diff.T]
        row["nll_vs_reference_by_row"] = row_differences(mine, paired)
    else:
        row["eval_loss"] = figure([r["eval_metrics"]["eval_loss"] for r in runs])
        row["eval_loss_vs_reference"] = figure([r["eval_metrics"]["eval_loss"] - p["eval_metrics"]["eval_loss"]
                                                for r, p in zip(mine, paired, strict=True)])
        key = f"eval_{long_documents.MODULE_SUMMARY_TASK}/rougeLsum"
        row["rougeLsum"] = figure([r["eval_metrics"].get(key, float("nan")) for r in runs])
    return row


def compare(setting: Setting, report_only: bool) -> dict[str, Any]:
    """Every arm at every seed (seeds outermost), or with `report_only` the runs that exist; summarised."""
    runs: dict[str, list[dict[str, Any]]] = {slug: [] for slug in setting.arms}
    missing = []
    for seed in setting.seeds:
        for slug in setting.arms:
            path = RUNS_DIR / setting.name / slug / f"seed{seed}" / "result.json"
            if report_only and not path.exists():
                missing.append(f"{slug} seed {seed}")
                continue
            try:
                runs[slug].append(train_one(setting, slug, seed))
            except Exception as error:  # noqa: BLE001 - one failed run must not stop the others; it is reported
                print(f"!!! {slug} seed {seed} failed: {error!r}", flush=True)
                missing.append(f"{slug} seed {seed} (failed: {str(error).splitlines()[0][:200]})")
    every = [r for arm_runs in runs.values() for r in arm_runs]
    loads = [x for r in every for x in r["load_1min"]] or [float("nan")]
    rows = {}
    for slug, arm_runs in runs.items():
        if arm_runs and runs[REFERENCE[ARMS[slug].kind]]:
            rows[slug] = {"label": ARMS[slug].label, "kind": ARMS[slug].kind,
                          "training_flops_per_step": training_flops(ARMS[slug]), "batch_size": ARMS[slug].batch_size,
                          "length": ARMS[slug].length,
                          **summarise(arm_runs, runs[REFERENCE[ARMS[slug].kind]])}
    return {"setting": dataclasses.asdict(setting), "missing": missing,
            "txl_available": TXL_AVAILABLE,
            "machine": {"cpus": os.cpu_count(), "jax": jax.__version__,
                        "load_1min_min_median_max": [min(loads), statistics.median(loads), max(loads)],
                        "total_train_wall_s": sum(r["wall_s"] for r in every)},
            "rows": rows}


def _cell(figure: dict[str, Any], digits: int = 2, signed: bool = False) -> str:
    low, high = figure["ci95"]
    spec = f"{'+' if signed else ''}.{digits}f"
    if low == high:  # one seed: no interval
        return f"{figure['mean']:{spec}}"
    return f"{figure['mean']:{spec}} [{low:{spec}}, {high:{spec}}]"


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:.0f}"


def lm_table(results: dict[str, Any]) -> str:
    """Perplexity by position bucket, speed and memory of each LM arm."""
    buckets = [f"{b}-{b + BUCKET - 1}" for b in range(0, ROW, BUCKET)]
    lines = ["| arm | steps (GFLOPs/step) | " + " | ".join(f"ppl {b}" for b in buckets) + " | ppl all "
             "| vs full 512, nats/token: first / last bucket / all [95% CI over rows] | tokens/s (vs full 512) "
             "| XLA step memory, MiB | peak RSS, MiB |",
             "|---" * (len(buckets) + 7) + "|"]
    for slug, row in results["rows"].items():
        if row["kind"] != LM:
            continue
        ppl = [_cell(f) for f in row["perplexity"]]
        reference = slug == REFERENCE[LM]
        by_row = row.get("nll_vs_reference_by_row") or []
        versus = "-" if reference or not by_row else " / ".join(
            _cell(by_row[i], 3, signed=True) for i in (0, len(by_row) - 2, len(by_row) - 1))
        speed = f"{row['tokens_per_s']['mean']:,.0f}" + ("" if reference else
                                                         f" ({_cell(row['tokens_per_s_vs_reference'])}x)")
        compiled = row["compiled"] or {}
        lines.append(f"| {row['label']} | {row['steps']} ({row['training_flops_per_step'] / 1e9:.1f}) | "
                     + " | ".join(ppl) + f" | {versus} | {speed} | {_mib(compiled.get('total_bytes'))} | "
                     f"{_mib(row['peak_rss_bytes'])} |")
    return "\n".join(lines) + "\n"


def summary_table(results: dict[str, Any]) -> str:
    """Validation loss, ROUGE-Lsum, speed and memory of each summary arm."""
    lines = ["| arm | steps (GFLOPs/step) | val loss per target token | vs T5 512 | ROUGE-Lsum | "
             "tokens/s (vs T5 512) | XLA step memory, MiB | peak RSS, MiB |", "|---" * 8 + "|"]
    for slug, row in results["rows"].items():
        if row["kind"] != SUMMARY:
            continue
        reference = slug == REFERENCE[SUMMARY]
        versus = "-" if reference else _cell(row["eval_loss_vs_reference"], 3, signed=True)
        speed = f"{row['tokens_per_s']['mean']:,.0f}" + ("" if reference else
                                                         f" ({_cell(row['tokens_per_s_vs_reference'])}x)")
        lines.append(f"| {row['label']} | {row['steps']} ({row['training_flops_per_step'] / 1e9:.1f}) | "
                     f"{_cell(row['eval_loss'], 3)} | {versus} | {_cell(row['rougeLsum'], 1)} | {speed} | "
                     f"{_mib((row['compiled'] or {}).get('total_bytes'))} | {_mib(row['peak_rss_bytes'])} |")
    return "\n".join(lines) + "\n"


def header(results: dict[str, Any]) -> str:
    setting, machine = results["setting"], results["machine"]
    load = machine["load_1min_min_median_max"]
    lines = [f"- Setting `{setting['name']}`: seeds {list(setting['seeds'])}, {setting['lm_steps']} steps of "
             f"{BATCH_TOKENS} tokens for full attention at 512 (the other LM arms: the steps of equal training "
             f"FLOPs), {setting['summary_steps']} steps of 8 examples for T5 at 512.",
             f"- Machine: {machine['cpus']} CPU cores shared with other jobs (1-minute load min / median / max over "
             f"the runs: {' / '.join(f'{x:.1f}' for x in load)}), JAX {machine['jax']}; the runs "
             f"took {machine['total_train_wall_s'] / 60:.0f} minutes in all."]
    if results["missing"]:
        lines.append(f"- Not run (missing from every figure): {', '.join(results['missing'])}.")
    if not results["txl_available"]:
        lines.append("- Transformer-XL: not in this table (its training memory, ptmjax/training/recurrent_memory.py, "
                     "was not in the tree when this ran).")
    return "\n".join(lines) + "\n"


def tables() -> dict[str, str]:
    """The README's tables, from results_reduced.json."""
    results = json.loads((EXPERIMENT_DIR / "results_reduced.json").read_text())
    return {"reduced-lm": header(results) + "\n" + lm_table(results), "reduced-summary": summary_table(results)}


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Perplexity by position bucket per LM arm (mean over seeds, 95% interval), LM tokens/s, and the summary
    arms' validation loss."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    centres = [b + BUCKET / 2 for b in range(0, ROW, BUCKET)]
    lm = {s: r for s, r in results["rows"].items() if r["kind"] == LM}
    summary = {s: r for s, r in results["rows"].items() if r["kind"] == SUMMARY}
    for i, row in enumerate(lm.values()):
        means = [f["mean"] for f in row["perplexity"][:-1]]
        errors = np.abs(np.array([f["ci95"] for f in row["perplexity"][:-1]]).T - means)
        axes[0].errorbar(np.array(centres) + 12 * i, means, yerr=errors, marker="o", capsize=3, label=row["label"])
    axes[0].set(xlabel="position in the 2,048-token row (bucket centre)", ylabel="validation perplexity",
                title="perplexity by position (mean over seeds, 95% CI)")
    axes[0].legend(fontsize=7)
    for axis, rows, key, title in ((axes[1], lm, "tokens_per_s", "LM training tokens/s (shared CPU)"),
                                   (axes[2], summary, "eval_loss", "summary: validation loss per target token")):
        means = [r[key]["mean"] for r in rows.values()]
        errors = np.abs(np.array([r[key]["ci95"] for r in rows.values()]).T - means) if rows else None
        axis.bar(range(len(rows)), means, yerr=errors, capsize=4, color=plt.cm.tab10.colors[:len(rows)])
        axis.set_xticks(range(len(rows)), [r["label"] for r in rows.values()], rotation=20, ha="right", fontsize=7)
        axis.set(title=title)
    for axis in axes:
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="reduced")
    parser.add_argument("--full", action="store_true", help="the same as --setting full")
    parser.add_argument("--report_only", action="store_true", help="summarise the finished runs; train none")
    parser.add_argument("--arms", help="a comma-separated subset of the setting's arms")
    args = parser.parse_args(argv)
    setting = SETTINGS["full" if args.full else args.setting]
    if args.arms:
        setting = dataclasses.replace(setting, arms=tuple(a for a in setting.arms if a in args.arms.split(",")))
    results = {"measured": results_files.run_record(), **compare(setting, args.report_only)}
    text = header(results) + "\n" + lm_table(results) + "\n" + summary_table(results)
    results_files.publish(EXPERIMENT_DIR, f"_{setting.name}", results,
                          f"# Long context: {setting.name} setting\n\n{text}", plot, "long_context",
                          (SCRIPT, tables) if setting.name == "reduced" else None)  # the setting the README reports
    print(text)


if __name__ == "__main__":
    main()
