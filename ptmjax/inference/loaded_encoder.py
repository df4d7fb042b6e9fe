"""`LoadedEncoder`: an encoder (BERT, RoBERTa, ALBERT, ELECTRA, or a task model over one) with its parameters on
a mesh, giving the hidden states, pooled embeddings and masked-token predictions of texts (`ptmjax.load` makes
one for a folder of such a model).

Texts are encoded as the model's tokenizer encodes one text: a Hugging Face tokenizer with the special tokens
of its post-processor (`[CLS] text [SEP]`, `<s> text </s>`), another vocabulary (a model trained here) with EOS
after the text, as ptmjax's tasks build rows; token id lists are used as they are. Rows are right-padded with
the model's pad id, their length rounded up to a power of two so that few shapes compile, in batches of
`batch_size`; each text's results are its own positions only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import seqio
from flax import linen as nn
from jax.sharding import Mesh

from ptmjax import partitioning
from ptmjax.adapt.probing.layer_features import padded_batch
from ptmjax.data.fixed_batches import bucket_length, fixed_batches, round_up
from ptmjax.data.sentence_pooling import SentencePooling
from ptmjax.inference.loaded_base import Loaded
from ptmjax.inference.loaded_model import DEFAULT_BATCH_SIZE
from ptmjax.inference.text import Inputs, check_texts, fit_to_limit

POOLINGS = ("mean", "cls", "max")  # sentence-transformers' pooling modes


@dataclasses.dataclass(eq=False, repr=False)
class LoadedEncoder(Loaded):
    """An encoder ready to embed texts (fields as LoadedModel's; the encoder has no generation ids)."""

    module: nn.Module
    params: Any
    vocabulary: seqio.Vocabulary
    mesh: Mesh
    rules: partitioning.Rules
    source: str
    batch_size: int = DEFAULT_BATCH_SIZE
    task_name: str | None = None
    task_feature_lengths: Mapping[str, int] | None = None
    max_input_length: int | None = None
    max_input_length_source: str = "max_input_length"
    sentence_pooling: SentencePooling = SentencePooling()
    _jitted: dict[str, Callable[..., jax.Array]] = dataclasses.field(default_factory=dict, repr=False)

    def tokenize(self, texts: Inputs, *, truncate: bool = False) -> list[list[int]]:
        """Each text's ids with the tokenizer's special tokens (see the module doc), within the input limit: a
        longer input is refused, or with `truncate` cut as transformers cuts it (special tokens kept)."""
        limits = [(self.max_input_length, self.max_input_length_source),
                  (self.config.max_sequence_length, f"{type(self.module).__name__}'s positions")]
        limit, why = min((limit, why) for limit, why in limits if limit is not None)
        if not isinstance(texts, str) and len(texts) and not isinstance(texts[0], str):
            return fit_to_limit([[int(i) for i in x] for x in texts], limit, why, truncate)
        texts = check_texts(texts)
        template = getattr(self.vocabulary, "encode_with_template", None)
        if template is None:
            eos = [self.vocabulary.eos_id]
            return fit_to_limit([[int(i) for i in self.vocabulary.encode(t)] + eos for t in texts], limit, why,
                                truncate)
        ids = [template(t) for t in texts]
        fit_to_limit(ids, limit, why, truncate)  # refuses, or warns of the cut
        return [x if len(x) <= limit else template(t, limit) for t, x in zip(texts, ids, strict=True)]

    def hidden_states(self, texts: Inputs, *, truncate: bool = False) -> list[np.ndarray]:
        """float32 [length, d_model] per text: the encoder's last hidden states at the text's positions."""
        ids = self.tokenize(texts, truncate=truncate)
        states = self._run("hidden", ids)
        return [row[: len(x)] for row, x in zip(states, ids, strict=True)]

    def embed(self, texts: Inputs, *, pooling: str | None = None, normalize: bool | None = None,
              truncate: bool = False) -> np.ndarray:
        """float32 [n, d_model]: each text's hidden states pooled ('mean' over its tokens, special ones
        included, as sentence-transformers; 'cls': the first; 'max'), L2-normalised if `normalize`; None: as a
        sentence-transformers folder says (`sentence_pooling`), else 'mean', not normalised."""
        pooling = self.sentence_pooling.pooling if pooling is None else pooling
        normalize = self.sentence_pooling.normalize if normalize is None else normalize
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is unknown; use one of {', '.join(POOLINGS)}")
        pool = {"mean": lambda h: h.mean(0), "cls": lambda h: h[0], "max": lambda h: h.max(0)}[pooling]
        pooled = np.stack([pool(h) for h in self.hidden_states(texts, truncate=truncate)])
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True) if normalize else pooled

    def fill_mask(self, texts: Inputs, *, top_k: int = 5) -> list[list[list[tuple[str, float]]]]:
        """For each text, for each of its mask tokens in order: the `top_k` likeliest (token, probability)."""
        mask_id = getattr(self.vocabulary, "mask_id", None)
        if mask_id is None or self.api.family.cloze_logits is None:
            raise ValueError(f"{type(self.module).__name__} with {self.vocabulary} has no masked-LM head and mask "
                             "token; fill_mask needs a masked LM imported from Hugging Face (BERT, RoBERTa, ALBERT)")
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        ids = self.tokenize(texts)
        blanks = [[i for i, token in enumerate(x) if token == mask_id] for x in ids]
        for text, found in zip(texts, blanks, strict=True):
            if not found:
                raise ValueError(f"{text!r:.60} holds no mask token (id {mask_id}); put one where a word is to be "
                                 "predicted")
        rows = [x for x, found in zip(ids, blanks, strict=True) for _ in found]
        logits = self._run("cloze", rows, np.asarray([i for found in blanks for i in found], np.int32))
        probabilities = np.asarray(jax.nn.softmax(logits, axis=-1))
        best = np.argsort(-probabilities, axis=-1)[:, :top_k]
        answers = [[(self.vocabulary.decode([int(t)]), float(p[t])) for t in row] for p, row in zip(
            probabilities, best, strict=True)]
        out, start = [], 0
        for found in blanks:
            out.append(answers[start : start + len(found)])
            start += len(found)
        return out

    def _run(self, what: str, ids: list[list[int]], blanks: np.ndarray | None = None) -> np.ndarray:
        """The jitted `what` ('hidden' states [n, length, d] or 'cloze' logits [n, vocab]) of padded rows."""
        stack = self.api.family.probed_stack(self.module)
        tokens, _ = padded_batch(ids, bucket_length(max(map(len, ids))), stack.pad_id)
        rows = {"tokens": tokens} if blanks is None else {"tokens": tokens, "blanks": blanks}
        size = round_up(min(self.batch_size, len(ids)), partitioning.data_parallel_size(self.mesh))
        function = self._function(what)
        with jax.set_mesh(self.mesh):
            outputs = [np.asarray(jax.device_get(function(self.params, batch)))[:real]
                       for batch, real in fixed_batches(rows, size)]
        return np.concatenate(outputs)

    def _function(self, what: str) -> Callable[..., jax.Array]:
        if what not in self._jitted:
            module, stack, family, rules = self.module, self.api.family.probed_stack(self.module), self.api.family, \
                self.rules

            def run(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
                with nn.logical_axis_rules(rules):
                    if what == "cloze":
                        mask_id = int(self.vocabulary.mask_id)
                        return family.cloze_logits(module, params, batch["tokens"], batch["blanks"], mask_id)
                    hidden = module.apply({"params": params}, **{stack.tokens_field: batch["tokens"]},
                                          method=stack.method)
                    return hidden.astype(jnp.float32)

            with jax.set_mesh(self.mesh):
                shardings = partitioning.logical_shardings(self.api.boxed_abstract_params, self.mesh, rules)
            rows = partitioning.batch_sharding(self.mesh)
            self._jitted[what] = jax.jit(run, in_shardings=(shardings, rows), out_shardings=rows)
        return self._jitted[what]

    def summary(self) -> dict[str, str]:
        """What `_repr_html_` shows: model, parameters, vocabulary, mesh, source."""
        return {
            "model": f"{type(self.module).__name__} ({type(self.config).__name__}, {self.api.family.kind.value})",
            "parameters": f"{self.num_params:,}",
            "vocabulary": f"{type(self.vocabulary).__name__}, {self.vocabulary.vocab_size:,} ids",
            "mesh": self.mesh_summary(),
            "source": self.source,
        }
