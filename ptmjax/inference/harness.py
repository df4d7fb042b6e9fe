"""lm-evaluation-harness over ptmjax models: `PtmjaxLM`, an `lm_eval` model registered as 'ptmjax' (importing
this module registers it), and `evaluate(model, tasks)`, which runs lm-eval's tasks on it (`ptmjax eval
--harness`). Needs the `harness` extra: `pip install -e ".[harness]"` (lm-eval without torch).

Requests become rows as lm-eval's Hugging Face backend (`lm_eval.models.huggingface.HFLM`) makes them, with the
model's own vocabulary and special tokens (the text a `LoadedModel` reads, inference/rows.py):

- `loglikelihood(context, continuation)` -> (log p(continuation | context), is_greedy). A causal model (GPT-2
  from Hugging Face) encodes context + continuation as one text and scores the ids after the context's, left-cut
  to max_length + 1 ids; an encoder-decoder (T5, BART), as HF's seq2seq backend, and a decoder-only model
  trained here (its prefix LM rows), read the context's ids with their special tokens as the inputs and score
  the continuation's ids alone, without EOS. An empty context is the BOS id (EOS where there is none).
- `loglikelihood_rolling(text)`: the sum over lm-eval's `get_rolling_token_windows` of max_length ids, each
  window's ids scored after its context, so every id is predicted once.
- `generate_until(context, gen_kwargs)`: cached decoding (greedy; sampling where gen_kwargs say do_sample) of at
  most max_gen_toks ids, cut before the first of the `until` strings.

Each kind of request is sorted longest first (lm-eval's `Collator`, as HFLM sorts), so a batch pads little and
compiles for few shapes, and comes back in the order asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ptmjax.decoding import DecodeConfig
from ptmjax.inference.loaded_model import DEFAULT_BATCH_SIZE, LoadedModel
from ptmjax.inference.loading import load
from ptmjax.inference.text import encode

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import Collator, normalize_gen_kwargs, postprocess_generated_text
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(f"ptmjax.inference.harness needs lm-evaluation-harness ({error}); install it with "
                              "pip install -e '.[harness]'", name=error.name) from None

MODEL_NAME = "ptmjax"
DEFAULT_MAX_LENGTH = 2048  # HFLM's, for a model whose positions and tokenizer set no limit
DEFAULT_MAX_GEN_TOKS = 256  # HFLM's
SAMPLING_KWARGS = {"temperature", "top_k", "top_p"}  # gen_kwargs that are DecodeConfig fields of the same name


@register_model(MODEL_NAME)
class PtmjaxLM(TemplateLM):
    """A ptmjax model (`ptmjax.load` of `model_dir`, or a `LoadedModel`) answering lm-eval's requests.

    batch_size: rows per model call; max_length: the most ids a row holds (default: the model's positions or
    input limit, else 2048); max_gen_toks: the most ids generated where a task's gen_kwargs set none.
    `device` and `max_batch_size` are lm-eval's flags for torch models, refused here.
    """

    def __init__(
        self, model_dir: str | None = None, *, model: LoadedModel | None = None, step: int | None = None,
        batch_size: int | str = DEFAULT_BATCH_SIZE, max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, device: str | None = None, max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if (model_dir is None) == (model is None):
            raise ValueError("pass one of model_dir (a folder ptmjax.load reads) or model (a LoadedModel)")
        if model is not None and step is not None:
            raise ValueError(f"step={step} is model_dir's checkpoint; a LoadedModel holds its own: drop step")
        if device is not None or max_batch_size is not None:
            raise ValueError(f"device={device!r}, max_batch_size={max_batch_size!r}: ptmjax puts the model on JAX's "
                             "devices (ptmjax.load's mesh) in batches of batch_size; drop these options")
        model = load(model_dir, step=step) if model is None else model
        if not isinstance(model, LoadedModel):
            raise ValueError(f"{model.source} is an encoder, which neither scores continuations nor generates; "
                             "evaluate a T5, BART or GPT-2 model")
        self.model = model
        self.backend = "causal" if model.row_format.causal else "seq2seq"
        self.batch_size = _batch_size(batch_size)
        self.max_length = max_length or _max_length(model)
        self.max_gen_toks = max_gen_toks

    @property
    def eot_token_id(self) -> int:
        return self.model.row_format.eos_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.model.row_format.bos_id
        return self.eot_token_id if bos is None else bos

    @property
    def tokenizer_name(self) -> str:
        return self.model.source

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The ids of `string`, with the model's special tokens unless `add_special_tokens` is False."""
        if add_special_tokens is False:
            return [int(i) for i in self.model.vocabulary.encode(string)]
        return encode(self.model.vocabulary, string, self.model.row_format.bos_id, self.model.row_format.add_eos)

    def _loglikelihood_tokens(
        self, requests: Sequence[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """(log p(continuation | context), is_greedy) of (cache key, context ids, continuation ids) requests."""
        from tqdm import tqdm

        collator = Collator(list(requests), sort_fn=lambda r: (-len(r[1]) - len(r[2]), tuple(r[1] + r[2])))
        results = []
        with tqdm(total=len(requests), disable=disable_tqdm, desc="loglikelihood requests") as progress:
            for chunk in collator.get_batched(n=self.batch_size):
                rows = [self._fitted_pair(context, continuation) for _, context, continuation in chunk]
                scores, greedy = self.model.score_and_greedy([c for c, _ in rows], [t for _, t in rows],
                                                             batch_size=self.batch_size)
                for (key, _, _), score, is_greedy in zip(chunk, scores, greedy, strict=True):
                    results.append((float(score), bool(is_greedy)))
                    if key is not None:
                        self.cache_hook.add_partial("loglikelihood", key, results[-1])
                progress.update(len(chunk))
        return collator.get_original(results)

    def _fitted_pair(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """(context, continuation) cut as HFLM cuts them: the context's first ids go where the row is too long."""
        if not self.model.decoder_only:
            return context[-self.max_length:], continuation[-self.max_length:]
        room = self.max_length + 1 if self.model.row_format.causal else self.max_length  # a causal row: one shorter
        if len(continuation) >= room:
            raise ValueError(f"a continuation of {len(continuation)} ids leaves no room for its context in "
                             f"max_length={self.max_length}; shorten it or raise max_length")
        return context[-(room - len(continuation)):], continuation

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """log p(text) of each request's text, scored in lm-eval's rolling windows of max_length ids."""
        # A prefix LM row holds context + continuation ids; a causal one (and a decoder's, T5's) one id fewer.
        window = self.max_length - (1 if self.model.decoder_only and not self.model.row_format.causal else 0)
        windows, owners = [], []
        for index, request in enumerate(requests):
            (text,) = request.args
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    self.tok_encode(text), self.prefix_token_id, window, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(index)
        totals = np.zeros(len(requests))
        np.add.at(totals, owners, [score for score, _ in self._loglikelihood_tokens(windows, disable_tqdm)])
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, float(total))
        return totals.tolist()

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's continuation of its context, decoded as its gen_kwargs say and cut at `until`."""
        from tqdm import tqdm

        collator = Collator([request.args for request in requests], group_by="gen_kwargs", group_fn=lambda a: a[1],
                            sort_fn=lambda a: (-len(self.tok_encode(a[0])), a[0]))
        results = []
        with tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until requests") as progress:
            for chunk in collator.get_batched(n=self.batch_size):
                contexts, gen_kwargs = [c for c, _ in chunk], chunk[0][1]
                config, until = self._decode_config(gen_kwargs)
                room = self.max_length - config.max_decode_length if self.model.decoder_only else self.max_length
                if room < 1:
                    raise ValueError(f"max_gen_toks={config.max_decode_length} leaves no room for a prompt in "
                                     f"max_length={self.max_length}; lower it")
                ids = [self.tok_encode(context)[-room:] for context in contexts]
                for context, text in zip(contexts, self.model.generate(ids, config, batch_size=self.batch_size),
                                         strict=True):
                    results.append(postprocess_generated_text(text, until, None))
                    self.cache_hook.add_partial("generate_until", (context, gen_kwargs), results[-1])
                progress.update(len(chunk))
        return collator.get_original(results)

    def _decode_config(self, gen_kwargs: dict[str, Any]) -> tuple[DecodeConfig, list[str]]:
        """(the DecodeConfig of a task's gen_kwargs, its stop strings): greedy, or sampling with do_sample."""
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        until, max_gen_toks, do_sample = kwargs.pop("until"), kwargs.pop("max_gen_toks"), kwargs.pop("do_sample")
        unknown = sorted(set(kwargs) - SAMPLING_KWARGS)
        if unknown:
            raise ValueError(f"gen_kwargs {unknown} have no ptmjax decoding option; a task may set until, "
                             f"max_gen_toks, do_sample and {', '.join(sorted(SAMPLING_KWARGS))}")
        if not do_sample:
            return self.model.decode_config(method="greedy", max_decode_length=max_gen_toks), until
        return self.model.decode_config(method="sample", max_decode_length=max_gen_toks, **kwargs), until


def evaluate(
    model: str | LoadedModel, tasks: Sequence[str], *, include_path: str | None = None, limit: int | None = None,
    num_fewshot: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE, step: int | None = None,
    **simple_evaluate_kwargs: Any,
) -> dict[str, Any]:
    """lm-eval's results (`lm_eval.simple_evaluate`: 'results', 'configs', 'versions', ...) of `model` (a folder
    `ptmjax.load` reads, at checkpoint `step`, or a LoadedModel) on `tasks`: lm-eval's own, or those of the YAML
    files under `include_path`; `limit`: the first N documents of each task. `lm_eval.utils.make_table` of the
    results is the table `ptmjax eval --harness` prints."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm = PtmjaxLM(**{"model_dir" if isinstance(model, str) else "model": model}, step=step, batch_size=batch_size)
    # lm-eval's own thousands of task files take seconds to index: only where include_path lacks a task
    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or not set(tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        where = f"lm-eval's tasks or {include_path}'s YAML files" if include_path else "lm-eval's tasks"
        raise ValueError(f"unknown harness tasks {unknown}: not among {where}; pass --include_path DIR for your own")
    return simple_evaluate(lm, tasks=list(tasks), limit=limit, num_fewshot=num_fewshot, task_manager=manager,
                           **simple_evaluate_kwargs)


def _batch_size(batch_size: int | str) -> int:
    """lm-eval passes its --batch_size as text; 'auto' sizes are torch's and refused."""
    try:
        size = int(batch_size)
    except ValueError:
        raise ValueError(f"batch_size={batch_size!r}: pass a positive int (ptmjax has no automatic batch size)") \
            from None
    if size < 1:
        raise ValueError(f"batch_size={batch_size!r}: pass a positive int")
    return size


def _max_length(model: LoadedModel) -> int:
    """The most ids a row may hold: the least of the model's positions and its input limit, else HFLM's 2048."""
    known = [n for n in (getattr(model.config, "max_length", None), model.max_input_length) if n is not None]
    return min(known) if known else DEFAULT_MAX_LENGTH
