"""The experiment's rows: how each model folder is made, through ptmjax's trainer and commands, from the one
pre-trained backbone and the float baseline fine-tuned at the same seed."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Callable, Sequence

TASK = "ptmjax_stdlib_module_classification_head"
CLASSIFY_GIN = "runs/bert_classify_demo.gin"
PRETRAIN_GIN = "runs/bert_demo.gin"
FLOAT = "float baseline"
FLOAT_LONGER = "float baseline, fine-tuned further (control)"
LAYERDROP_RATE = 0.5  # LayerDrop's rate in fine-tuning: the share of layers that pruning every other layer removes
INT4_TILE = 16  # int4's sub-channel tile: it divides d_model (64) and d_ff (256)
HEAD_IMPORTANCE_BATCHES = (16, 16)  # (batches, examples per batch) of the train split that score the heads
RETENTIONS = ((0.75, 0.7), (0.5, 0.5))  # PoWER-BERT: (the share of tokens layer 1 keeps, the ratio from layer to layer)
SEARCH = (1e-5, 50.0)  # PoWER-BERT's configuration search: (RetentionSearch.penalty, retention_search.rate)
EXIT_THRESHOLDS = (0.0, 0.25, 1.0)  # DeeBERT's entropy thresholds (nats; ln 12 = 2.48 is the most): 0 never exits early


@dataclasses.dataclass(frozen=True)
class Setting:
    """The knobs that differ between the reduced (default), full and smoke settings."""

    name: str
    num_layers: int  # of the pre-trained and fine-tuned BERT (the teacher)
    pretrain_steps: int
    finetune_steps: int  # the float baseline's, the LayerDrop run's and the distilled students'
    compress_steps: int  # further fine-tuning of QAT and magnitude pruning from the baseline
    seeds: tuple[int, ...]  # fine-tuning and compression seeds: each seed's rows start from that seed's baseline
    inputs_length: int
    learning_rate: float = 1e-3  # the peak of bert_finetune.gin's slanted triangular schedule, in every run


def train_run(model_dir: pathlib.Path, gin_files: Sequence[str], bindings: Sequence[str]) -> None:
    """Trains through gin into `model_dir` (skipped when its result.json says it finished), recording the wall
    time and the machine's 1-minute load average around it."""
    import gin

    from ptmjax.gin_files import parse_gin
    from ptmjax.training.run import train

    done = model_dir / "result.json"
    if done.exists():
        return
    print(f"\n=== {model_dir}", flush=True)
    gin.clear_config()
    parse_gin(list(gin_files), [*bindings, "train.show_progress = False"])
    load_before, start = os.getloadavg()[0], time.perf_counter()
    train(str(model_dir))
    gin.clear_config()
    done.write_text(json.dumps({"wall_s": time.perf_counter() - start,
                                "load_1min": [load_before, os.getloadavg()[0]]}))


def command(model_dir: pathlib.Path, args: Sequence[str]) -> None:
    """`ptmjax ARGS --to model_dir`, in this process (skipped when model_dir holds its config.gin: the commands
    write their folders whole)."""
    from ptmjax import cli

    if (model_dir / "config.gin").exists():
        return
    print(f"\n=== ptmjax {' '.join(args)} --to {model_dir}", flush=True)
    if cli.main([*args, "--to", str(model_dir)]):
        raise RuntimeError(f"ptmjax {' '.join(args)} --to {model_dir} failed")


def classify_bindings(setting: Setting, seed: int, steps: int, init: pathlib.Path | None) -> list[str]:
    """runs/bert_classify_demo.gin's recipe at this setting: `steps` steps from `init` (None: from scratch),
    evaluated and saved once at the end, the last checkpoint kept (no choice by the validation split)."""
    return [
        f"BertConfig.num_layers = {setting.num_layers}", f"train.init_checkpoint = {str(init) if init else None!r}",
        f"train.num_steps = {steps}", f"train.seed = {seed}",
        f"train.task_feature_lengths = {{'inputs': {setting.inputs_length}}}",
        f"slanted_triangular.total_steps = {steps}", f"slanted_triangular.peak_learning_rate = {setting.learning_rate}",
        f"train.eval_every = {steps}", f"train.checkpoint_every = {steps}", "train.best_checkpoint_metric = None",
    ]


def pretrained(setting: Setting, runs_dir: pathlib.Path) -> pathlib.Path:
    """The backbone: runs/bert_demo.gin (masked LM and next-sentence prediction) at the setting's depth."""
    folder = runs_dir / "pretrain"
    lengths = f"{{'inputs': {setting.inputs_length}, 'targets': {setting.inputs_length}}}"
    train_run(folder, [PRETRAIN_GIN], [
        f"BertConfig.num_layers = {setting.num_layers}", f"train.num_steps = {setting.pretrain_steps}",
        f"train.task_feature_lengths = {lengths}", f"warmup_cosine.total_steps = {setting.pretrain_steps}",
        f"warmup_cosine.warmup_steps = {max(1, setting.pretrain_steps // 12)}",
        f"train.eval_every = {setting.pretrain_steps}", f"train.checkpoint_every = {setting.pretrain_steps}"])
    return folder


def baseline(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
    """The float baseline: the backbone fine-tuned on the task at `seed`."""
    folder = runs_dir / "float" / f"seed{seed}"
    train_run(folder, [CLASSIFY_GIN], classify_bindings(setting, seed, setting.finetune_steps,
                                                         pretrained(setting, runs_dir)))
    return folder


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: `make(setting, runs_dir, seed)` returns the model folder it scores."""

    name: str
    group: str
    how: str  # one line: what was run
    make: Callable[[Setting, pathlib.Path, int], pathlib.Path]
    depth: Callable[[int], int] = lambda layers: layers  # its depth, of the teacher's
    exit_threshold: float | None = None  # an early-exit row's entropy threshold (EntropyExit)

    def layers(self, setting: Setting) -> int:
        return self.depth(setting.num_layers)


def folder_of(runs_dir: pathlib.Path, name: str, seed: int) -> pathlib.Path:
    return runs_dir / "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_") / f"seed{seed}"


def trained_longer(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
    """The control for the rows that fine-tune the baseline further: as many more steps, with nothing compressed."""
    folder = runs_dir / "float_longer" / f"seed{seed}"
    train_run(folder, [CLASSIFY_GIN], classify_bindings(setting, seed, setting.compress_steps,
                                                         baseline(setting, runs_dir, seed)))
    return folder


def distilled(name: str, divisor: int, layer_terms: bool) -> Row:
    """A student of 1/divisor of the teacher's depth, initialised from the teacher's alternate layers
    (DistilBERT) and trained on the task against the baseline of its seed: logits (hard and soft, T = 2), and with
    `layer_terms` also each student layer's hidden states (cosine) and attention (KL) against the teacher layer
    'uniform' maps it to."""

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        folder, teacher = folder_of(runs_dir, name, seed), baseline(setting, runs_dir, seed)
        terms = ["Distillation.hidden_weight = 1.0", "Distillation.hidden_loss = 'cosine'",
                 "Distillation.attention_weight = 1.0", "Distillation.attention_loss = 'kl'"] if layer_terms else []
        train_run(folder, [CLASSIFY_GIN], [
            *classify_bindings(setting, seed, setting.finetune_steps, None),
            f"BertConfig.num_layers = {setting.num_layers // divisor}",
            "train.objective = @Distillation()", f"Distillation.teacher_dir = '{teacher}'",
            "Distillation.teacher = @teacher/EncoderForSequenceClassification()",
            "teacher/EncoderForSequenceClassification.config = @teacher/BertConfig()",
            "teacher/EncoderForSequenceClassification.num_labels = 12",
            f"teacher/BertConfig.num_layers = {setting.num_layers}",
            "Distillation.temperature = 2.0", "Distillation.hard_weight = 1.0", "Distillation.soft_weight = 1.0",
            "Distillation.layers = 'uniform'", "Distillation.init_layers = 'alternate'", *terms])
        return folder

    terms = "logits, hidden states (cosine) and attention (KL)" if layer_terms else "logits (hard and soft)"
    return Row(name, "distillation", f"student of 1/{divisor} the depth from the teacher's alternate layers, "
               f"fine-tuned on {terms}", make, lambda layers: layers // divisor)


def post_training(name: str, flags: Sequence[str]) -> Row:
    """`ptmjax quantize FLAGS` of the baseline."""

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        folder = folder_of(runs_dir, name, seed)
        command(folder, ["quantize", "--from", str(baseline(setting, runs_dir, seed)), *flags])
        return folder

    return Row(name, "quantization", f"`ptmjax quantize{''.join(' ' + flag for flag in flags)}` of the baseline", make)


def quantization_aware(name: str, weights: str) -> Row:
    """The baseline fine-tuned further as `@fake_quantized()` (`weights`, int8 activations) on the task loss and
    the baseline's soft logits (T = 1), then `ptmjax quantize` of that run (the integers it trained with)."""

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        folder = folder_of(runs_dir, name, seed)
        trained, source = folder.parent / f"{folder.name}_trained", baseline(setting, runs_dir, seed)
        train_run(trained, [CLASSIFY_GIN], [
            *classify_bindings(setting, seed, setting.compress_steps, source),
            "train.model = @fake_quantized()", "fake_quantized.model = @EncoderForSequenceClassification()",
            f"fake_quantized.weights = '{weights}'", "fake_quantized.activations = 'int8'",
            "train.objective = @Distillation()", f"Distillation.teacher_dir = '{source}'",
            "Distillation.temperature = 1.0", "Distillation.hard_weight = 1.0", "Distillation.soft_weight = 1.0"])
        command(folder, ["quantize", "--from", str(trained)])
        return folder

    return Row(name, "quantization", f"`@fake_quantized()` ({weights} weights, int8 activations) fine-tuned from "
               "the baseline on the task and its soft logits, then `ptmjax quantize`", make)


def magnitude(sparsity: float, gradual: bool) -> Row:
    """`MagnitudePruning` of the baseline's layer kernels (global) to `sparsity` while it fine-tunes further: at once
    before the first step, or on the cubic schedule over the first 2/3 of the steps."""
    name = f"magnitude {sparsity:.0%}, {'gradual' if gradual else 'one-shot'}"

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        folder = folder_of(runs_dir, name, seed)
        steps = setting.compress_steps
        schedule = [f"MagnitudePruning.end_step = {2 * steps // 3}",
                    f"MagnitudePruning.frequency = {max(1, steps // 10)}"] if gradual else []
        train_run(folder, [CLASSIFY_GIN], [
            *classify_bindings(setting, seed, steps, baseline(setting, runs_dir, seed)),
            "train.extra_state = [@MagnitudePruning()]", f"MagnitudePruning.sparsity = {sparsity}",
            "MagnitudePruning.begin_step = 0", "MagnitudePruning.scope = 'global'", *schedule])
        return folder

    when = "on the cubic schedule over the first 2/3 of" if gradual else "once, before"
    return Row(name, "magnitude pruning", f"`MagnitudePruning` of the layer kernels (global) {when} the further "
               "fine-tuning steps", make)


def heads(fraction: float) -> Row:
    """`ptmjax prune-heads` of the baseline, its heads scored on the train split; no further training."""
    name = f"heads pruned {fraction:.0%}"
    batches, batch_size = HEAD_IMPORTANCE_BATCHES

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        folder = folder_of(runs_dir, name, seed)
        command(folder, ["prune-heads", "--from", str(baseline(setting, runs_dir, seed)), "--task", TASK,
                         "--fraction", str(fraction), "--split", "train", "--num_batches", str(batches),
                         "--batch_size", str(batch_size)])
        return folder

    return Row(name, "head pruning", f"`ptmjax prune-heads --fraction {fraction}` scored on {batches * batch_size} "
               "train examples, not fine-tuned after", make)


def layerdrop_trained(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
    """The backbone fine-tuned as the baseline is, with LayerDrop."""
    folder = runs_dir / "layerdrop" / f"seed{seed}"
    train_run(folder, [CLASSIFY_GIN], [
        *classify_bindings(setting, seed, setting.finetune_steps, pretrained(setting, runs_dir)),
        f"BertConfig.layerdrop = {LAYERDROP_RATE}"])
    return folder


def every_other_layer(name: str, source: Callable[[Setting, pathlib.Path, int], pathlib.Path], how: str) -> Row:
    """`ptmjax prune-layers --keep every_other` of `source`'s folder; no further training."""

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        folder = folder_of(runs_dir, name, seed)
        command(folder, ["prune-layers", "--from", str(source(setting, runs_dir, seed)), "--keep", "every_other"])
        return folder

    return Row(name, "layer pruning", how, make, lambda layers: (layers + 1) // 2)


def exits_trained(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
    """DeeBERT's second stage over the baseline: an exit classifier after each layer (`@early_exit()`), trained
    alone on the sum of their losses (`ExitLoss`, 'deebert') as long as the baseline fine-tuned; the backbone and
    the last layer's head are the baseline's, bit for bit."""
    folder = runs_dir / "early_exit" / f"seed{seed}"
    train_run(folder, [CLASSIFY_GIN], [
        *classify_bindings(setting, seed, setting.finetune_steps, baseline(setting, runs_dir, seed)),
        "train.model = @early_exit()", "early_exit.model = @EncoderForSequenceClassification()",
        "train.objective = @ExitLoss()", "ExitLoss.weighting = 'deebert'",
        "train.trainable = [%ptmjax.compress.EXIT_PARAMS]"])
    return folder


def early_exit(threshold: float) -> Row:
    """The DeeBERT exits leaving at the first layer whose prediction's entropy is below `threshold`, run layer by
    layer (`compress.early_exit_runner.LayerByLayer`: a batch stops when its last example has left)."""
    name = f"early exit, entropy < {threshold:g}" + (" (never early)" if threshold == 0 else "")
    return Row(name, "early exit", f"DeeBERT's exits trained alone over the baseline, `EntropyExit({threshold:g})`, "
               "run layer by layer", exits_trained, exit_threshold=threshold)


def power_bert(first: float, ratio: float) -> Row:
    """The baseline fine-tuned further as `@power_bert()`: layer i (from 0) keeps the ceil(first * ratio^i)
    shares of the input positions the others attend to most (ptmjax/compress/token_dropping.py)."""
    name = f"PoWER-BERT, {first:g} of the tokens, x{ratio:g} a layer"

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        folder = folder_of(runs_dir, name, seed)
        retention = [round(first * ratio**layer, 6) for layer in range(setting.num_layers)]
        train_run(folder, [CLASSIFY_GIN], [
            *classify_bindings(setting, seed, setting.compress_steps, baseline(setting, runs_dir, seed)),
            "train.model = @power_bert()", "power_bert.model = @EncoderForSequenceClassification()",
            f"power_bert.retention = {retention}"])
        return folder

    return Row(name, "token dropping", f"`@power_bert()` keeping {first:g} of the positions after layer 1's attention, "
               f"{ratio:g} times the layer before's after each next, fine-tuned further from the baseline", make)


def power_bert_searched() -> Row:
    """PoWER-BERT's three steps from the baseline: the configuration search (`@retention_search()` trained with
    `RetentionSearch`), its retention read off (`searched_retention`), then `@power_bert()` at that retention
    fine-tuned from the search's folder; each step as many steps as the other further fine-tunings."""
    penalty, rate = SEARCH
    name = f"PoWER-BERT, retention searched (penalty {penalty:g})"

    def make(setting: Setting, runs_dir: pathlib.Path, seed: int) -> pathlib.Path:
        from ptmjax.compress.token_dropping_evaluation import searched_retention

        folder, search = folder_of(runs_dir, name, seed), folder_of(runs_dir, name, seed) / "search"
        train_run(search, [CLASSIFY_GIN], [
            *classify_bindings(setting, seed, setting.compress_steps, baseline(setting, runs_dir, seed)),
            "train.model = @retention_search()", "retention_search.model = @EncoderForSequenceClassification()",
            f"retention_search.rate = {rate}", "train.objective = @RetentionSearch()",
            f"RetentionSearch.penalty = {penalty}"])
        retention = list(searched_retention(str(search), setting.inputs_length))
        train_run(folder, [CLASSIFY_GIN], [
            *classify_bindings(setting, seed, setting.compress_steps, search),
            "train.model = @power_bert()", "power_bert.model = @EncoderForSequenceClassification()",
            f"power_bert.retention = {retention}"])
        return folder

    return Row(name, "token dropping", f"`@retention_search(rate={rate:g})` trained with "
               f"`RetentionSearch({penalty:g})` from the baseline, then `@power_bert()` at the retention it found "
               "fine-tuned from it", make)


def rows(setting: Setting) -> list[Row]:
    """Every row, in the table's order."""
    del setting  # the same rows in every setting
    return [
        Row(FLOAT, "float", "the pre-trained backbone fine-tuned on the task", baseline),
        Row(FLOAT_LONGER, "float", "the baseline fine-tuned further as QAT, magnitude pruning and PoWER-BERT are, "
            "with nothing compressed (their control)", trained_longer),
        distilled("distilled to 1/2 depth: logits", 2, False),
        distilled("distilled to 1/2 depth: logits + hidden + attention", 2, True),
        distilled("distilled to 1/4 depth: logits", 4, False),
        distilled("distilled to 1/4 depth: logits + hidden + attention", 4, True),
        post_training("int8 weights (PTQ)", []),
        post_training("int8 weights and activations (PTQ)", ["--activations", "int8"]),
        post_training(f"int4 weights, tiles of {INT4_TILE} (PTQ)", ["--weights", "int4", "--tile_size",
                                                                   str(INT4_TILE)]),
        post_training("ternary weights (PTQ)", ["--weights", "ternary"]),
        post_training("binary weights (PTQ)", ["--weights", "binary"]),
        quantization_aware("int8 weights and activations (QAT)", "int8"),
        quantization_aware("ternary weights, int8 activations (QAT)", "ternary"),
        *(magnitude(sparsity, gradual) for sparsity in (0.3, 0.5, 0.7) for gradual in (False, True)),
        heads(0.25),
        heads(0.5),
        Row(f"LayerDrop {LAYERDROP_RATE} fine-tuned, all layers", "layer pruning",
            f"fine-tuned as the baseline with `BertConfig.layerdrop = {LAYERDROP_RATE}`", layerdrop_trained),
        every_other_layer("LayerDrop fine-tuned, every other layer", layerdrop_trained,
                          "`ptmjax prune-layers --keep every_other` of the LayerDrop run"),
        every_other_layer("float baseline, every other layer", baseline,
                          "`ptmjax prune-layers --keep every_other` of the baseline (no LayerDrop)"),
        *(early_exit(threshold) for threshold in EXIT_THRESHOLDS),
        *(power_bert(first, ratio) for first, ratio in RETENTIONS),
        power_bert_searched(),
    ]
