"""`ptmjax infer`: decode a text file's lines or a seqio task's split with a model folder, into JSONL; or, with
--embed and an encoder, embed them.

Each line of the output: {"inputs", "targets" (a task's, else absent), "prediction", "score"}; with
num_decodes > 1, prediction and score are lists, best first. With --embed: {"inputs", "embedding"}, pooled
as the folder says (a sentence-transformers folder's pooling, else the mean; LoadedEncoder.embed). The
output is written to a temporary file beside it and renamed at the end, so a failed run leaves any earlier
output as it was. Interrupted (Ctrl-C, SIGTERM), the records made are kept as out.partial.jsonl, which
`--resume` continues.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptmjax.inference import LoadedEncoder, LoadedModel, load
from ptmjax.storage.written_whole import file_written_whole
from ptmjax.tools.decode_flags import decode_config

PARTIAL = ".partial"


@dataclasses.dataclass(frozen=True)
class Example:
    """One input: its text, its ids when a task gave them (used as they are), and its target text if known."""

    inputs: str
    ids: tuple[int, ...] | None = None
    targets: str | None = None


def output_path(args: argparse.Namespace) -> str:
    """--output, else MODEL_DIR/inference/<task or input file stem>.jsonl; raises if it exists without --overwrite."""
    stem = args.task or ("stdin" if args.input_file == "-" else Path(args.input_file).stem)
    path = args.output or os.path.join(args.model_dir, "inference", f"{stem}.jsonl")
    if os.path.exists(path) and not args.overwrite:
        raise ValueError(f"{path} exists; pass --overwrite to replace it, or another --output")
    if os.path.exists(partial_path(path)) and not (args.resume or args.overwrite):
        raise ValueError(f"{partial_path(path)} holds the predictions of an interrupted run; pass --resume to "
                         "continue it, or --overwrite to start over")
    return path


def partial_path(path: str) -> str:
    """Where an interrupted run keeps the predictions it made: out.jsonl -> out.partial.jsonl."""
    root, extension = os.path.splitext(path)
    return f"{root}{PARTIAL}{extension}"


def resumed_records(path: str, examples: Sequence[Example]) -> list[dict[str, Any]]:
    """The records an interrupted run kept for `path`, checked to be those of the first `examples`."""
    partial = partial_path(path)
    if not os.path.isfile(partial):
        raise FileNotFoundError(f"--resume: there is no {partial} to continue; run without --resume")
    with open(partial) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if len(records) > len(examples) or any(r["inputs"] != e.inputs for r, e in zip(records, examples, strict=False)):
        raise ValueError(f"--resume: {partial} holds predictions of other inputs than these; pass the inputs it "
                         "was made from, or delete it and run without --resume")
    return records


def read_lines(input_file: str) -> list[Example]:
    """One example a line of `input_file` ('-': standard input); raises for an empty line or file. Invalid
    UTF-8 is replaced by U+FFFD with a warning naming the lines, as training does with its text files."""
    if input_file == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        data = stdin.read() if stdin is not None else sys.stdin.read().encode()
    else:
        with open(input_file, "rb") as f:
            data = f.read()
    lines, undecodable = [], []
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(raw.decode("utf-8", errors="replace"))
            undecodable.append(number)
    if undecodable:
        shown = ", ".join(map(str, undecodable[:10])) + (" ..." if len(undecodable) > 10 else "")
        warnings.warn(
            f"{'standard input' if input_file == '-' else input_file}: invalid UTF-8 on line(s) {shown}, "
            "replaced by U+FFFD; save the prompts as UTF-8 to keep them as written", stacklevel=2
        )
    if not lines:
        raise ValueError(f"{input_file} has no lines; write one prompt per line")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise ValueError(f"{input_file} line {number} is empty; write one prompt per line, with no blank lines")
    return [Example(line) for line in lines]


def task_examples(model: LoadedModel, task_name: str, split: str, max_examples: int | None,
                  lengths: dict[str, int] | None) -> list[Example]:
    """The examples of a registered seqio task's split, unshuffled: their ids, and texts decoded from them."""
    from ptmjax.data import pipeline

    lengths = lengths or model.task_feature_lengths
    if lengths is None:
        raise ValueError(
            f"no task feature lengths for {task_name!r}; pass --task_feature_lengths inputs=512,targets=128"
        )
    task = pipeline.get_task_or_mixture(task_name)
    dataset = task.get_dataset(dict(lengths), split=split, shuffle=False, num_epochs=1, seed=0)
    if max_examples is not None:
        dataset = dataset.take(max_examples)
    vocabulary = task.output_features["targets"].vocabulary
    examples = [
        Example(vocabulary.decode(e["inputs"].tolist()), tuple(e["inputs"].tolist()),
                vocabulary.decode(e["targets"].tolist()))
        for e in dataset.as_numpy_iterator()
    ]
    if not examples:
        raise ValueError(f"the {split!r} split of {task_name!r} has no examples")
    return examples


def record(example: Example, prediction: Any, several: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {"inputs": example.inputs}
    if example.targets is not None:
        fields["targets"] = example.targets
    fields["prediction"] = list(prediction.outputs) if several else prediction.outputs[0]
    fields["score"] = list(prediction.scores) if several else prediction.scores[0]
    return fields


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the block, as Ctrl-C does, so that it cleans up the same way."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def decoded(model: LoadedModel, examples: Sequence[Example], config: Any, args: argparse.Namespace
            ) -> Iterator[list[tuple[dict[str, Any], int]]]:
    """Per batch: each example's record and the tokens generated for it. Bad inputs are refused here, before
    the first batch is asked for."""
    if not examples:
        return iter(())
    inputs = [e.ids for e in examples] if examples[0].ids else [e.inputs for e in examples]
    batches = model.iter_predict(inputs, config, seed=args.seed, truncate=args.truncate_inputs)
    several = config.num_decodes > 1

    def records() -> Iterator[list[tuple[dict[str, Any], int]]]:
        start = 0
        for batch in batches:
            yield [(record(examples[start + i], prediction, several), sum(len(t) for t in prediction.tokens))
                   for i, prediction in enumerate(batch)]
            start += len(batch)

    return records()


def embedded(model: LoadedEncoder, examples: Sequence[Example], args: argparse.Namespace
             ) -> Iterator[list[tuple[dict[str, Any], int]]]:
    """Per batch: each example's record {"inputs", "embedding"} and the tokens it was read as. Bad inputs are
    refused here, before the first batch is asked for."""
    if not examples:
        return iter(())
    ids = model.tokenize([e.ids for e in examples] if examples[0].ids else [e.inputs for e in examples],
                         truncate=args.truncate_inputs)
    size = model.batch_size
    return ([({"inputs": e.inputs, "embedding": v.tolist()}, len(x))
             for e, v, x in zip(examples[start : start + size], model.embed(ids[start : start + size]),
                                ids[start : start + size], strict=True)]
            for start in range(0, len(examples), size))


def run(args: argparse.Namespace) -> int:
    """`ptmjax infer` (see ptmjax/cli.py's _add_infer_parser for the flags)."""
    from tqdm import tqdm

    if (args.task is None) == (args.input_file is None):
        raise ValueError("pass either --task NAME (with --split) or --input_file FILE ('-' for standard input)")
    path = output_path(args)
    examples = read_lines(args.input_file) if args.input_file else None
    model = load(args.model_dir, step=args.step, batch_size=args.batch_size, max_input_length=args.max_input_length)
    if args.embed != isinstance(model, LoadedEncoder):
        raise ValueError(f"{args.model_dir} holds a {type(model.module).__name__}: "
                         + ("--embed needs an encoder (BERT, RoBERTa, ALBERT, ELECTRA)" if args.embed else
                            "an encoder embeds texts rather than decoding them; pass --embed"))
    config = None if args.embed else decode_config(args)
    if examples is None:
        examples = task_examples(model, args.task, args.split, args.max_examples, args.task_feature_lengths)
    examples = examples[: args.max_examples]
    kept = resumed_records(path, examples) if args.resume else []
    todo = examples[len(kept):]
    batches = embedded(model, todo, args) if args.embed else decoded(model, todo, config, args)
    start, tokens, records = time.perf_counter(), 0, list(kept)
    try:
        with sigterm_as_interrupt(), file_written_whole(path, partial_path(path)) as f, \
                tqdm(total=len(examples), initial=len(kept), unit="ex", dynamic_ncols=True) as bar:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
            for batch in batches:
                for fields, count in batch:
                    f.write(json.dumps(fields, ensure_ascii=False) + "\n")
                    records.append(fields)
                    tokens += count
                f.flush()
                elapsed = time.perf_counter() - start
                bar.update(len(batch))
                bar.set_postfix(ex_s=f"{(len(records) - len(kept)) / elapsed:.1f}", tok_s=f"{tokens / elapsed:.0f}")
    except KeyboardInterrupt:
        print(f"ptmjax infer: interrupted after {len(records)} of {len(examples)} examples; kept their predictions "
              f"in {partial_path(path)}; rerun the same command with --resume to decode the other "
              f"{len(examples) - len(records)}", file=sys.stderr)
        return 130
    with contextlib.suppress(FileNotFoundError):
        os.remove(partial_path(path))
    made, elapsed = len(records) - len(kept), time.perf_counter() - start
    how = f"Embedded {made} examples" if args.embed else \
        f"Decoded {made} examples ({config.method}, max_decode_length={config.max_decode_length})"
    print(f"{how} in {elapsed:.1f} s: {made / elapsed:.1f} examples/s, {tokens / elapsed:.0f} tokens/s")
    if not args.embed:
        scores = [r["score"][0] if isinstance(r["score"], list) else r["score"] for r in records]
        print(f"  mean score: {sum(scores) / len(scores):.4f}" + (f" (with the {len(kept)} resumed)" if kept else ""))
    print(f"  {'embeddings' if args.embed else 'predictions'}: {os.path.abspath(path)}")
    return 0
