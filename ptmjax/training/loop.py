"""The training loop: data -> sharded steps -> metrics, evaluation, checkpoints.

`train` is the gin entry point of a run. It saves the resolved config,
resumes from the newest checkpoint in `model_dir`, shows a progress bar with
loss and tokens/s, evaluates on the validation split, and saves on SIGTERM.
Step times and tokens/s leave out a process's first step, which compiles.
Run as several processes (one per host), every process runs it alike; see
`multihost` for what they agree on and which files only process 0 writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence

import gin
import jax
import optax
import seqio
from flax import linen as nn
from tqdm.auto import tqdm

from ptmjax import partitioning
from ptmjax.data import pipeline, tokenizer_dir
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.evaluation import results
from ptmjax.evaluation.head_evaluator import evaluator_for
from ptmjax.families.registry import family_of
from ptmjax.families.token_loss import LossConfig
from ptmjax.model_dir import ModelDir
from ptmjax.training import compilation_cache, multihost
from ptmjax.training.best_checkpoint import BestCheckpoint
from ptmjax.training.checkpoints import Checkpointer
from ptmjax.training.damaged_checkpoints import restore_newest_intact
from ptmjax.training.init_checkpoint import initial_params
from ptmjax.training.metrics_log import MetricsLog
from ptmjax.training.nonfinite import NonFiniteMonitor, NonFinitePolicy, check_finite_state
from ptmjax.training.optimizers import adafactor
from ptmjax.training.prefetch import DevicePrefetcher
from ptmjax.training.resume_check import check_resumable
from ptmjax.training.run_lock import locks_model_dir
from ptmjax.training.run_spec import RunSpec
from ptmjax.training.saved_part import saved_part
from ptmjax.training.split_check import check_run_splits
from ptmjax.training.startup import StartupClock


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a finished (or interrupted) run reports."""

    model_dir: str
    step: int
    train_loss: float | None
    eval_metrics: dict[str, float]
    preempted: bool
    files: dict[str, str]


@locks_model_dir
@gin.configurable(denylist=["model_dir"])
def train(
    model_dir: str,
    model: nn.Module = gin.REQUIRED,
    mixture_or_task_name: str | seqio.Task | seqio.Mixture = "ptmjax_pretrain",
    task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
    batch_size: int = gin.REQUIRED,
    num_steps: int = gin.REQUIRED,
    optimizer: Callable[..., optax.GradientTransformation] = adafactor,
    schedule: optax.Schedule | None = None,
    loss_config: LossConfig | None = None,
    mesh_config: partitioning.MeshConfig | None = None,
    num_microbatches: int = 1,
    pack: bool = True,
    seed: int = 0,
    log_every: int = 10,
    eval_every: int = 100,
    eval_batches: int | None = 20,
    checkpoint_every: int = 100,
    keep_checkpoints: int = 3,
    show_progress: bool = True,
    init_checkpoint: str | None = None,
    inference_eval_tasks: Sequence[str] = (),
    inference_eval_every: int | None = None,
    inference_eval_examples: int | None = None,
    decode_config: DecodeConfig | None = None,
    best_checkpoint_metric: str | None = None,
    best_checkpoint_mode: str = "max",
    nonfinite_policy: NonFinitePolicy | None = None,
    trainable: Sequence[str] | None = None,
    prefetch_batches: int = 2,
    compilation_cache_dir: str | None = compilation_cache.AUTO,
) -> TrainResult:
    """Pre-trains `model` on a seqio mixture; resumes from `model_dir`.

    Args:
      model_dir: where checkpoints, config.gin, metrics.jsonl, tensorboard/
        and loss_curve.png go.
      model: the Flax model (e.g. an EncoderDecoder of a T5Config).
      mixture_or_task_name: a registered seqio task or mixture, or the object
        itself (e.g. `@register_text_files_task()` in gin).
      task_feature_lengths: e.g. {"inputs": 512, "targets": 114}.
      batch_size: the global batch size, over all hosts and devices.
      num_steps: total optimizer steps (a resumed run continues up to it).
      optimizer: called with the schedule; returns an optax transformation.
      schedule: the learning-rate schedule (default: T5's rsqrt with warmup).
      loss_config: z-loss, label smoothing and loss normalisation (default:
        LossConfig() with its gin bindings).
      mesh_config: mesh axis sizes and logical-axis rules (default:
        MeshConfig() with its gin bindings).
      num_microbatches: gradient accumulation steps per optimizer step.
      pack: pack several examples into one row (segment ids keep them apart).
      seed: seeds parameters, dropout and the data order.
      log_every / eval_every / checkpoint_every: intervals in steps.
      eval_batches: validation batches per evaluation (None: the whole split).
      keep_checkpoints: how many recent checkpoints to keep.
      show_progress: draw a progress bar.
      init_checkpoint: a model folder (a run's, or one `ptmjax convert` wrote
        from Hugging Face) whose newest parameters start a fresh run, with a
        fresh optimizer state: fine-tuning. Saved with or without scanned
        layers, either fits. Ignored when `model_dir` already has a checkpoint
        to resume.
      inference_eval_tasks: seqio tasks or mixtures whose validation split is
        run through `ptmjax.evaluation.evaluator.InferenceEvaluator` (decoding
        and/or scoring, as their metrics need) every `inference_eval_every`
        steps (None: `eval_every`) and at the end, cut to
        `task_feature_lengths`, in batches of `batch_size`. Logged as
        `eval_<task>/<metric>` in metrics.jsonl and `<task>/<metric>` in
        TensorBoard's eval run.
      inference_eval_examples: the first this many examples of each task (None: all).
      decode_config: how those evaluations decode (default: DecodeConfig() with its gin bindings).
      best_checkpoint_metric: '<task>/<metric>' of those evaluations: the
        parameters of the step with its best value are kept in MODEL_DIR/best/
        (see ptmjax/training/best_checkpoint.py); None keeps none.
      best_checkpoint_mode: 'max' or 'min': which value is best.
      nonfinite_policy: what a step with a non-finite loss, gradient norm or
        state does (default: NonFinitePolicy() with its gin bindings: stop
        with an error naming the step); see ptmjax/training/nonfinite.py.
      trainable: regular expressions over parameter paths ('layers_3/.*',
        '.*/bias'); only the parameters they match train, the rest are frozen
        with no optimizer state (ptmjax/training/trainable.py). None trains all.
      prefetch_batches: train batches a background thread reads and puts on
        the devices ahead of the step (ptmjax/training/prefetch.py), so the
        host's work overlaps the step's; 0: none, each batch is read and put
        in the loop's thread. The batches and the data position are the same.
      compilation_cache_dir: JAX's persistent compilation cache, which spares
        a run started again (resumed, or the same run elsewhere) its compiles:
        'auto' is $PTMJAX_COMPILATION_CACHE_DIR, else ~/.cache/ptmjax/
        compilation_cache; None: off. A cache folder JAX already has is kept
        (ptmjax/training/compilation_cache.py).
    """
    startup = StartupClock("imports and gin")
    mixture_or_task_name = getattr(mixture_or_task_name, "name", mixture_or_task_name)
    inference_eval_every = eval_every if inference_eval_every is None else inference_eval_every
    _check_positive(batch_size=batch_size, num_steps=num_steps, log_every=log_every, eval_every=eval_every,
                    checkpoint_every=checkpoint_every, inference_eval_every=inference_eval_every,
                    **({} if eval_batches is None else {"eval_batches": eval_batches}))  # fmt: skip
    if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 0:
        raise ValueError(f"train.prefetch_batches={prefetch_batches!r} must be an int >= 0 (0: no prefetching)")
    if best_checkpoint_metric is not None and not inference_eval_tasks:
        raise ValueError(
            f"train.best_checkpoint_metric={best_checkpoint_metric!r} needs evaluations; set "
            "train.inference_eval_tasks to the tasks it names"
        )
    folder = ModelDir(model_dir)
    if init_checkpoint is not None and not folder.saved_steps():
        ModelDir(init_checkpoint).checkpoint_step()  # fails here, before anything is built or written
    spec = RunSpec(
        model=model, batch_size=batch_size, task_feature_lengths=task_feature_lengths, optimizer=optimizer,
        schedule=schedule, loss_config=loss_config, mesh_config=mesh_config, num_microbatches=num_microbatches,
        pack=pack, trainable=trainable,
    )  # fmt: skip
    compilation_cache.use_compilation_cache(compilation_cache_dir)
    mesh = partitioning.make_mesh(spec.mesh_config)
    _check_vocabulary(model, mixture_or_task_name)
    trainer = spec.trainer(mesh)
    if trainable is not None:
        count, total = trainer.trainable.counts(trainer.optimizer_view[0])
        print(f"Training {count:,} of {total:,} parameter values ({count / total:.2%}); the rest are frozen")
    part = saved_part(folder, trainer, init_checkpoint, trainable is not None)
    check_resumable(folder, part.of(trainer.abstract_state))  # before config.gin is rewritten
    check_run_splits(mixture_or_task_name)
    startup.mark("model and checks")
    os.makedirs(folder.path, exist_ok=True)
    checkpointer = folder.checkpointer(max_to_keep=keep_checkpoints)
    with contextlib.closing(checkpointer):  # closed on every way out, a failed restore included
        dropout_rng = jax.random.key(seed + 1)
        # XLA compiles the step (or reads it from the compilation cache) while this thread restores or
        # initialises the state and builds the pipelines; not for a run whose newest checkpoint already ends it.
        latest = checkpointer.latest_step()
        compiling = (trainer.start_compiling_train_step(spec.abstract_batch(trainer.batch_sharding), dropout_rng)
                     if latest is None or latest < num_steps else None)  # fmt: skip
        primary = multihost.is_primary()
        log = MetricsLog(model_dir, read_only=not primary)
        config_path = folder.config_path
        if primary:
            with open(config_path, "w") as f:
                f.write(gin.operative_config_str())
            print(f"Resolved config saved to {config_path}:\n{gin.operative_config_str()}")
            if init_checkpoint is not None:
                _keep_import_tokenizer(ModelDir(init_checkpoint), folder, mixture_or_task_name)

        if latest is not None:
            saved, data_state = restore_newest_intact(checkpointer, part.of(trainer.abstract_state),
                                                      part.of(trainer.state_shardings))  # fmt: skip
            state = part.complete(saved, trainer)
            print(f"Resumed from step {int(state.step)} in {checkpointer.directory}")
        else:
            state, data_state = trainer.init_state(jax.random.key(seed)), {"batches_consumed": 0}
            if init_checkpoint is not None:
                state = state.replace(params=initial_params(init_checkpoint, trainer, jax.random.key(seed)))
            if part.base is not None and primary:
                folder.write_base(*part.base)
                print(f"Checkpoints hold the {len(part.paths)} trained parameter arrays; the rest are read from "
                      f"{part.base[0].path} (step {part.base[1]}), recorded in {folder.base_path}")  # fmt: skip
        start = int(state.step)
        log.truncate_after(start)
        startup.mark("restored state" if start else "initial state")

        def host_dataset(split: str, **kwargs):
            return run_dataset(mixture_or_task_name, split, task_feature_lengths, batch_size,
                               trainer.api.family.feature_converter, seed=seed, pack=pack, **kwargs)  # fmt: skip

        evaluators = [
            evaluator_for(
                trainer.api, name, mesh, spec.mesh_config.rules, decode_config or DecodeConfig(),
                _generation_ids(model, name, init_checkpoint), batch_size, task_feature_lengths=task_feature_lengths,
                max_examples=inference_eval_examples, logits_chunk_size=spec.loss_config.logits_chunk_size,
            )
            for name in inference_eval_tasks
        ]  # fmt: skip
        best = None
        if best_checkpoint_metric is not None:
            _check_best_metric(best_checkpoint_metric, [t for e in evaluators for t in e.task_names])
            best = BestCheckpoint(model_dir, best_checkpoint_metric, best_checkpoint_mode, gin.operative_config_str(),
                                  read_only=not primary, base=part.base)  # fmt: skip

        def inference_eval(params, step: int) -> dict[str, float]:
            """{'<task>/<metric>': value} of every evaluated task."""
            return {k: v for e in evaluators for k, v in results.flat(e.evaluate(params, step)).items()}

        train_iter = pipeline.ResumableIterator(
            lambda: host_dataset("train", shuffle=True), batches_consumed=data_state["batches_consumed"]
        )
        # Its state() is the data position that checkpoints save: the batches taken, not those read ahead.
        train_batches = DevicePrefetcher(train_iter, lambda b: partitioning.global_batch(b, mesh), prefetch_batches)
        startup.mark("train pipeline")

        # Built at the first evaluation, once: unshuffled, it reads the same batches at every evaluation.
        validation_dataset = functools.cache(
            lambda: host_dataset("validation", shuffle=False, num_epochs=1, pad_final_batch=True)
        )

        def evaluate(params) -> dict[str, float]:
            dataset = validation_dataset()
            shapes = {name: tuple(spec.shape) for name, spec in dataset.element_spec.items()}
            batches = itertools.islice(dataset.as_numpy_iterator(), eval_batches)
            total = None
            for batch in multihost.batches_in_lockstep(batches, shapes):
                stats = trainer.eval_stats(params, partitioning.global_batch(batch, mesh))
                total = stats if total is None else total + stats
            if total is None:
                raise ValueError(f"the validation split of {mixture_or_task_name!r} is empty; add validation data")
            return {f"eval_{k}": float(v) for k, v in jax.device_get(total.metrics()).items()}

        nonfinite = NonFiniteMonitor(nonfinite_policy or NonFinitePolicy())
        tokens_per_step = None  # the model's input tokens per global batch, read off the first batch
        train_loss, eval_metrics, task_metrics, preempted = None, {}, {}, False
        last_time, last_step = None, start  # timing starts once the first step (and its compile) is done
        with train_batches, multihost.stop_on_sigterm() as stop_after, tqdm(
            total=num_steps, initial=start, disable=not (show_progress and primary), unit="step", dynamic_ncols=True
        ) as bar:
            if compiling is not None:
                compiling.result()  # raises the compile's error, if any
                startup.mark("train step compiled")
            for step in range(start, num_steps):
                batch = next(train_batches)
                if tokens_per_step is None:  # global arrays: their size counts every host's rows
                    tokens_per_step = sum(batch[name].size for name in trainer.api.family.init_fields)
                    startup.mark("first batch")
                state, metrics = trainer.train_step(state, batch, dropout_rng)
                done = step + 1
                nonfinite.add(done, metrics)
                checkpointer.check_for_errors()  # a failed background save stops the run here, not minutes later
                bar.update(1)
                if last_time is None:  # the first step compiled: step times start after it
                    jax.block_until_ready(metrics)
                    last_time, last_step = time.perf_counter(), done
                    startup.mark("first step")
                    if primary:
                        bar.write(startup.line())
                if done % log_every == 0 or done == num_steps:
                    nonfinite.check()
                    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                    metrics.update(nonfinite.skipped_since_last_call())
                    if done > last_step:  # a record of the first step itself has no step time
                        metrics["step_time_s"] = (time.perf_counter() - last_time) / (done - last_step)
                        metrics["tokens_per_s"] = tokens_per_step / metrics["step_time_s"]
                    last_time, last_step = time.perf_counter(), done
                    log.write(done, metrics)
                    train_loss = metrics["loss"]
                    speed = {"tok_s": f"{metrics['tokens_per_s']:.0f}"} if "tokens_per_s" in metrics else {}
                    bar.set_postfix(loss=f"{train_loss:.3f}", **speed)
                stop = stop_after(done)
                if done % checkpoint_every == 0 or done == num_steps or stop:  # before evaluating, which may fail
                    _save_if_finite(checkpointer, nonfinite, done, part.of(state), train_batches.state())
                if done % eval_every == 0 or done == num_steps:
                    eval_start = time.perf_counter()
                    eval_metrics = evaluate(state.params)
                    log.write(done, eval_metrics)
                    log.plot()
                    bar.write(f"step {done}: " + ", ".join(f"{k}={v:.4f}" for k, v in eval_metrics.items()))
                    last_time += time.perf_counter() - eval_start  # step times exclude evaluation
                if evaluators and (done % inference_eval_every == 0 or done == num_steps):
                    eval_start = time.perf_counter()
                    task_metrics = inference_eval(state.params, done)
                    log.write(done, {f"eval_{k}": v for k, v in task_metrics.items()})
                    note = ""
                    if best is not None and best.update(done, task_metrics, part.of(state).params):
                        note = f" (best {best_checkpoint_metric}: saved to {best.folder.path})"
                    bar.write(f"step {done}: " + ", ".join(f"{k}={v:.4f}" for k, v in task_metrics.items()) + note)
                    last_time += time.perf_counter() - eval_start
                if stop:
                    preempted = True
                    bar.write(f"SIGTERM: saved step {done}; rerun the same command to resume")
                    break

    if best is not None:
        best.close()
    log.close()
    final_step = int(state.step)
    files = {
        "checkpoints": checkpointer.directory,
        "config": config_path,
        "metrics": log.jsonl_path,
        "tensorboard": os.path.join(model_dir, "tensorboard"),
        "loss_curve": log.plot() if log.records() else "",
    }
    if best is not None:
        files["best"] = best.folder.path
    eval_metrics = {**eval_metrics, **{f"eval_{k}": v for k, v in task_metrics.items()}}
    return TrainResult(model_dir, final_step, train_loss, eval_metrics, preempted, files)


def run_dataset(
    mixture_or_task_name: str, split: str, task_feature_lengths: Mapping[str, int], batch_size: int,
    feature_converter: type[seqio.FeatureConverter], *, seed: int, pack: bool, **kwargs,
):  # fmt: skip
    """This host's shard of a split, batched to its share of the global `batch_size`: what `train` reads
    (with `shuffle=True` for 'train'; `benchmarks/input_pipeline.py` times it). kwargs go to `pipeline.get_dataset`."""
    return pipeline.get_dataset(
        mixture_or_task_name, split, task_feature_lengths, batch_size // jax.process_count(),
        seed=seed, pack=pack, shard_index=jax.process_index(), num_shards=jax.process_count(),
        feature_converter=feature_converter, **kwargs,
    )


def run_spec_from_gin() -> RunSpec:
    """The RunSpec that `train` builds from the parsed gin config (see `ptmjax.gin_files.parse_gin`)."""
    bound = gin.get_bindings("train")
    for name in ("model", "task_feature_lengths", "batch_size"):
        if name not in bound:
            raise ValueError(
                f"the gin files bind no train.{name}; combine a model, a run and a mesh file, e.g. "
                "models/t5_1_1_base.gin, runs/pretrain.gin and mesh/fsdp.gin"
            )
    defaults = {name: p.default for name, p in inspect.signature(train).parameters.items()}
    return RunSpec(**{f.name: bound.get(f.name, defaults[f.name]) for f in dataclasses.fields(RunSpec)})


def _save_if_finite(
    checkpointer: Checkpointer, nonfinite: NonFiniteMonitor, step: int, state, data_state: dict[str, int]
) -> None:
    """Saves `step` once its steps and its state are known finite (else NonFiniteError); after a skipped step,
    the newest checkpoint before the first one is kept out of rotation."""
    nonfinite.check()
    check_finite_state(step, state)
    first_skipped = nonfinite.first_skipped_step
    good = [s for s in checkpointer.all_steps() if first_skipped is not None and s < first_skipped]
    if good and max(good) not in checkpointer.kept_steps:
        checkpointer.keep(max(good))
    checkpointer.save(step, state, data_state)


def _check_positive(**values: int) -> None:
    bad = [f"train.{name}={value}" for name, value in values.items() if value < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: must be a positive integer (eval_batches may be None: the whole split)")


def _check_best_metric(metric: str, tasks: Sequence[str]) -> None:
    """`metric` must read '<task>/<metric>' with an evaluated task."""
    task, _, name = metric.rpartition("/")
    if task not in tasks or not name:
        raise ValueError(
            f"train.best_checkpoint_metric={metric!r} does not name '<task>/<metric>' of an evaluated task; "
            f"evaluated tasks: {', '.join(tasks)}"
        )


def _generation_ids(model: nn.Module, task: str, init_checkpoint: str | None) -> GenerationIds:
    """An init checkpoint's generation.json (an import's), else the ids of `task`'s targets vocabulary."""
    if init_checkpoint is not None and os.path.isfile(ModelDir(init_checkpoint).generation_path):
        return GenerationIds.read(ModelDir(init_checkpoint).generation_path)
    vocabulary = pipeline.task_vocabulary(task)
    return GenerationIds.from_vocabulary(vocabulary, family_of(model).encoder_decoder)


def _keep_import_tokenizer(source: ModelDir, run: ModelDir, mixture_or_task_name: str) -> None:
    """Copies an import's tokenizer/ and generation.json into the run when the run's task uses that tokenizer,
    so the fine-tuned model decodes and exports with them; nothing the run already has is replaced."""
    if not os.path.isdir(source.tokenizer_path) or os.path.exists(run.tokenizer_path):
        return
    task_vocabulary = pipeline.task_vocabulary(mixture_or_task_name)
    if task_vocabulary != tokenizer_dir.read_vocabulary(source.tokenizer_path):
        return
    shutil.copytree(source.tokenizer_path, run.tokenizer_path)
    if os.path.isfile(source.generation_path) and not os.path.exists(run.generation_path):
        shutil.copyfile(source.generation_path, run.generation_path)


def _check_vocabulary(model: nn.Module, mixture_or_task_name: str) -> None:
    """The model's embedding must cover every id the task's vocabulary emits."""
    vocab_size = pipeline.task_vocabulary(mixture_or_task_name).vocab_size
    model_vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if model_vocab is not None and model_vocab < vocab_size:
        raise ValueError(
            f"model vocab_size {model_vocab} is smaller than the {vocab_size} ids of "
            f"{mixture_or_task_name!r}'s vocabulary; set {type(model.config).__name__}.vocab_size >= {vocab_size}"
        )
