"""lm-evaluation-harness over ptmjax (`ptmjax.inference.harness`): a random GPT-2 (causal, Hugging Face's rows)
and a random T5 (lm-eval's seq2seq rows) folder, local YAML tasks over a JSONL of the embedded module-classification
rows, checked against ptmjax's own scoring, rank classification and greedy decoding, and float64 NumPy."""

import json

import jax
import numpy as np
import pytest

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the harness extra: pip install -e '.[harness]'")
pytest.importorskip("transformers", reason="the tiny Hugging Face folders need transformers: pip install -e '.[hf]'")

from hf_folders import byte_level_bpe, save_sentencepiece_tokenizer  # noqa: E402

import ptmjax  # noqa: E402
from ptmjax import partitioning  # noqa: E402
from ptmjax.decoding import GenerationIds  # noqa: E402
from ptmjax.evaluation import rank_classification  # noqa: E402
from ptmjax.families.model_api import model_api  # noqa: E402
from ptmjax.inference import harness  # noqa: E402
from ptmjax.tasks import module_classification  # noqa: E402

CHOICE_TASK, GENERATION_TASK = "ptmjax_test_module_choice", "ptmjax_test_module_generation"
MAX_GEN_TOKS, UNTIL = 6, "e"  # a stop string the random models write often, so the cut is tested
POSITIONS = 64  # the GPT-2's context window


def save_random(path, module, ids: GenerationIds, seed: int) -> None:
    """`module` with random weights (scaled 3x: peaked distributions, no near-ties) as a Hugging Face folder."""
    from flax import linen as nn

    from ptmjax.convert import hf

    params = nn.unbox(model_api(module).init(jax.random.key(seed)))
    hf.save(module, jax.tree.map(lambda x: np.asarray(x) * 3.0, params), str(path), ids)


def save_gpt2(path) -> None:
    import transformers

    from ptmjax.convert import hf_gpt2
    from ptmjax.models import GPT2

    tokenizer = byte_level_bpe(transformers.GPT2Tokenizer, ["<|endoftext|>"], pad_token="<|endoftext|>")
    tokenizer.save_pretrained(path)
    eos = tokenizer.eos_token_id
    config = hf_gpt2.from_hf_config(transformers.GPT2Config(
        vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=POSITIONS, bos_token_id=eos,
        eos_token_id=eos, pad_token_id=eos))
    save_random(path, GPT2(config), GenerationIds(eos_token_id=eos, pad_token_id=eos), seed=0)


def save_t5(path) -> None:
    import transformers
    from hf_folders import SMALL_T5

    from ptmjax.convert import hf_t5
    from ptmjax.models import EncoderDecoder

    vocabulary = save_sentencepiece_tokenizer(path)
    config = hf_t5.from_hf_config(transformers.T5Config(vocab_size=vocabulary.vocab_size, **SMALL_T5))
    save_random(path, EncoderDecoder(config), GenerationIds(eos_token_id=1, pad_token_id=0, decoder_start_token_id=0),
                seed=1)


@pytest.fixture(scope="module", params=["gpt2", "t5"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    (save_gpt2 if request.param == "gpt2" else save_t5)(path)
    return path


@pytest.fixture(scope="module")
def model(folder):
    """On one device (compiles fastest); `ptmjax eval` loads the folder on the default mesh of all."""
    return ptmjax.load(str(folder), mesh=partitioning.make_mesh(partitioning.MeshConfig(data=1), jax.devices()[:1]))


def module_rows() -> list[tuple[str, int]]:
    """Two validation docstrings of each of the 12 modules, cut to their first 6 words, with the module's index."""
    labels = module_classification.module_labels()
    examples = module_classification.module_classification_examples("validation")[::4]
    return [(" ".join(text.split()[:6]), labels.index(module)) for text, module in examples]


def write_task(folder, name: str, rows: list[dict], config: dict) -> None:
    """A YAML task `name` over `rows` as a local JSONL file (read by the `datasets` json builder, cached beside)."""
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    task = {"task": name, "dataset_path": "json", "validation_split": "validation",
            "dataset_kwargs": {"data_files": {"validation": str(folder / f"{name}.jsonl")},
                               "cache_dir": str(folder / "datasets")},
            "doc_to_text": "{{text}}", **config}
    (folder / f"{name}.yaml").write_text(json.dumps(task, indent=1))  # JSON is YAML


def write_choice_task(folder, rows: list[tuple[str, int]]) -> None:
    """CHOICE_TASK: which of the 12 module names follows each text, by lm-eval's `acc`."""
    write_task(folder, CHOICE_TASK, [{"text": text, "label": label} for text, label in rows],
               {"output_type": "multiple_choice", "doc_to_target": "label",
                "doc_to_choice": list(module_classification.module_labels()), "metric_list": [{"metric": "acc"}]})


def context_and_choice_ids(model, text: str, choice: str) -> tuple[list[int], list[int]]:
    """The ids lm-eval's Hugging Face backend scores for (text, ' ' + choice), from the vocabulary alone: a causal
    model's continuation is what encoding the whole text adds to the context's ids; a seq2seq model's context has
    its EOS, the continuation is encoded alone."""
    vocabulary = model.vocabulary
    if model.row_format.causal:
        context = [int(i) for i in vocabulary.encode(text)]
        return context, [int(i) for i in vocabulary.encode(f"{text} {choice}")][len(context):]
    return [*map(int, vocabulary.encode(text)), vocabulary.eos_id], [int(i) for i in vocabulary.encode(f" {choice}")]


@pytest.mark.slow
def test_multiple_choice_accuracy_equals_rank_classification(model, tmp_path):
    """Each request's log-likelihood is `LoadedModel.score` of its ids, and `acc` the rank classification accuracy.
    A random model ranks the module names by length, not text: every other row's gold label is the model's own
    choice, so the accuracy is neither 0 nor 1 and tests that lm-eval ranks the same scores."""
    labels, rows = module_classification.module_labels(), module_rows()
    pairs = [[context_and_choice_ids(model, text, choice) for choice in labels] for text, _ in rows]
    flat = [pair for row in pairs for pair in row]
    scores = model.score([c for c, _ in flat], [y for _, y in flat], batch_size=32).reshape(len(rows), len(labels))
    gold = np.array([scores[i].argmax() if i % 2 == 0 else label for i, (_, label) in enumerate(rows)])
    write_choice_task(tmp_path, [(text, int(label)) for (text, _), label in zip(rows, gold, strict=True)])
    results = harness.evaluate(model, [CHOICE_TASK], include_path=str(tmp_path), batch_size=16, bootstrap_iters=0)
    samples = sorted(results["samples"][CHOICE_TASK], key=lambda s: s["doc_id"])
    got = np.array([[resp[0][0] for resp in sample["resps"]] for sample in samples])
    np.testing.assert_allclose(got, scores, rtol=1e-5, atol=1e-5)  # float32 sums of ~100 (3x weights): relative
    assert np.ptp(scores, axis=1).min() > 0.1  # the choices really differ, so the ranking is tested
    ranked = float(np.mean(scores.argmax(axis=1) == gold))
    assert 0.5 <= ranked < 1
    assert results["results"][CHOICE_TASK]["acc,none"] == pytest.approx(ranked, abs=1e-12)
    if not model.decoder_only:  # rank classification's own rows (seqio's converter), candidates without EOS
        contexts, choices = [row[0][0] for row in pairs], [choice for _, choice in pairs[0]]
        candidates = np.zeros((len(labels), max(map(len, choices))), np.int32)
        for j, choice in enumerate(choices):
            candidates[j, : len(choice)] = choice
        lengths = {"inputs": max(map(len, contexts)), "targets": candidates.shape[1]}
        own = rank_classification.candidate_log_likelihoods(
            model.module, jax.device_get(model.params), contexts, candidates, lengths)
        np.testing.assert_allclose(own, scores, rtol=1e-4)  # other padding: float32 sums of ~100 agree to ~5e-5
        assert float(np.mean(own.argmax(axis=1) == gold)) == ranked


@pytest.mark.slow
def test_generation_exact_match_equals_greedy_decodes(model, tmp_path):
    """Half the targets are ptmjax's own greedy decodes cut at UNTIL, half the module names: exact_match is the
    share of the decodes that equal their target, and every prediction is a decode."""
    labels, rows = module_classification.module_labels(), module_rows()
    generated = model.generate([text for text, _ in rows], max_decode_length=MAX_GEN_TOKS)
    decodes = [text.split(UNTIL)[0] for text in generated]
    targets = [decode if i % 2 == 0 else labels[label] for i, (decode, (_, label)) in
               enumerate(zip(decodes, rows, strict=True))]
    write_task(tmp_path, GENERATION_TASK, [{"text": text, "target": t} for (text, _), t in
                                           zip(rows, targets, strict=True)],
               {"output_type": "generate_until", "doc_to_target": "{{target}}", "target_delimiter": "",
                "generation_kwargs": {"until": [UNTIL], "max_gen_toks": MAX_GEN_TOKS, "do_sample": False},
                "metric_list": [{"metric": "exact_match"}]})
    results = harness.evaluate(model, [GENERATION_TASK], include_path=str(tmp_path), batch_size=16,
                               bootstrap_iters=0)
    samples = sorted(results["samples"][GENERATION_TASK], key=lambda s: s["doc_id"])
    assert [sample["filtered_resps"][0] for sample in samples] == decodes
    want = np.mean([decode == target for decode, target in zip(decodes, targets, strict=True)])
    assert results["results"][GENERATION_TASK]["exact_match,none"] == pytest.approx(want, abs=1e-12)
    assert 0.5 <= want < 1  # the even rows match, the module names (almost surely) not
    assert sum(map(bool, decodes)) > len(decodes) // 2 and any(UNTIL in text for text in generated)  # cut at UNTIL


def test_is_greedy_exactly_where_the_continuation_is_the_greedy_decode(model):
    lm = harness.PtmjaxLM(model=model, batch_size=8)
    contexts = [lm.tok_encode(text) for text, _ in module_rows()[:8]]
    decodes = [list(p.tokens[0]) for p in model.predict(contexts, max_decode_length=4)]
    greedy = [(None, context, decode) for context, decode in zip(contexts, decodes, strict=True) if len(decode) > 1]
    other = [(None, context, [*decode[:-1], (decode[-1] + 1) % model.vocabulary.vocab_size])
             for _, context, decode in greedy]
    assert len(greedy) > 4
    got = lm._loglikelihood_tokens(greedy + other, disable_tqdm=True)
    assert [is_greedy for _, is_greedy in got] == [True] * len(greedy) + [False] * len(other)


def log_softmax64(logits) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def windowed_log_likelihood(model, ids: list[int], prefix: int, window: int) -> float:
    """float64 sum of log p(id) over `ids`, each predicted once, in blocks of `window` ids: GPT-2 reads the (at most)
    `window` ids before a block's end (the first block after `prefix`); T5 encodes the ids before the block (at most
    window + 1 - its length) and decodes the block."""
    stream, params, total = [prefix, *ids], {"params": jax.device_get(model.params)}, 0.0
    for start in range(0, len(ids), window):
        end = min(start + window, len(ids))
        first = max(0, end - window)  # stream[k] is the id before ids[k]
        if model.decoder_only:
            log_probs = log_softmax64(model.module.apply(params, np.array([stream[first:end]])))[0, start - first:]
        else:
            decoder = np.array([[0, *ids[start:end - 1]]])
            log_probs = log_softmax64(model.module.apply(params, np.array([stream[first:start + 1]]), decoder))[0]
        total += sum(log_probs[i, token] for i, token in enumerate(ids[start:end]))
    return total


@pytest.mark.slow
def test_rolling_log_likelihood_of_a_text_longer_than_the_window(model):
    from lm_eval.api.instance import Instance

    examples = module_classification.module_classification_examples("validation")[:8]
    text = " ".join(" ".join(text for text, _ in examples).split()[:100])
    window = POSITIONS if model.decoder_only else 16  # GPT-2's positions; T5's (relative positions) as asked
    lm = harness.PtmjaxLM(model=model, batch_size=4, max_length=None if model.decoder_only else window)
    ids = lm.tok_encode(text)
    assert len(ids) > 2 * window and lm.max_length == window
    requests = [Instance("loglikelihood_rolling", {}, (text,), 0), Instance("loglikelihood_rolling", {}, ("Ok.",), 1)]
    got = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    want = [windowed_log_likelihood(model, ids, lm.prefix_token_id, window),
            windowed_log_likelihood(model, lm.tok_encode("Ok."), lm.prefix_token_id, window)]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_ptmjax_eval_harness_writes_its_results_into_the_folder_and_never_over_them(folder, tmp_path, capsys):
    from ptmjax import cli

    write_choice_task(tmp_path, module_rows())
    argv = ["eval", "--model_dir", str(folder), "--harness", CHOICE_TASK, "--include_path", str(tmp_path),
            "--limit", "6", "--batch_size", "8"]
    assert cli.main(argv) == 0
    assert CHOICE_TASK in capsys.readouterr().out
    written = json.loads((folder / "eval" / f"harness_{CHOICE_TASK}.json").read_text())
    assert written["model_dir"] == str(folder) and written["n-samples"][CHOICE_TASK]["effective"] == 6
    assert written["results"][CHOICE_TASK]["acc,none"] * 6 in range(7)
    assert cli.main(argv) == 1
    assert "exists; pass --overwrite to replace it" in capsys.readouterr().err
