"""The `ptmjax` command line: `ptmjax train --gin_file=... --gin_bindings=...`, `ptmjax inspect MODEL_DIR`,
`ptmjax convert --from-hf HF_DIR --to MODEL_DIR`, `ptmjax convert --from MODEL_DIR --to-hf HF_DIR`,
`ptmjax quantize --from MODEL_DIR --to OUT_DIR`, `ptmjax prune-heads --from MODEL_DIR --to OUT_DIR --task T
--fraction F`, `ptmjax prune-layers --from MODEL_DIR --to OUT_DIR --keep every_other`,
`ptmjax compile --topology=v5p:4x4x8 --gin_file=...` and `ptmjax probe --model_dir DIR`.

Errors a user can fix print one line on stderr and exit with status 1: a
ValueError (a bad setting the code checks, a mesh that does not fit the
devices, a gin file or binding gin cannot parse, see GinConfigError),
FileNotFoundError / NotADirectoryError (a missing gin file, checkpoint or model
folder) and gin's RuntimeError for a missing required binding. Anything else is
a bug and keeps its traceback; `--traceback` (before or after the command) or
PTMJAX_TRACEBACK=1 shows the traceback of every error. The line ends with the page
of docs/ that explains the error (ERROR_PAGES), or else the command (EXAMPLES).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptmjax import tensorflow_import
from ptmjax.data import corpus

DEFAULT_GIN_FILE = "runs/demo.gin"
TRACEBACK_HELP = "show the full traceback of an error (also: PTMJAX_TRACEBACK=1)"
EXPECTED_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError)
COMMANDS_READING_THE_CORPUS = ("train", "eval", "infer", "probe")  # the SentencePiece vocabulary is keyed by it
COMMANDS_USING_THE_COMPILATION_CACHE = ("eval", "infer", "probe")  # `train` uses train.compilation_cache_dir
_AFTER = argparse.ArgumentParser(add_help=False)  # every command's parent: --traceback after the command too
_AFTER.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=TRACEBACK_HELP)


# command -> (examples shown at the end of its --help, the page of docs/ that explains it)
EXAMPLES = {
    "train": (["ptmjax train", "ptmjax train --gin_file=models/t5_1_1_base.gin --gin_file=runs/pretrain.gin "
               "--gin_file=mesh/fsdp.gin --model_dir=/path/to/run",
               "ptmjax train --model_dir=runs/demo --resume_step=200    # resume from an older checkpoint"],
              "docs/training.md"),
    "eval": (["ptmjax eval --model_dir runs/bert_classify_demo --task ptmjax_stdlib_module_classification_head",
              "ptmjax eval --model_dir runs/demo --harness my_task --include_path my_tasks/   # pip install -e "
              "'.[harness]'"],
             "docs/inference.md"),
    "infer": (["ptmjax infer --model_dir runs/summarize_demo/best --task ptmjax_stdlib_docstring_summary "
               "--max_examples 8", "echo 'Return the sum of a and b.' | ptmjax infer --model_dir runs/demo "
               "--input_file - --method beam --num_beams 4"], "docs/inference.md"),
    "probe": (["ptmjax probe --model_dir runs/bert_demo"], "docs/probing.md"),
    "compile": (["ptmjax compile --topology=v5e:16x16 --gin_file=models/t5_1_1_11B.gin --gin_file=runs/pretrain.gin "
                 "--gin_file=mesh/fsdp_tp.gin"], "docs/aot_compile.md"),
    "convert": (["ptmjax convert --from-hf /path/to/hf_dir --to runs/imported",
                 "ptmjax convert --from runs/finetuned --to-hf /path/to/out"], "docs/models.md"),
    "inspect": (["ptmjax inspect runs/demo"], "docs/scale.md"),
    "quantize": (["ptmjax quantize --from runs/demo --to runs/demo_int8",
                  "ptmjax quantize --from runs/demo --to runs/demo_w8a8 --activations int8",
                  "ptmjax quantize --from runs/demo --to runs/demo_int4 --weights int4 --tile_size 16"],
                 "docs/compression.md"),
    "prune-heads": (["ptmjax prune-heads --from runs/bert_demo --to runs/bert_demo_pruned --task ptmjax_stdlib_mlm_nsp "
                     "--fraction 0.5", "ptmjax prune-heads --from runs/demo --to runs/demo_heads --task "
                     "ptmjax_pretrain --fraction 0.25 --keep_shapes    # full size, for Hugging Face export"],
                    "docs/compression.md"),
    "prune-layers": (["ptmjax prune-layers --from runs/layerdrop_demo --to runs/layerdrop_half --keep every_other",
                      "ptmjax prune-layers --from runs/demo --to runs/demo_shallow --keep encoder=0 --keep decoder=1"],
                     "docs/compression.md"),
}
# the name of an expected error's class -> the page of docs/ that explains it and what to do
ERROR_PAGES = {
    "NonFiniteError": "docs/reliability.md",
    "DamagedCheckpointError": "docs/reliability.md",
    "CheckpointMismatchError": "docs/reliability.md",
    "CheckpointSaveError": "docs/reliability.md",
    "RunDirInUse": "docs/reliability.md",
    "FolderNotWritable": "docs/reliability.md",
}


def _command(commands: argparse._SubParsersAction, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The `ptmjax <name>` parser, its --help ending with EXAMPLES[name]."""
    examples, page = EXAMPLES[name]
    epilog = "examples:\n" + "\n".join(f"  {example}" for example in examples) + f"\n\nmore: {page}"
    return commands.add_parser(name, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ptmjax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traceback", action="store_true", help=TRACEBACK_HELP)
    commands = parser.add_subparsers(dest="command", required=True)
    train = _command(
        commands, "train", help="pre-train or fine-tune a model from gin files; resumes from --model_dir",
        parents=[_AFTER],
    )
    train.add_argument(
        "--gin_file", action="append", default=None,
        help=f"gin file, absolute or relative to the repository's gin_configs/ (repeatable; "
        f"default {DEFAULT_GIN_FILE})",
    )
    train.add_argument(
        "--gin_bindings", action="append", default=[],
        help="extra gin binding such as 'train.num_steps = 100' (repeatable)",
    )
    train.add_argument(
        "--model_dir", default=None,
        help="output folder for checkpoints, config, metrics and plots "
        "(default: runs/<name of the last gin file>)",
    )
    train.add_argument(
        "--resume_step", type=int, default=None,
        help="resume from this saved step instead of the newest (e.g. the last good one a non-finite stop names); "
        "the newer checkpoints are set aside as checkpoints/<step>.abandoned",
    )
    train.add_argument(
        "--num_cpu_devices", type=int, default=None,
        help="emulate this many devices on the CPU (to try mesh layouts without accelerators)",
    )
    train.add_argument(
        "--distributed", action="store_true",
        help="multi-host: first call initialize_distributed (its gin bindings, else JAX's cluster auto-detection); "
        "see docs/multi_host.md",
    )
    _add_inspect_parser(commands)
    _add_convert_parser(commands)
    _add_quantize_parser(commands)
    _add_prune_heads_parser(commands)
    _add_prune_layers_parser(commands)
    _add_compile_parser(commands)
    _add_eval_parser(commands)
    _add_infer_parser(commands)
    _add_probe_parser(commands)
    return parser


def _decode_parser() -> argparse.ArgumentParser:
    """The decoding flags of `eval` and `infer`: DecodeConfig's fields, which override its gin bindings."""
    decode = argparse.ArgumentParser(add_help=False)
    decode.add_argument("--method", choices=("greedy", "beam", "sample"), default=None, help="default: greedy")
    decode.add_argument("--max_decode_length", type=int, default=None, help="most tokens generated, EOS included")
    decode.add_argument("--num_beams", type=int, default=None, help="--method beam: the beam width (default: 4)")
    decode.add_argument("--length_penalty_style", choices=("t5", "hf"), default=None,
                        help="--method beam: a finished beam's score is divided by ((5 + length) / 6) ** alpha "
                        "(t5) or length ** alpha (hf, as transformers' generate); default: hf for models from "
                        "Hugging Face, else t5")
    decode.add_argument("--length_penalty_alpha", type=float, default=None,
                        help="--method beam: the length penalty's exponent (default: 0.6 for t5, the model's "
                        "length_penalty for hf, 1.0 if it has none)")
    decode.add_argument("--temperature", type=float, default=None, help="--method sample: softmax temperature")
    decode.add_argument("--top_k", type=int, default=None, help="--method sample: keep the k likeliest (0 = off)")
    decode.add_argument("--top_p", type=float, default=None, help="--method sample: nucleus mass (1 = off)")
    decode.add_argument("--num_decodes", type=int, default=None, help="sequences per input (sample, beam)")
    decode.add_argument(
        "--gin_bindings", action="append", default=[],
        help="DecodeConfig bindings such as 'DecodeConfig.top_k = 40' (repeatable; the flags win)",
    )
    return decode


def _add_eval_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = _command(
        commands, "eval", help="a checkpoint's metrics on a seqio task or mixture (decoding and/or scoring, as its "
        "metrics need), or on lm-evaluation-harness tasks; writes MODEL_DIR/eval/<task>_step<N>.json (and "
        "TensorBoard)", parents=[_AFTER, _decode_parser()],
    )
    evaluate.add_argument("--model_dir", required=True, help="a `ptmjax train` run's folder or a converted model's "
                          "(--harness: also a Hugging Face folder)")
    tasks = evaluate.add_mutually_exclusive_group(required=True)
    tasks.add_argument("--task", help="a registered seqio task or mixture with metric functions")
    tasks.add_argument("--harness", metavar="TASK[,TASK]",
                       help="lm-evaluation-harness tasks, lm-eval's or --include_path's (pip install -e '.[harness]'); "
                       "writes MODEL_DIR/eval/harness_<tasks>[_step<N>].json")
    evaluate.add_argument("--include_path", default=None,
                          help="--harness: a folder of lm-eval task YAML files (e.g. over local JSONL) to add")
    evaluate.add_argument("--split", default="validation", help="the split evaluated (default: validation)")
    evaluate.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    evaluate.add_argument("--batch_size", type=int, default=32,
                          help="rows per model call; a multiple of the data-parallel devices (default: 32)")
    evaluate.add_argument("--max_examples", "--limit", type=int, default=None,
                          help="evaluate only the first N examples of each task (--limit, as lm-eval names it; "
                          "default: all)")
    evaluate.add_argument("--output", default=None, help="the JSON file (default: MODEL_DIR/eval/<task>_step<N>.json)")
    evaluate.add_argument("--overwrite", action="store_true", help="replace an existing JSON file")


def _add_infer_parser(commands: argparse._SubParsersAction) -> None:
    infer = _command(
        commands, "infer",
        help="decode a text file's lines or a seqio task's split with a model folder; JSONL predictions",
        parents=[_AFTER, _decode_parser()],
    )
    infer.add_argument("--model_dir", required=True, help="a `ptmjax train` run, an imported model or a Hugging Face "
                       "folder")
    infer.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    infer.add_argument("--embed", action="store_true",
                       help="an encoder's embedding of each input (pooled as a sentence-transformers folder says, "
                       "else the mean) instead of a decode")
    infer.add_argument("--task", default=None, help="a registered seqio task or mixture to decode")
    infer.add_argument("--split", default="validation", help="with --task: the split (default: validation)")
    infer.add_argument(
        "--task_feature_lengths", type=parse_mesh_axes, default=None,
        help="with --task: e.g. 'inputs=512,targets=114' (default: the run's train.task_feature_lengths)",
    )
    infer.add_argument("--input_file", default=None, help="one prompt per line; '-' reads standard input")
    infer.add_argument(
        "--output", default=None, help="JSONL file (default: MODEL_DIR/inference/<task or input file stem>.jsonl)"
    )
    infer.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    infer.add_argument("--resume", action="store_true",
                       help="continue an interrupted run from the predictions it kept in <output>.partial.jsonl")
    infer.add_argument("--seed", type=int, default=0, help="--method sample: the random seed")
    infer.add_argument("--batch_size", type=int, default=8, help="inputs per jitted call (default 8)")
    infer.add_argument("--max_examples", type=int, default=None, help="decode only the first N inputs")
    infer.add_argument("--max_input_length", type=int, default=None,
                       help="the most tokens an input may have (default: an encoder-decoder run's trained inputs "
                       "length, else its tokenizer's model_max_length)")
    infer.add_argument("--truncate_inputs", action="store_true",
                       help="cut longer inputs to their first --max_input_length tokens, with a warning (default: "
                       "refuse them)")


def _add_probe_parser(commands: argparse._SubParsersAction) -> None:
    probe = _command(
        commands, "probe", help="a frozen model's layers: linear probes per layer on a classification task, attention "
        "statistics and maps, cloze probing (masked LMs, T5); tables, JSON, arrays and PNGs", parents=[_AFTER],
    )
    probe.add_argument("--model_dir", required=True, help="a `ptmjax train` run or a `ptmjax convert` import")
    probe.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    probe.add_argument("--task", default="ptmjax_stdlib_module_classification_head",
                       help="a registered task of 'inputs' texts and 'label' class ids (default: %(default)s)")
    probe.add_argument("--out", default=None, help="output folder (default: MODEL_DIR/probe)")
    probe.add_argument("--max_length", type=int, default=128, help="ids per row, longer texts cut (default: 128)")
    probe.add_argument("--batch_size", type=int, default=32, help="rows per model call (default: 32)")
    probe.add_argument("--attention_examples", type=int, default=64,
                       help="validation texts the attention statistics average over (default: 64)")
    probe.add_argument("--attention_maps", type=int, default=8, help="examples whose maps are saved (default: 8)")
    probe.add_argument("--cloze_split", default="validation", help="split of the cloze questions (default: validation)")


def _add_compile_parser(commands: argparse._SubParsersAction) -> None:
    compile_ = _command(
        commands, "compile", help="compile the training step for a TPU topology on this host (no TPU needed): "
        "memory per device against HBM, XLA and model FLOPs", parents=[_AFTER],
    )
    compile_.add_argument(
        "--topology", required=True,
        help="generation:shape such as 'v5p:4x4x8', 'v4:4x4x8' or 'v5e:16x16' (needs libtpu: pip install -e "
        "'.[tpu]'), or 'cpu' for this host's CPU devices",
    )
    compile_.add_argument("--gin_file", action="append", required=True, help="as for train (repeatable)")
    compile_.add_argument("--gin_bindings", action="append", default=[], help="as for train (repeatable)")
    compile_.add_argument("--num_cpu_devices", type=int, default=None, help="with --topology=cpu: emulate this many")
    compile_.add_argument(
        "--num_slices", type=int, default=1,
        help="a multi-slice job of this many copies of --topology joined by DCN; bind MeshConfig.dcn_data or "
        "dcn_fsdp to spread the mesh over them",
    )


def _add_convert_parser(commands: argparse._SubParsersAction) -> None:
    convert = _command(
        commands, "convert", help="import a Hugging Face checkpoint directory as a ptmjax model folder, or export one",
        parents=[_AFTER],
    )
    source = convert.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", dest="from_hf", help="a directory written by transformers' save_pretrained")
    source.add_argument("--from", dest="from_dir", help="a ptmjax model folder (a run's or an imported one)")
    convert.add_argument("--to", dest="to_dir", help="with --from-hf: the ptmjax model folder to write")
    convert.add_argument("--to-hf", dest="to_hf", help="with --from: the Hugging Face directory to write")
    convert.add_argument("--step", type=int, default=None, help="with --from: checkpoint step (default: newest)")
    convert.add_argument("--overwrite", action="store_true",
                         help="replace a --to or --to-hf folder that is not empty (refused otherwise)")


def _add_quantize_parser(commands: argparse._SubParsersAction) -> None:
    quantize = _command(
        commands, "quantize", help="quantize a model folder after training (int8 / int4 weights, int8 "
        "activations) into a new model folder", parents=[_AFTER],
    )
    _derived_folder_flags(quantize, "the quantized model folder to write")
    quantize.add_argument("--weights", default=None, help="the kernels' type: int8, int4, nf4, ternary or binary "
                          "(default int8; a fake-quantized run's own)")
    quantize.add_argument("--activations", default=None,
                          help="int8: quantize each product's input per token too (w8a8); default: weights only")
    quantize.add_argument("--tile_size", type=int, default=None,
                          help="one scale per this many weights along the contracted dim (default: per channel)")
    quantize.add_argument("--targets", default=None, help="regex over the Dense module paths to quantize "
                          "(default: every Dense in the layer stacks, not embeddings or output heads)")


def _derived_folder_flags(parser: argparse.ArgumentParser, written: str) -> None:
    """--from, --to, --step and --overwrite of a command that writes a model folder derived from another's."""
    parser.add_argument("--from", dest="from_dir", required=True, help="a ptmjax model folder (a run or import)")
    parser.add_argument("--to", dest="to_dir", required=True, help=written)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    parser.add_argument("--overwrite", action="store_true", help="replace a --to folder that is not empty")


def _add_prune_heads_parser(commands: argparse._SubParsersAction) -> None:
    prune = _command(commands, "prune-heads", help="remove a model folder's least important attention heads "
                     "(Michel et al.) into a new model folder", parents=[_AFTER])
    _derived_folder_flags(prune, "the head-pruned model folder to write")
    prune.add_argument("--task", required=True, help="the seqio task whose loss scores the heads")
    prune.add_argument("--fraction", type=float, required=True, help="the share of all heads to prune, in [0, 1)")
    prune.add_argument("--rounds", type=int, default=1, help="prune in this many equal shares, scoring the heads "
                       "again after each with those pruned masked (Michel et al.; default 1: one shot)")
    prune.add_argument("--split", default="validation", help="the task's split to score on (default validation)")
    prune.add_argument("--num_batches", type=int, default=8, help="batches to score on (default 8)")
    prune.add_argument("--batch_size", type=int, default=8, help="examples per batch (default 8)")
    prune.add_argument("--inputs_length", type=int, default=None,
                       help="with --targets_length: the task's lengths (default: the folder's task_feature_lengths)")
    prune.add_argument("--targets_length", type=int, default=None)
    prune.add_argument("--keep_shapes", action="store_true", help="keep full-size kernels, the pruned heads' output "
                       "rows zero (a model Hugging Face export takes) instead of smaller ones")


def _add_prune_layers_parser(commands: argparse._SubParsersAction) -> None:
    prune = _command(commands, "prune-layers", help="keep some of a model folder's layers (LayerDrop's pruning) in "
                     "a new, shallower model folder", parents=[_AFTER])
    _derived_folder_flags(prune, "the layer-pruned model folder to write")
    prune.add_argument("--keep", action="append", required=True, help="every_other, layer indices (0,2,5), or "
                       "STACK=every_other / STACK=0,2 once per stack (encoder, decoder)")


def _add_inspect_parser(commands: argparse._SubParsersAction) -> None:
    inspect = _command(
        commands, "inspect", help="table of a run's parameters: shapes, logical axes, sharding, bytes per device; "
        "reads the checkpoint's metadata only", parents=[_AFTER],
    )
    inspect.add_argument("model_dir", help="the --model_dir of a `ptmjax train` run")
    inspect.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    inspect.add_argument(
        "--mesh", type=parse_mesh_axes, default=None,
        help="layout to report, e.g. 'data=2,fsdp=2,tensor=2'; unnamed axes are 1, one may be -1 "
        "(default: the run's mesh)",
    )
    inspect.add_argument(
        "--num_cpu_devices", type=int, default=None,
        help="emulate this many CPU devices (what a -1 mesh axis fills)",
    )
    inspect.add_argument("--opt_state", action="store_true", help="add rows for the optimizer state")


def parse_mesh_axes(text: str) -> dict[str, int]:
    """'data=2,fsdp=-1' -> {'data': 2, 'fsdp': -1}."""
    axes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, size = item.partition("=")
        try:
            axes[name.strip()] = int(size)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad mesh axis {item!r} in {text!r}; write axis=size pairs such as 'data=2,fsdp=4'"
            ) from None
    return axes


def run_train(args: argparse.Namespace) -> int:
    if args.num_cpu_devices:
        import jax

        jax.config.update("jax_num_cpu_devices", args.num_cpu_devices)
    from ptmjax.gin_files import parse_gin
    from ptmjax.training.run import train

    gin_files = parse_gin(args.gin_file or [DEFAULT_GIN_FILE], args.gin_bindings)
    if args.distributed:
        from ptmjax.training.multihost import initialize_distributed

        initialize_distributed()
    model_dir = args.model_dir or os.path.join("runs", Path(gin_files[-1]).stem)
    result = train(model_dir, resume_step=args.resume_step)
    state = "interrupted (SIGTERM) at" if result.preempted else "finished at"
    print(f"\nTraining {state} step {result.step}.")
    if result.train_loss is not None:
        print(f"  last train loss: {result.train_loss:.4f}")
    for key, value in result.eval_metrics.items():
        print(f"  {key}: {value:.4f}")
    print("Outputs:")
    for key, path in result.files.items():
        print(f"  {key:12s} {os.path.abspath(path)}")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    if args.num_cpu_devices:
        import jax

        jax.config.update("jax_num_cpu_devices", args.num_cpu_devices)
    from rich.console import Console

    from ptmjax.tools.inspection import inspect_checkpoint

    table = inspect_checkpoint(
        args.model_dir, args.mesh, step=args.step, include_opt_state=args.opt_state
    )
    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough for one line a row
        console = Console(width=200)
    console.print(table)
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from ptmjax.convert import checkpoint

    if args.from_hf:
        if not args.to_dir or args.to_hf:
            raise SystemExit("ptmjax convert --from-hf HF_DIR needs --to MODEL_DIR (and no --to-hf)")
        path = checkpoint.import_hf(args.from_hf, args.to_dir, args.overwrite)
        print(f"Imported {args.from_hf} -> {path}")
        print(f"Fine-tune it with --gin_bindings=\"train.init_checkpoint = '{args.to_dir}'\"")
        return 0
    if not args.to_hf or args.to_dir:
        raise SystemExit("ptmjax convert --from MODEL_DIR needs --to-hf HF_DIR (and no --to)")
    path = checkpoint.export_hf(args.from_dir, args.to_hf, args.step, args.overwrite)
    print(f"Exported {args.from_dir} -> {path} (load it with transformers' from_pretrained)")
    return 0


def run_prune_layers(args: argparse.Namespace) -> int:
    from ptmjax.tools.prune_layers import parse_keep, prune_layers_folder

    path = prune_layers_folder(args.from_dir, args.to_dir, parse_keep(args.keep), args.step, args.overwrite)
    print(f"Kept layers {' '.join(args.keep)} of {args.from_dir} -> {path} (read it with ptmjax.load, eval, infer or "
          "inspect)")
    return 0


def run_quantize(args: argparse.Namespace) -> int:
    from ptmjax.tools.inspection import format_bytes
    from ptmjax.tools.quantize import quantize_folder

    written = quantize_folder(args.from_dir, args.to_dir, args.weights, args.activations, args.tile_size,
                              args.targets, step=args.step, overwrite=args.overwrite)
    print(f"Quantized {args.from_dir} -> {written.checkpoint} (read it with ptmjax.load, eval, infer or inspect): "
          f"parameters {format_bytes(written.float_bytes)} -> {format_bytes(written.quantized_bytes)}, "
          f"{format_bytes(written.disk_bytes)} on disk")
    return 0


def run_prune_heads(args: argparse.Namespace) -> int:
    from ptmjax.tools.prune_heads import prune_heads_folder

    lengths = {name: length for name, length in (("inputs", args.inputs_length), ("targets", args.targets_length))
               if length is not None}
    path = prune_heads_folder(args.from_dir, args.to_dir, args.task, args.fraction, rounds=args.rounds,
                              split=args.split, num_batches=args.num_batches, batch_size=args.batch_size,
                              task_feature_lengths=lengths or None, keep_shapes=args.keep_shapes, step=args.step,
                              overwrite=args.overwrite)
    print(f"Pruned heads of {args.from_dir} -> {path} (read it with ptmjax.load, eval, infer or inspect)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    tensorflow_import.hold_back(tensorflow_import.KERAS_EXTRAS)  # before anything imports TensorFlow
    args = _parser().parse_args(argv)  # imports nothing heavy: the corpus is read while TensorFlow imports
    if args.command in COMMANDS_READING_THE_CORPUS:
        corpus.extract_in_background()
    try:
        return _run(args)
    except Exception as error:
        if args.traceback or os.environ.get("PTMJAX_TRACEBACK") == "1" or not is_expected(error):
            raise
        print(f"ptmjax {args.command}: error: {one_line(error)} (see {error_page(error, args.command)})",
              file=sys.stderr)
        return 1


def is_expected(error: Exception) -> bool:
    """Whether `error` is one a user can fix (see the module docstring), not a bug."""
    missing_binding = isinstance(error, RuntimeError) and str(error).startswith("Required bindings for")
    return isinstance(error, EXPECTED_ERRORS) or missing_binding


def error_page(error: Exception, command: str) -> str:
    """The page of docs/ for an expected error: its class's (ERROR_PAGES), else its command's."""
    names = [cls.__name__ for cls in type(error).__mro__]
    return next((ERROR_PAGES[name] for name in names if name in ERROR_PAGES), EXAMPLES[command][1])


def one_line(error: Exception) -> str:
    """The error's message on one line, without the lines gin adds about the configurable it was raised in."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(line for line in lines if not line.startswith("In call to configurable")) or repr(error)


def _run(args: argparse.Namespace) -> int:
    if args.command in COMMANDS_USING_THE_COMPILATION_CACHE:
        from ptmjax.training import compilation_cache

        compilation_cache.use_compilation_cache()
    if args.command == "train":
        return run_train(args)
    if args.command == "inspect":
        return run_inspect(args)
    if args.command == "convert":
        return run_convert(args)
    if args.command == "quantize":
        return run_quantize(args)
    if args.command == "prune-heads":
        return run_prune_heads(args)
    if args.command == "prune-layers":
        return run_prune_layers(args)
    if args.command == "compile":
        from ptmjax.tools.aot_compile import main as run_compile

        return run_compile(args)
    if args.command == "eval":
        from ptmjax.tools.evaluate import main as run_eval

        return run_eval(args)
    if args.command == "infer":
        from ptmjax.tools.infer import run as run_infer

        return run_infer(args)
    if args.command == "probe":
        from ptmjax.tools.probe import run as run_probe

        return run_probe(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
