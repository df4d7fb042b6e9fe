"""`ptmjax probe`: linear probes per layer, attention statistics and cloze probing of a model folder.

Writes to --out (default MODEL_DIR/probe/):
- layer_probe.json / .csv / .png: validation accuracy of a logistic-regression probe per layer (0 =
  embeddings) on mean-pooled features of --task, with the majority-class accuracy;
- scalar_mix.json: ELMo's scalar mix of all those layers with a linear classifier, trained on the same
  features: its softmax-normalised weights, gamma and accuracies;
- (models with attention) attention_statistics.json / .npz / .png: entropy, max weight, weight on the first token and on
  EOS / [SEP] per layer and head, over the non-padding queries of the first --attention_examples
  validation texts;
- attention_maps.npz (attention [n, layers, heads, s, s], tokens, valid of the first
  --attention_maps examples) and attention_example.png (the first one's maps);
- cloze.json (masked LMs and T5): precision at 1 and 10 on the embedded cloze QA questions whose
  answer is a single token, with each question's answer and top prediction.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import numpy as np

from ptmjax.adapt.probing import cloze_probe, linear_probe, plots
from ptmjax.adapt.probing.attention_statistics import AttentionStatistics
from ptmjax.adapt.probing.layer_features import LayerReader
from ptmjax.adapt.probing.mix_training import mix_probe
from ptmjax.adapt.probing.model_folder import FrozenModel, read_model_folder
from ptmjax.adapt.probing.text_rows import TextRows, batches


def sequence_length(model: FrozenModel, max_length: int) -> int:
    """--max_length, within the model's position table where it has one."""
    config = model.module.config
    limit = getattr(config, "max_sequence_length", None) or getattr(config, "max_length", None)
    return max_length if limit is None else min(max_length, limit)


def run_layer_probes(reader: LayerReader, text_rows: TextRows, args: argparse.Namespace, length: int) -> None:
    features, labels = linear_probe.task_features(reader, text_rows.encode, args.task, length, args.batch_size)
    rows = linear_probe.probe_layers(features["train"], labels["train"], features["validation"], labels["validation"])
    chance = linear_probe.majority_accuracy(labels["train"], labels["validation"])
    summary = {"task": args.task, "majority_class_accuracy": chance}
    linear_probe.write_table(rows, summary, *(os.path.join(args.out, f"layer_probe.{ext}") for ext in ("json", "csv")))
    plots.plot_probe_accuracy([r.layer for r in rows], [r.accuracy for r in rows], chance,
                              os.path.join(args.out, "layer_probe.png"))
    print(f"Linear probes on {args.task} (train -> validation; majority class {chance:.2f}%):")
    print(linear_probe.format_table(rows))
    mix = mix_probe(features["train"], labels["train"], features["validation"], labels["validation"])
    with open(os.path.join(args.out, "scalar_mix.json"), "w") as f:
        json.dump({"task": args.task, **dataclasses.asdict(mix)}, f, indent=2)
    print(f"Scalar mix of all {len(mix.weights)} layers: validation accuracy {mix.accuracy:.2f}% (train "
          f"{mix.train_accuracy:.2f}%); weights {', '.join(f'{w:.3f}' for w in mix.weights)}, gamma {mix.gamma:.3f}")


def run_attention(reader: LayerReader, text_rows: TextRows, args: argparse.Namespace, length: int) -> None:
    texts = [text for text, _ in linear_probe.labelled_texts(args.task, "validation")[: args.attention_examples]]
    rows = [text_rows.encode(text) for text in texts]
    statistics, maps = AttentionStatistics(), []
    eos = text_rows.vocabulary.eos_id
    special_ids = np.array(sorted({*text_rows.suffix, *(() if eos is None else (eos,))}), np.int64)
    for batch in batches(rows, length, reader.stack.pad_id, args.batch_size):
        attention = reader(batch.tokens).attention[:, : batch.size]
        tokens, valid = batch.tokens[: batch.size], batch.valid[: batch.size]
        statistics.add(attention, valid, np.isin(tokens, special_ids))
        maps.append((np.moveaxis(attention, 0, 1), tokens, valid))
    means = statistics.means()
    np.savez(os.path.join(args.out, "attention_statistics.npz"), **means)
    with open(os.path.join(args.out, "attention_statistics.json"), "w") as f:
        json.dump({"examples": len(rows), "queries": statistics.queries, "special_ids": special_ids.tolist(),
                   **{name: values.tolist() for name, values in means.items()}}, f, indent=2)
    plots.plot_attention_statistics(means, os.path.join(args.out, "attention_statistics.png"))
    attention, tokens, valid = (np.concatenate(parts)[: args.attention_maps] for parts in zip(*maps, strict=True))
    np.savez(os.path.join(args.out, "attention_maps.npz"), attention=attention, tokens=tokens, valid=valid)
    n = int(valid[0].sum())
    labels = [text_rows.vocabulary.decode([int(i)]) or f"<{int(i)}>" for i in tokens[0, :n]]
    plots.plot_attention_maps(attention[0][:, :, :n, :n], labels, os.path.join(args.out, "attention_example.png"))
    print(f"Attention statistics over {statistics.queries} queries of {len(rows)} validation texts "
          "(mean over heads, by layer):")
    print("layer  " + "  ".join(f"{name:>17s}" for name in means))
    for layer in range(next(iter(means.values())).shape[0]):
        print(f"{layer + 1:5d}  " + "  ".join(f"{values[layer].mean():17.4f}" for values in means.values()))


def run_cloze(model: FrozenModel, pad_id: int, text_rows: TextRows, args: argparse.Namespace, length: int) -> None:
    if not cloze_probe.supports_cloze(model.module):
        print(f"Cloze probing: skipped ({type(model.module).__name__} is neither a masked LM nor T5).")
        return
    clozes = cloze_probe.cloze_set(cloze_probe.qa_clozes(args.cloze_split), text_rows, max_length=length)
    ranker = cloze_probe.ClozeRanker(model.module, model.params, text_rows.mask_id, pad_id)
    logits = ranker.logits(clozes, args.batch_size)
    predictions = [text_rows.vocabulary.decode([int(i)]) for i in logits.argmax(-1)]
    result = {
        "split": args.cloze_split, "questions": clozes.total, "kept": len(clozes.rows),
        "precision_at_1": cloze_probe.precision_at_k(logits, clozes.answers, 1),
        "precision_at_10": cloze_probe.precision_at_k(logits, clozes.answers, 10),
        "clozes": [{"before": " ".join(c.before), "after": " ".join(c.after), "answer": c.answer, "prediction": p}
                   for c, p in zip(clozes.clozes, predictions, strict=True)],
    }
    with open(os.path.join(args.out, "cloze.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"Cloze probing: {len(clozes.rows)} of {clozes.total} {args.cloze_split} questions have a single-token "
          f"answer (and fit {length} ids); P@1 {100 * result['precision_at_1']:.2f}%, "
          f"P@10 {100 * result['precision_at_10']:.2f}%")


def run(args: argparse.Namespace) -> int:
    """`ptmjax probe` (see ptmjax/cli.py's _add_probe_parser for the flags)."""
    start = time.perf_counter()
    model = read_model_folder(args.model_dir, args.step)
    args.out = args.out or os.path.join(args.model_dir, "probe")
    os.makedirs(args.out, exist_ok=True)
    reader = LayerReader(model.module, model.params, model.vocabulary)
    text_rows = TextRows.of(model.module, model.vocabulary)
    length = sequence_length(model, args.max_length)
    print(f"Probing {type(model.module).__name__} of {model.source}: {reader.num_layers} layers, rows of at most "
          f"{length} ids")
    run_layer_probes(reader, text_rows, args, length)
    if reader.has_attention:
        run_attention(reader, text_rows, args, length)
    else:
        print(f"Attention statistics: skipped ({type(model.module).__name__} has no attention).")
    run_cloze(model, reader.stack.pad_id, text_rows, args, length)
    print(f"Done in {time.perf_counter() - start:.1f} s; outputs in {os.path.abspath(args.out)}")
    return 0
