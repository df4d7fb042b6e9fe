"""A run checked and built before anything is written: its folder, mesh, trainer and the part it saves.

`prepare_run` fails fast, with nothing written: a missing init checkpoint, a
vocabulary larger than the model's embedding, a batch that does not split over
the mesh, a checkpoint of another model in the folder, a folder that cannot be
written or has no room for a checkpoint, a task without the splits the run
reads. The `PreparedRun` then writes the config, restores or initialises the
state, and builds the datasets and evaluators the run reads.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import seqio
from flax import linen as nn
from jax.sharding import Mesh

from ptmjax import partitioning
from ptmjax.data import pipeline, sentence_pooling, tokenizer_dir
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.evaluation.head_evaluator import evaluator_for
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.damaged_checkpoints import restore_newest_intact, set_newer_aside
from ptmjax.storage.model_dir import ModelDir
from ptmjax.storage.writable import check_writable
from ptmjax.training import compilation_cache
from ptmjax.training.best_checkpoint import BestCheckpoint
from ptmjax.training.init_checkpoint import initial_params
from ptmjax.training.params_folder import ParamsFolder
from ptmjax.training.resume_check import check_resumable
from ptmjax.training.run_spec import RunSpec
from ptmjax.training.saved_part import SavedPart, protect_base, saved_part
from ptmjax.training.split_check import check_run_splits
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """What `prepare_run` checked and built; `task` is the seqio task or mixture name the run trains on."""

    folder: ModelDir
    spec: RunSpec
    task: str
    mesh: Mesh
    trainer: Trainer
    part: SavedPart
    seed: int
    init_checkpoint: str | None
    resume_step: int | None = None

    def write_config(self) -> None:
        """Saves the resolved config (config.gin) and, fine-tuning an import on its own tokenizer, the
        import's tokenizer/, generation.json and sentence-transformers files, so the run decodes, embeds and
        exports with them."""
        with open(self.folder.config_path, "w") as f:
            f.write(gin.operative_config_str())
        print(f"Resolved config saved to {self.folder.config_path}:\n{gin.operative_config_str()}")
        if self.init_checkpoint is not None:
            _keep_import_tokenizer(ModelDir(self.init_checkpoint), self.folder, self.task)

    def initial_state(self, checkpointer: Checkpointer, primary: bool) -> tuple[TrainState, dict[str, int]]:
        """The state and data position to start from: the newest intact checkpoint's (with `resume_step`,
        that step's, the newer ones set aside), else a fresh state (its parameters from the init checkpoint,
        if any) at data position 0."""
        trainer, part = self.trainer, self.part
        if self.resume_step is not None:
            set_newer_aside(checkpointer, self.resume_step)
        if checkpointer.latest_step() is not None:
            saved, data_state = restore_newest_intact(checkpointer, part.of(trainer.abstract_state),
                                                      part.of(trainer.state_shardings))
            state = part.complete(saved, trainer)
            print(f"Resumed from step {int(state.step)} in {checkpointer.directory}")
            return state, data_state
        state = trainer.init_state(jax.random.key(self.seed))
        if self.init_checkpoint is not None:
            state = trainer.with_params(state, initial_params(self.init_checkpoint, trainer, jax.random.key(self.seed)))
        if part.base is not None and primary:
            self.folder.write_base(*part.base)
            protect_base(self.folder, *part.base)
            print(f"Checkpoints hold the {len(part.paths)} trained parameter arrays; the rest are read from "
                  f"{part.base[0].path} (step {part.base[1]}), recorded in {self.folder.base_path}")
        return state, {"batches_consumed": 0}

    def dataset(self, split: str, **kwargs: Any):
        """This host's batches of `split` (see `run_dataset`); kwargs go to `pipeline.get_dataset`."""
        return run_dataset(self.task, split, self.spec.task_feature_lengths, self.spec.batch_size,
                           self.trainer.api.family.feature_converter, seed=self.seed, pack=self.spec.pack,
                           **kwargs)

    def evaluators(self, tasks: Sequence[str], decode_config: DecodeConfig | None, max_examples: int | None):
        """An evaluator (decoding, scoring or a task head's) of each of `tasks`, in batches of the run's size."""
        spec = self.spec
        return [
            evaluator_for(self.trainer.api, name, self.mesh, spec.mesh_config.rules, decode_config or DecodeConfig(),
                          self.generation_ids(name), spec.batch_size, task_feature_lengths=spec.task_feature_lengths,
                          max_examples=max_examples, logits_chunk_size=spec.loss_config.logits_chunk_size)
            for name in tasks
        ]

    def generation_ids(self, task: str) -> GenerationIds:
        """The init checkpoint's generation.json (an import's), else the ids of `task`'s targets vocabulary."""
        if self.init_checkpoint is not None and os.path.isfile(ModelDir(self.init_checkpoint).generation_path):
            return GenerationIds.read(ModelDir(self.init_checkpoint).generation_path)
        return GenerationIds.from_vocabulary(pipeline.task_vocabulary(task), self.trainer.api.family.encoder_decoder)

    def params_folder(self, name: str, primary: bool, asynchronous: bool = False) -> ParamsFolder:
        """MODEL_DIR/`name`/: parameters alone, in a model folder of their own (ptmjax/training/params_folder.py)."""
        return ParamsFolder(self.folder.path, name, gin.operative_config_str(), read_only=not primary,
                            base=self.part.base, asynchronous=asynchronous)

    def best_checkpoint(self, metric: str, mode: str, evaluated_tasks: Sequence[str], primary: bool) -> BestCheckpoint:
        """MODEL_DIR/best/, tracking `metric` ('<task>/<metric>' of one of `evaluated_tasks`)."""
        task, _, name = metric.rpartition("/")
        if task not in evaluated_tasks or not name:
            raise ValueError(
                f"train.best_checkpoint_metric={metric!r} does not name '<task>/<metric>' of an evaluated task; "
                f"evaluated tasks: {', '.join(evaluated_tasks)}"
            )
        return BestCheckpoint(self.folder.path, metric, mode, gin.operative_config_str(), read_only=not primary,
                              base=self.part.base)


def prepare_run(
    model_dir: str, spec: RunSpec, task: str, seed: int, init_checkpoint: str | None, compilation_cache_dir: str | None,
    resume_step: int | None = None,
) -> PreparedRun:
    """Checks the run and builds its mesh and trainer; writes nothing (see the module docstring)."""
    folder = ModelDir(model_dir)
    if resume_step is not None:
        try:
            folder.checkpoint_step(resume_step)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"--resume_step={resume_step}: {error}") from None
    if init_checkpoint is not None and not folder.saved_steps():
        ModelDir(init_checkpoint).checkpoint_step()  # fails here, before anything is built or written
    compilation_cache.use_compilation_cache(compilation_cache_dir)
    mesh = partitioning.make_mesh(spec.mesh_config)
    _check_vocabulary(spec.model, task)
    trainer = spec.trainer(mesh)
    if spec.trainable is not None:
        count, total = trainer.trainable.counts(trainer.optimizer_view[0])
        print(f"Training {count:,} of {total:,} parameter values ({count / total:.2%}); the rest are frozen")
    part = saved_part(folder, trainer, init_checkpoint, spec.trainable is not None)
    check_resumable(folder, part.of(trainer.abstract_state))  # before config.gin is rewritten
    check_writable(folder.path)
    check_writable(folder.checkpoints_path, needed_bytes=_bytes(part.of(trainer.abstract_state)))
    check_run_splits(task, spec.task_feature_lengths)
    return PreparedRun(folder, spec, task, mesh, trainer, part, seed, init_checkpoint, resume_step)


def run_dataset(
    mixture_or_task_name: str, split: str, task_feature_lengths: Mapping[str, int], batch_size: int,
    feature_converter: type[seqio.FeatureConverter], *, seed: int, pack: bool, **kwargs: Any,
):
    """This host's shard of a split, batched to its share of the global `batch_size`: what `train` reads
    (with `shuffle=True` for 'train'; `benchmarks/input_pipeline.py` times it). kwargs go to `pipeline.get_dataset`."""
    return pipeline.get_dataset(
        mixture_or_task_name, split, task_feature_lengths, batch_size // jax.process_count(),
        seed=seed, pack=pack, shard_index=jax.process_index(), num_shards=jax.process_count(),
        feature_converter=feature_converter, **kwargs,
    )


def _keep_import_tokenizer(source: ModelDir, run: ModelDir, mixture_or_task_name: str) -> None:
    """Copies an import's tokenizer/, generation.json and sentence-transformers files (data/sentence_pooling.py)
    into the run when the run's task uses that tokenizer; nothing the run already has is replaced."""
    if not os.path.isdir(source.tokenizer_path) or os.path.exists(run.tokenizer_path):
        return
    task_vocabulary = pipeline.task_vocabulary(mixture_or_task_name)
    if task_vocabulary != tokenizer_dir.read_vocabulary(source.tokenizer_path):
        return
    shutil.copytree(source.tokenizer_path, run.tokenizer_path)
    if os.path.isfile(source.generation_path) and not os.path.exists(run.generation_path):
        shutil.copyfile(source.generation_path, run.generation_path)
    sentence_pooling.copy_pooling_files(source.path, run.path)


def _check_vocabulary(model: nn.Module, mixture_or_task_name: str) -> None:
    """The model's embedding must cover every id the task's vocabulary emits."""
    vocab_size = pipeline.task_vocabulary(mixture_or_task_name).vocab_size
    model_vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if model_vocab is not None and model_vocab < vocab_size:
        raise ValueError(
            f"model vocab_size {model_vocab} is smaller than the {vocab_size} ids of "
            f"{mixture_or_task_name!r}'s vocabulary; set {type(model.config).__name__}.vocab_size >= {vocab_size}"
        )


def _bytes(abstract_tree: Any) -> int:
    """The bytes of a tree of arrays (or ShapeDtypeStructs): what one checkpoint of it writes."""
    return sum(math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(abstract_tree))
