"""A training run: checks, state, data, then the step loop with its callbacks.

`train` is the gin entry point of a run. `prepare_run` checks it and builds
its trainer with nothing written (ptmjax/training/prepared_run.py); the run
then saves the resolved config, resumes from the newest checkpoint in
`model_dir` (or initialises), and runs the steps (ptmjax/training/step_loop.py).
After every step its callbacks (ptmjax/training/callbacks/) act: SIGTERM
stops it, the loss and tokens/s are logged and shown on a progress bar,
checkpoints are saved, the validation loss and the tasks' metrics are
evaluated. Step times and tokens/s leave out a process's first step, which
compiles. Run as several processes (one per host), every process runs it
alike; see `multihost` for what they agree on and which files only process 0
writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping, Sequence

import gin
import jax
import optax
import seqio
from flax import linen as nn
from tqdm.auto import tqdm

from ptmjax import partitioning
from ptmjax.data import pipeline
from ptmjax.decoding import DecodeConfig
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import pipeline as pipeline_stages
from ptmjax.tasks import pretraining  # noqa: F401 - registers the default mixture, "ptmjax_pretrain"
from ptmjax.training import compilation_cache, multihost
from ptmjax.training.callbacks.callback import Callback
from ptmjax.training.callbacks.checkpointing import Checkpointing
from ptmjax.training.callbacks.ema_folder import EMA_DIR, EmaFolder
from ptmjax.training.callbacks.inference_evaluation import InferenceEvaluation
from ptmjax.training.callbacks.loss_evaluation import PARAMS, LossEvaluation
from ptmjax.training.callbacks.nonfinite_watch import NonFiniteWatch
from ptmjax.training.callbacks.preemption import Preemption
from ptmjax.training.callbacks.progress_log import ProgressLog
from ptmjax.training.extra_state import ExtraState, ScheduledExtraState
from ptmjax.training.metrics_log import MetricsLog
from ptmjax.training.nonfinite import NonFiniteMonitor, NonFinitePolicy
from ptmjax.training.objective import Objective
from ptmjax.training.optimizers import adafactor
from ptmjax.training.parameter_ema import averaged_params
from ptmjax.training.prefetch import DevicePrefetcher
from ptmjax.training.prepared_run import prepare_run
from ptmjax.training.run_lock import locks_model_dir
from ptmjax.training.run_spec import RunSpec
from ptmjax.training.startup import StartupClock
from ptmjax.training.step_clock import StepClock
from ptmjax.training.step_loop import run_steps


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
@gin.configurable(denylist=["model_dir", "resume_step"])
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
    ema_decay: float | None = None,
    objective: Objective | None = None,
    extra_state: Sequence[ExtraState] = (),
    prefetch_batches: int = 2,
    compilation_cache_dir: str | None = compilation_cache.AUTO,
    callbacks: Sequence[Callback] = (),
    resume_step: int | None = None,
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
      ema_decay: keep an exponential moving average of the trained parameters
        with this decay (e.g. 0.999) in the train state, checkpointed and resumed
        with it; the run then also evaluates it (`eval_ema_<metric>`,
        `eval_ema_<task>/<metric>`) and keeps it at every checkpoint as
        MODEL_DIR/ema/, a model folder every tool reads
        (ptmjax/training/parameter_ema.py). None: no EMA.
      objective: what the train step minimises instead of the family's own loss, e.g. `@Distillation()`: a
        student trained against a frozen teacher (ptmjax/compress/distillation.py); evaluations still score
        the family's loss. None: the family's loss.
      extra_state: more state the run carries beside its parameters, checkpointed and resumed with them
        (ptmjax/training/extra_state.py), e.g. `[@MagnitudePruning()]`: pruning masks that keep the smallest
        weights at zero, updated on their schedule by a callback of their own
        (ptmjax/compress/magnitude_pruning.py).
      prefetch_batches: train batches a background thread reads and puts on
        the devices ahead of the step (ptmjax/training/prefetch.py), so the
        host's work overlaps the step's; 0: none, each batch is read and put
        in the loop's thread. The batches and the data position are the same.
      compilation_cache_dir: JAX's persistent compilation cache, which spares
        a run started again (resumed, or the same run elsewhere) its compiles:
        'auto' is $PTMJAX_COMPILATION_CACHE_DIR, else ~/.cache/ptmjax/
        compilation_cache; None: off. A cache folder JAX already has is kept
        (ptmjax/training/compilation_cache.py).
      callbacks: more callbacks (ptmjax/training/callbacks/callback.py), called after every step after the
        run's own: preemption, the non-finite watch, logging, checkpointing, loss and inference evaluation.
      resume_step: resume from this saved step instead of the newest; the newer checkpoints are set aside as
        checkpoints/<step>.abandoned (kept), their metrics dropped. Not a gin binding (`ptmjax train
        --resume_step`): a one-off choice, not part of the saved config.
    """
    startup = StartupClock("imports and gin")
    task = getattr(mixture_or_task_name, "name", mixture_or_task_name)
    inference_eval_every = eval_every if inference_eval_every is None else inference_eval_every
    _check_arguments(batch_size=batch_size, num_steps=num_steps, log_every=log_every, eval_every=eval_every,
                     checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints,
                     inference_eval_every=inference_eval_every,
                     eval_batches=eval_batches, prefetch_batches=prefetch_batches,
                     best_checkpoint_metric=best_checkpoint_metric, inference_eval_tasks=inference_eval_tasks)
    spec = RunSpec(
        model=model, batch_size=batch_size, task_feature_lengths=task_feature_lengths, optimizer=optimizer,
        schedule=schedule, loss_config=loss_config, mesh_config=mesh_config, num_microbatches=num_microbatches,
        pack=pack, trainable=trainable, ema_decay=ema_decay, objective=objective,
        extra_state=extra_state,
    )
    run = prepare_run(model_dir, spec, task, seed, init_checkpoint, compilation_cache_dir, resume_step)
    trainer = run.trainer
    startup.notes.extend(filter(None, [pipeline_stages.summary(trainer.model, trainer.mesh, trainer.rules)]))
    startup.mark("model and checks")
    os.makedirs(run.folder.path, exist_ok=True)
    checkpointer = run.folder.checkpointer(max_to_keep=keep_checkpoints)
    with contextlib.closing(checkpointer):  # closed on every way out, a failed restore included
        dropout_rng = jax.random.key(seed + 1)
        # XLA compiles the step (or reads it from the compilation cache) while this thread restores or
        # initialises the state and builds the pipelines; not for a run whose newest checkpoint already ends it.
        latest = checkpointer.latest_step() if resume_step is None else resume_step
        compiling = (trainer.start_compiling_train_step(spec.abstract_batch(trainer.batch_sharding), dropout_rng)
                     if latest is None or latest < num_steps else None)
        primary = multihost.is_primary()
        log = MetricsLog(model_dir, read_only=not primary)
        if primary:
            run.write_config()
        state, data_state = run.initial_state(checkpointer, primary)
        start = int(state.step)
        log.truncate_after(start)
        startup.mark("restored state" if start else "initial state")
        evaluators = run.evaluators(inference_eval_tasks, decode_config, inference_eval_examples)
        best = (None if best_checkpoint_metric is None else
                run.best_checkpoint(best_checkpoint_metric, best_checkpoint_mode,
                                    [t for e in evaluators for t in e.task_names], primary))
        train_iter = pipeline.ResumableIterator(
            lambda: run.dataset("train", shuffle=True), batches_consumed=data_state["batches_consumed"]
        )
        # Its state() is the data position that checkpoints save: the batches taken, not those read ahead.
        train_batches = DevicePrefetcher(train_iter, lambda b: partitioning.global_batch(b, run.mesh), prefetch_batches)
        startup.mark("train pipeline")
        with train_batches, tqdm(total=num_steps, initial=start, disable=not (show_progress and primary),
                                 unit="step", dynamic_ncols=True) as bar:
            clock = StepClock()
            nonfinite = NonFiniteMonitor(nonfinite_policy or NonFinitePolicy(), checkpointer.all_steps)
            parameter_sets = dict(PARAMS)
            if ema_decay is not None:
                parameter_sets["ema_"] = lambda state: averaged_params(state.params, state.extra)
            logged = ProgressLog(log_every, log, bar, clock, nonfinite, trainer.api.family.init_fields)
            validation = lambda: run.dataset("validation", shuffle=False, num_epochs=1, pad_final_batch=True)  # noqa: E731
            loss_eval = LossEvaluation(eval_every, trainer, validation, eval_batches, task, log, bar, clock,
                                       parameter_sets)
            task_eval = InferenceEvaluation(inference_eval_every, evaluators, best, run.part, log, bar, clock,
                                            parameter_sets)
            scheduled = [slot.callback(trainer, bar if primary else None) for slot in spec.extra_state
                         if isinstance(slot, ScheduledExtraState)]
            built = [Preemption(), NonFiniteWatch(nonfinite), *scheduled, logged,
                     Checkpointing(checkpoint_every, checkpointer, nonfinite, run.part, train_batches.state)]
            if ema_decay is not None:
                ema_folder = run.params_folder(EMA_DIR, primary, asynchronous=True)
                built.append(EmaFolder(checkpoint_every, ema_folder, run.part))
            built += [loss_eval, *([task_eval] if evaluators else [])]
            state, preempted = run_steps(trainer, state, train_batches, dropout_rng, start, num_steps,
                                         [*built, *callbacks], bar, clock, startup, primary, compiling)
    log.close()
    files = {
        "checkpoints": checkpointer.directory,
        "config": run.folder.config_path,
        "metrics": log.jsonl_path,
        "tensorboard": os.path.join(model_dir, "tensorboard"),
        "loss_curve": log.plot() if log.records() else "",
        **({"best": best.folder.path} if best is not None else {}),
        **({"ema": os.path.join(model_dir, EMA_DIR)} if ema_decay is not None else {}),
    }
    eval_metrics = {**loss_eval.metrics, **{f"eval_{k}": v for k, v in task_eval.metrics.items()}}
    return TrainResult(model_dir, int(state.step), logged.train_loss, eval_metrics, preempted, files)


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


def _check_arguments(
    *, eval_batches: int | None, prefetch_batches: int, best_checkpoint_metric: str | None,
    inference_eval_tasks: Sequence[str], **positive: int,
) -> None:
    """One-line errors for bad run arguments, before anything is built."""
    counted = {**positive, **({} if eval_batches is None else {"eval_batches": eval_batches})}
    bad = [f"train.{name}={value}" for name, value in counted.items() if value < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: must be a positive integer (eval_batches may be None: the whole split)")
    if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 0:
        raise ValueError(f"train.prefetch_batches={prefetch_batches!r} must be an int >= 0 (0: no prefetching)")
    if best_checkpoint_metric is not None and not inference_eval_tasks:
        raise ValueError(
            f"train.best_checkpoint_metric={best_checkpoint_metric!r} needs evaluations; set "
            "train.inference_eval_tasks to the tasks it names"
        )
