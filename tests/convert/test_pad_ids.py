"""Models whose padding id is not 0 (Hugging Face BART and mBART: 1; RoBERTa: 1) read rows that seqio's feature
converters pad with 0: those trailing zeros are padding, not `<s>`. The reference is transformers on each text
alone (no padding at all), against ptmjax on batches of unequal lengths."""

import numpy as np
import pytest
from hf_folders import SMALL_BART, byte_level_bpe, saved

import ptmjax

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ["Return the sum of a and b, or raise ValueError when either is negative.", "Open a file.", "The"]
TARGETS = ["the sum", "a file object that reads text", "x"]


@pytest.fixture(scope="module", params=["bart", "mbart"])
def bart_dir(request, tmp_path_factory):
    """A tiny random BART (post-LN) or mBART (pre-LN) with a byte-level BPE, weights scaled up so that greedy
    choices are far from ties."""
    path = tmp_path_factory.mktemp(request.param)
    tokenizer = byte_level_bpe(transformers.BartTokenizer, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    transformers.set_seed(0)
    config = transformers.BartConfig(vocab_size=len(tokenizer), **SMALL_BART)
    if request.param == "mbart":
        # mBART checkpoints set the decoder start (MBartConfig leaves it unset)
        config = transformers.MBartConfig(vocab_size=len(tokenizer), decoder_start_token_id=2, **SMALL_BART)
    model = (transformers.MBartForConditionalGeneration if request.param == "mbart"
             else transformers.BartForConditionalGeneration)(config)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.ndim > 1:
                weight.mul_(4)
    saved(path, tokenizer, model)
    return path


def test_scores_of_unequal_inputs_equal_transformers_on_each_alone(bart_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(bart_dir)
    reference = transformers.AutoModelForSeq2SeqLM.from_pretrained(bart_dir).eval()
    want = []
    with torch.no_grad():
        for prompt, target in zip(PROMPTS, TARGETS, strict=True):
            labels = torch.tensor([tokenizer(target)["input_ids"]])
            logits = reference(input_ids=torch.tensor([tokenizer(prompt)["input_ids"]]), labels=labels).logits
            log_probs = torch.log_softmax(logits[0].double(), -1)
            want.append(float(log_probs[torch.arange(labels.shape[1]), labels[0]].sum()))
    np.testing.assert_allclose(ptmjax.load(str(bart_dir)).score(PROMPTS, TARGETS), want, rtol=1e-4)


def test_greedy_decodes_of_unequal_inputs_equal_generate_on_each_alone(bart_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(bart_dir)
    reference = transformers.AutoModelForSeq2SeqLM.from_pretrained(bart_dir).eval()
    got = ptmjax.load(str(bart_dir)).predict(PROMPTS, max_decode_length=8)
    for prompt, prediction in zip(PROMPTS, got, strict=True):
        output = reference.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=8, num_beams=1,
                                    do_sample=False)[0, 1:].tolist()
        assert list(prediction.tokens[0]) == output[: len(prediction.tokens[0])], prompt


def test_beam_search_of_a_hugging_face_folder_equals_generate_with_its_defaults(bart_dir):
    """Only the beam width and length given: the length penalty (transformers' length ** 1.0), the stopping
    heuristic and the forced EOS come from the folder, as generate takes them."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(bart_dir)
    reference = transformers.AutoModelForSeq2SeqLM.from_pretrained(bart_dir).eval()
    got = ptmjax.load(str(bart_dir)).predict(PROMPTS, method="beam", num_beams=3, max_decode_length=8)
    for prompt, prediction in zip(PROMPTS, got, strict=True):
        output = reference.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=8, num_beams=3,
                                    output_scores=True, return_dict_in_generate=True)
        tokens = output.sequences[0, 1:].tolist()
        assert list(prediction.tokens[0]) == tokens[: len(prediction.tokens[0])], prompt
        np.testing.assert_allclose(prediction.scores[0], float(output.sequences_scores[0]), atol=1e-4)
