"""Regenerates the tables in docs/aot_compile.md: T5 training steps compiled for TPU topologies on this host.

    pip install -e '.[tpu]'                                    # libtpu, the TPU compiler
    python benchmarks/aot_compile_table.py                     # every row (hours on 2 cores)
    python benchmarks/aot_compile_table.py --only t5_base_v4   # some rows; the others keep their results

Each row is what its `ptmjax compile` command (listed under the table) compiles:
the Trainer's train step from the same gin files, for the topology. Results
go to docs/aot_compile.json, one entry per row, and each table between its
markers in docs/aot_compile.md is rebuilt from all entries: the model/topology
table and the remat/scan table. Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gin  # noqa: E402
import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")  # compile-only: local accelerators are never used

from ptmjax import gin_files  # noqa: E402
from ptmjax.layers import pipeline, splash_attention  # noqa: E402
from ptmjax.tools import aot_compile as aot  # noqa: E402
from ptmjax.tools import results_files  # noqa: E402
from ptmjax.training import run  # noqa: E402

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
RESULTS = DOCS / "aot_compile.json"
TABLE = DOCS / "aot_compile.md"
SCRIPT = "benchmarks/aot_compile_table.py"  # how docs/aot_compile.md's table markers name this script
TABLES = ("models", "remat_scan", "kernels", "pipeline", "context", "context_t5", "sparse", "long_models")
RUN = "runs/pretrain.gin"  # T5's pre-training setting: batch 128, inputs 512, targets 114, Adafactor
BF16 = ("T5Config.dtype = 'bfloat16'",)  # 3B and 11B: full remat and scanned layers come from their gin files


@dataclasses.dataclass(frozen=True)
class Row:
    """One compile: a model file, a topology (times num_slices), a mesh file and extra gin bindings."""

    name: str
    model: str
    topology: str
    mesh: str
    bindings: tuple[str, ...] = ()
    num_slices: int = 1
    table: str = "models"  # which table of docs/aot_compile.md (one of TABLES)
    run: str = RUN

    @property
    def gin_files(self) -> list[str]:
        return [f"models/{self.model}.gin", self.run, f"mesh/{self.mesh}.gin"]

    @property
    def command(self) -> str:
        words = ["ptmjax", "compile", f"--topology={self.topology}"]
        words += [f"--num_slices={self.num_slices}"] if self.num_slices > 1 else []
        words += [f"--gin_file={f}" for f in self.gin_files] + [f'--gin_bindings="{b}"' for b in self.bindings]
        return " ".join(words)


def _rows() -> list[Row]:
    rows = []
    for size in ("base", "large", "3B"):
        options = BF16 if size == "3B" else ()
        rows.append(Row(f"t5_{size}_v4", f"t5_1_1_{size}", "v4:4x4x8", "fsdp", options))
        rows.append(Row(f"t5_{size}_v5e", f"t5_1_1_{size}", "v5e:16x16", "fsdp_tp", options))
    rows += [
        Row("t5_11B_v4_dp", "t5_1_1_11B", "v4:4x4x8", "dp", BF16),
        Row("t5_11B_v4", "t5_1_1_11B", "v4:4x4x8", "fsdp", BF16),
        Row("t5_11B_v5e", "t5_1_1_11B", "v5e:16x16", "fsdp_tp", BF16),
        # Two slices joined by DCN, data parallel across them, twice the batch (weak scaling).
        Row("t5_11B_2x_v5e", "t5_1_1_11B", "v5e:16x16", "fsdp_tp",
            (*BF16, "MeshConfig.data = 2", "MeshConfig.dcn_data = 2", "train.batch_size = 256"), num_slices=2),
        Row("switch_base_16_v4", "switch_base_16", "v4:4x4x8", "fsdp", ("MeshConfig.expert = 16",)),
        Row("switch_base_16_v5e", "switch_base_16", "v5e:16x16", "fsdp_tp", ("MeshConfig.expert = 16",)),
    ]
    for policy in ("none", "save_dot_products", "full"):  # T5 large, batch 32 on 4 v5e chips
        for scan in (False, True):
            options = (f"T5Config.remat_policy = '{policy}'", f"T5Config.scan_layers = {scan}", "train.batch_size = 32")
            name = f"t5_large_v5e_2x2_{policy}" + ("_scan" if scan else "")
            rows.append(Row(name, "t5_1_1_large", "v5e:2x2", "fsdp", options, table="remat_scan"))
    # Each kernel option with and without it (table "kernels"), on small slices so that a row compiles in minutes.
    long = "train.task_feature_lengths = {'inputs': 2048, 'targets': 2048}"
    for size, batch, dtype in (("base", 4, ()), ("base", 8, ()), ("large", 4, ()), ("large", 4, BF16)):  # length 2048,
        for kernel in ("einsum", "pallas_tpu_flash"):  # one or two sequences per device
            name = f"t5_{size}_2048_{kernel}" + ("_b8" if batch == 8 else "") + ("_bf16" if dtype else "")
            options = (long, f"train.batch_size = {batch}", f"T5Config.attention_kernel = '{kernel}'", *dtype)
            rows.append(Row(name, f"t5_1_1_{size}", "v5e:2x2", "fsdp", options, table="kernels"))
    for dropless in (False, True):  # Switch-Base-16, experts over the 16 chips of v5e:4x4
        rows.append(Row("switch_base_16_v5e_4x4" + ("_dropless" if dropless else ""), "switch_base_16", "v5e:4x4",
                        "fsdp", ("MeshConfig.expert = 16", f"T5Config.moe_dropless = {dropless}"), table="kernels"))
    mt5 = ("T5Config.vocab_size = 250112", "train.task_feature_lengths = {'inputs': 1024, 'targets': 256}",
           "train.batch_size = 32")  # an mT5-base-like vocabulary on T5 v1.1 base
    for chunk in (None, 64):
        rows.append(Row("t5_base_250k_vocab" + (f"_chunk{chunk}" if chunk else ""), "t5_1_1_base", "v5e:2x2", "fsdp",
                        (*mt5, f"LossConfig.logits_chunk_size = {chunk}"), table="kernels"))
    return rows + _scale_rows()


GPT2_RUN = "runs/gpt2_pretrain.gin"  # GPT-2 causal LM: batch 32 of 2048 tokens, AdamW
SCANNED = ("scan_layers = True", "remat_policy = 'full'", "dtype = 'bfloat16'")  # bound on each row's config
GPT2_30B = ("GPT2Config.d_model = 7168", "GPT2Config.num_heads = 56", "GPT2Config.num_layers = 48",
            "GPT2Config.d_ff = 28672", "GPT2Config.dropout_rate = 0.0", "GPT2Config.attention_dropout_rate = 0.0",
            *(f"GPT2Config.{b}" for b in SCANNED))  # 30.0B parameters, GPT-2's shape at 7168 wide and 48 deep


def _axes(**sizes: int) -> str:
    """A MeshConfig.axes binding (with mesh/pp.gin or mesh/cp.gin): the given sizes, every other axis 1."""
    axes = {"data": 1, "stage": 1, "fsdp": 1, "context": 1, "tensor": 1, "expert": 1, **sizes}
    return f"MeshConfig.axes = {axes}"


def _scale_rows() -> list[Row]:
    """Pipeline stages, the context axis and splash attention's sparse masks (tables pipeline, context,
    context_t5, sparse)."""
    # GPT-2 30B, batch 32 of 2048 tokens: FSDP alone spans at most 32 chips (a row each), too few for 30B with
    # AdamW; on the 64 chips of v5e:8x8 the other factor 2 (or 4) is tensor parallelism or pipeline stages.
    rows = [Row("gpt2_30B_fsdp32", "gpt2_medium", "v5e:4x8", "fsdp", GPT2_30B, table="pipeline", run=GPT2_RUN),
            Row("gpt2_30B_fsdp32_tp2", "gpt2_medium", "v5e:8x8", "fsdp",  # the vocabulary padded to 2 x 25152
                (*GPT2_30B, "GPT2Config.vocab_size = 50304", "MeshConfig.tensor = 2"),
                table="pipeline", run=GPT2_RUN)]
    for stages, micro in ((2, 1), (4, 2)):
        options = (*GPT2_30B, _axes(stage=stages, fsdp=64 // stages), f"GPT2Config.pipeline_microbatches = {micro}")
        rows.append(Row(f"gpt2_30B_pp{stages}_fsdp{64 // stages}_m{micro}", "gpt2_medium", "v5e:8x8", "pp", options,
                        table="pipeline", run=GPT2_RUN))
    circular = ("GPT2Config.pipeline_microbatches = 2", "GPT2Config.pipeline_schedule = 'circular'",
                "GPT2Config.pipeline_repeats = 2")
    rows.append(Row("gpt2_30B_pp2_fsdp32_circular_r2_m2", "gpt2_medium", "v5e:8x8", "pp",
                    (*GPT2_30B, _axes(stage=2, fsdp=32), *circular), table="pipeline", run=GPT2_RUN))
    # One 32k-token row of GPT-2 medium on the 8 chips of v5e:2x4: heads over 8 devices, or the sequence.
    gpt2_32k = ("train.task_feature_lengths = {'targets': 32768}", "GPT2Config.max_length = 32768",
                "train.batch_size = 1", "GPT2Config.dropout_rate = 0.0", "GPT2Config.attention_dropout_rate = 0.0",
                *(f"GPT2Config.{b}" for b in SCANNED))
    rows.append(Row("gpt2_medium_32k_tp8", "gpt2_medium", "v5e:2x4", "fsdp",  # the vocabulary padded to 8 x 6288
                    (*gpt2_32k, "GPT2Config.vocab_size = 50304", "MeshConfig.fsdp = 1", "MeshConfig.tensor = 8"),
                    table="context", run=GPT2_RUN))
    for form in ("ring", "all_gather"):
        rows.append(Row(f"gpt2_medium_32k_cp8_{form}", "gpt2_medium", "v5e:2x4", "cp",
                        (*gpt2_32k, _axes(context=8), f"GPT2Config.context_parallel_attention = '{form}'"),
                        table="context", run=GPT2_RUN))
    # T5 v1.1 base, 8192 input and 8192 target tokens a row on the 4 chips of v5e:2x2. Four rows: one per chip, or
    # every row's sequence over the 4 chips (the same tokens per chip). One row: its heads over the chips (12 / 4 a
    # chip), or its sequence.
    t5_8k = ("train.task_feature_lengths = {'inputs': 8192, 'targets': 8192}", *(f"T5Config.{b}" for b in SCANNED))
    rows.append(Row("t5_base_8k_fsdp4", "t5_1_1_base", "v5e:2x2", "fsdp", (*t5_8k, "train.batch_size = 4"),
                    table="context_t5"))
    rows.append(Row("t5_base_8k_cp4_all_gather", "t5_1_1_base", "v5e:2x2", "cp",
                    (*t5_8k, "train.batch_size = 4", _axes(context=4),
                     "T5Config.context_parallel_attention = 'all_gather'"), table="context_t5"))
    rows.append(Row("t5_base_8k_b1_tp4", "t5_1_1_base", "v5e:2x2", "fsdp",
                    (*t5_8k, "train.batch_size = 1", "MeshConfig.fsdp = 1", "MeshConfig.tensor = 4"),
                    table="context_t5"))
    for form in ("ring", "all_gather"):
        rows.append(Row(f"t5_base_8k_b1_cp4_{form}", "t5_1_1_base", "v5e:2x2", "cp",
                        (*t5_8k, "train.batch_size = 1", _axes(context=4),
                         f"T5Config.context_parallel_attention = '{form}'"), table="context_t5"))
    return rows + _sparse_rows()


# Sparse patterns for splash attention's block-sparse mask (GPT2Config.attention_pattern).
PATTERNS = {
    "w128": ("GPT2Config.attention_pattern = @SlidingWindow()", "SlidingWindow.size = 128"),
    "w256": ("GPT2Config.attention_pattern = @SlidingWindow()", "SlidingWindow.size = 256"),
    "global_w256": ("GPT2Config.attention_pattern = @AnyOf()", "AnyOf.patterns = [@SlidingWindow(), @GlobalTokens()]",
                    "SlidingWindow.size = 256", "GlobalTokens.positions = [0]"),
    "chunks256": ("GPT2Config.attention_pattern = @FixedChunks()", "FixedChunks.size = 256",
                  "FixedChunks.summary = 16"),
}


def _sparse_rows() -> list[Row]:
    """GPT-2 small (one row per chip of v5e:2x2) at 8k to 32k tokens: einsum, splash dense (causal) and splash with
    each pattern (table sparse); LongT5 (transient-global) at 8k and 16k inputs and Transformer-XL with 8k
    segments and memory (table long_models)."""
    rows = []
    for length in (8192, 16384, 32768):
        common = (f"train.task_feature_lengths = {{'targets': {length}}}", f"GPT2Config.max_length = {length}",
                  "train.batch_size = 4", "GPT2Config.dropout_rate = 0.0", "GPT2Config.attention_dropout_rate = 0.0",
                  *(f"GPT2Config.{b}" for b in SCANNED))
        kernels = {"einsum": ("GPT2Config.attention_kernel = 'einsum'",)} if length == 8192 else {}
        kernels["splash"] = ("GPT2Config.attention_kernel = 'splash'",)
        kernels.update({f"splash_{name}": (*kernels["splash"], *pattern) for name, pattern in PATTERNS.items()})
        for name, options in kernels.items():
            rows.append(Row(f"gpt2_small_{length // 1024}k_{name}", "gpt2_small", "v5e:2x2", "fsdp",
                            (*common, *options), table="sparse", run=GPT2_RUN))
    for inputs in (8192, 16384):
        options = ("train.model = @LongT5()", "LongT5.config = @LongT5Config()", "train.pack = False",
                   f"train.task_feature_lengths = {{'inputs': {inputs}, 'targets': 512}}", "train.batch_size = 4",
                   *(f"LongT5Config.{b}" for b in SCANNED))
        rows.append(Row(f"longt5_tglobal_base_{inputs // 1024}k", "longt5_tglobal_base", "v5e:2x2", "fsdp", options,
                        table="long_models"))
    # Transformer-XL at GPT-2 small's sizes, 32k tokens a step as the GPT-2 rows: 4 streams of 8192-token segments
    # or 16 of 2048, each layer attending its segment and a memory as long (einsum attention, layers not scanned).
    for segment, streams in ((8192, 4), (2048, 16)):
        txl = (*(f"TransformerXLConfig.{name} = {value}" for name, value in (
            ("vocab_size", 50257), ("d_model", 768), ("num_heads", 12), ("num_layers", 12), ("d_ff", 3072),
            ("memory_length", segment), ("remat_policy", "'full'"), ("dtype", "'bfloat16'"))),
            f"SEGMENT_LENGTH = {segment}", f"BATCH_SIZE = {streams}")
        rows.append(Row(f"txl_small_{segment // 1024}k_memory_{segment // 1024}k", "txl_tiny", "v5e:2x2", "fsdp",
                        txl, table="long_models", run="runs/txl_demo.gin"))
    return rows


ROWS = _rows()


def compile_row(row: Row) -> dict:
    """Compiles one row; returns its JSON record."""
    gin.clear_config()
    gin_files.parse_gin(row.gin_files, row.bindings)
    try:  # the bindings stay while it compiles: the feature converter (its batch shapes) reads them too
        spec = run.run_spec_from_gin()
        step = aot.compile_train_step(spec, aot.get_topology(row.topology, row.num_slices))
    finally:
        gin.clear_config()
    report = step.report
    record = {
        **results_files.run_record(row.command),
        "params": report.num_params,
        "batch": spec.batch_size, "feature_lengths": dict(spec.task_feature_lengths),
        "topology": report.topology, "device_kind": report.device_kind, "devices": report.num_devices,
        "mesh": dict(report.mesh_shape), "hbm_per_device": report.hbm_per_device,
        "memory": dataclasses.asdict(report.memory) if report.memory else None,
        "total_per_device": report.memory.total if report.memory else None,
        "compiler_error": report.compiler_error, "fits": report.fits,
        "xla_flops": report.xla_flops, "model_flops": report.model_flops,
        "lower_seconds": round(report.lower_seconds, 1), "compile_seconds": round(report.compile_seconds, 1),
        "jax": jax.__version__, "libtpu": importlib.metadata.version("libtpu"),
    }
    record.update(_layout(spec, report.mesh_shape))
    del step
    gc.collect()
    return record


def _layout(spec, mesh_shape: dict[str, int]) -> dict:
    """What a row's pipeline (stages, micro-batches, repeats, bubble) or splash kernel (blocks computed) is."""
    config, record = spec.model.config, {}
    stages = mesh_shape.get("stage", 1)
    if stages > 1:
        micro, repeats = config.pipeline_microbatches or stages, config.pipeline_repeats
        record["pipeline"] = {"stages": stages, "microbatches": micro, "repeats": repeats,
                              "schedule": config.pipeline_schedule,
                              "bubble": pipeline.bubble_fraction(stages, micro, repeats)}
    if getattr(config, "attention_kernel", None) == "splash":  # GPT-2: causal self-attention over the targets
        length = -(-spec.task_feature_lengths["targets"] // splash_attention.BLOCK) * splash_attention.BLOCK
        live = splash_attention.live_blocks(config.attention_pattern, True, length, length)
        blocks, block = len(live), splash_attention.BLOCK
        per_block = 4 * block * block * config.head_dim * config.num_heads * config.num_layers * spec.batch_size
        record["splash_blocks"] = {"computed": int(live.sum()), "causal": blocks * (blocks + 1) // 2,
                                   "all": blocks * blocks, "forward_flops": int(live.sum()) * per_block}
    return record


def _gib(num: int | None) -> str:
    return "-" if num is None else f"{num / 2**30:.2f}"


def _markdown(results: dict[str, dict], table: str) -> str:
    head = ("| row | model (params) | topology | mesh data/fsdp/tensor/expert | options | arguments | "
            "temporaries | outputs (not aliased) | code | total / HBM per device (GiB) | fits | "
            "XLA FLOPs | model FLOPs | XLA / model | compile (s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    commands = []
    for row in ROWS:
        r = results.get(row.name)
        if r is None or row.table != table:
            continue
        m = r["memory"]
        mesh = "/".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor", "expert"))
        options = ", ".join(_option(b) for b in row.bindings if not b.startswith("MeshConfig.expert")) or "-"
        if m is None:
            memory = ["-"] * 4 + [f"out of memory: {r['compiler_error']}"]
        else:
            memory = [_gib(m["arguments"]), _gib(m["temporaries"]), _gib(m["outputs"] - m["aliased"]),
                      _gib(m["generated_code"]), f"{_gib(r['total_per_device'])} / {_gib(r['hbm_per_device'])}"]
        flops = ["-"] * 3 if r["xla_flops"] is None else [
            f"{r['xla_flops']:.3e}", f"{r['model_flops']:.3e}", f"{r['xla_flops'] / r['model_flops']:.2f}"]
        cells = [row.name, f"{row.model} ({r['params'] / 1e9:.2f}B)", f"{r['topology']} ({r['devices']} x "
                 f"{r['device_kind']})", mesh, options, *memory, "yes" if r["fits"] else "**no**", *flops,
                 f"{r['compile_seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
        commands.append(f"{row.name}:\n    {row.command}")
    return "\n".join(lines) + "\n\nCommands:\n\n```\n" + "\n".join(commands) + "\n```"


def _extra(table: str, r: dict) -> list[str]:
    """The cells a scale table adds: the pipeline's bubble, or the blocks splash attention computes."""
    if table == "pipeline":
        p = r.get("pipeline")
        return ["-" if p is None else f"{p['stages']} x {p['microbatches']}: {p['bubble']:.1%}"]
    if table == "sparse":
        b = r.get("splash_blocks")
        return ["-", "-"] if b is None else [f"{b['computed']} / {b['causal']} ({b['computed'] / b['causal']:.3f})",
                                             f"{b['forward_flops']:.3e}"]
    return []


EXTRA_HEADS = {"pipeline": ["stages x micro-batches: bubble"],
               "sparse": ["blocks computed / causal blocks", "attention FLOPs of those blocks (forward)"]}


def _option(binding: str) -> str:
    """A binding as a table shows it: 'GPT2Config.max_length = 8192' -> 'max_length = 8192' (a macro as it is)."""
    name, value = binding.split("=", 1)
    return f"{name.strip().rsplit('.', 1)[-1]} ={value}"


def _scale_markdown(results: dict[str, dict], table: str) -> str:
    """A pipeline, context or sparse table: the mesh as its axes above 1, the options that differ between its
    rows (those all rows share are listed below it), and its extra cells."""
    rows = [row for row in ROWS if row.table == table and row.name in results]
    shared = set.intersection(*(set(row.bindings) for row in rows)) if rows else set()
    head = ["row", "model (params)", "topology", "mesh", "options", "arguments", "temporaries",
            "total / HBM per device (GiB)", "fits", *EXTRA_HEADS.get(table, []), "XLA FLOPs", "compile (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        r, m = results[row.name], results[row.name]["memory"]
        mesh = ", ".join(f"{axis}={n}" for axis, n in r["mesh"].items() if n > 1)
        options = ", ".join(_option(b) for b in row.bindings
                            if b not in shared and not b.startswith("MeshConfig.axes")) or "-"
        total = f"{_gib(r['total_per_device'])} / {_gib(r['hbm_per_device'])}"
        memory = ["-", "-", f"out of memory: {r['compiler_error']}"] if m is None else [
            _gib(m["arguments"]), _gib(m["temporaries"]), total]
        flops = "-" if r["xla_flops"] is None else f"{r['xla_flops']:.3e}"
        cells = [row.name, f"{row.model} ({r['params'] / 1e9:.2f}B)", f"{r['topology']} ({r['devices']} x "
                 f"{r['device_kind']})", mesh, options, *memory, "yes" if r["fits"] else "**no**",
                 *_extra(table, r), flops, f"{r['compile_seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    common = ", ".join(_option(b) for b in sorted(shared)) or "-"
    commands = "\n".join(f"{row.name}:\n    {row.command}" for row in rows)
    return "\n".join(lines) + f"\n\nEvery row: {common}.\n\nCommands:\n\n```\n{commands}\n```"


SCALE_TABLES = ("pipeline", "context", "context_t5", "sparse", "long_models")


def tables() -> dict[str, str]:
    """Each table of docs/aot_compile.md, from docs/aot_compile.json."""
    results = json.loads(RESULTS.read_text())
    return {table: (_scale_markdown if table in SCALE_TABLES else _markdown)(results, table) + "\n"
            for table in TABLES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [r.name for r in ROWS]
    parser.add_argument("--only", nargs="+", choices=names, help="rows to compile (default: all)")
    parser.add_argument("--render", action="store_true", help="only rebuild the table from the saved results")
    parser.add_argument("--row", choices=names, help=argparse.SUPPRESS)  # one row, in this process
    args = parser.parse_args()
    if args.row:
        record = compile_row(next(r for r in ROWS if r.name == args.row))
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        RESULTS.write_text(json.dumps({**results, args.row: record}, indent=1) + "\n")
        print(f"  fits: {record['fits']}, compiled in {record['compile_seconds']} s", flush=True)
        return
    if not args.render:
        for name in args.only or names:
            print(f"{name}: {next(r for r in ROWS if r.name == name).command}", flush=True)
            # A fresh process per row: one compile of the unrolled 11B step peaks at ~13 GB of host memory.
            subprocess.run([sys.executable, __file__, "--row", name], check=True)
    results_files.rewrite_tables(TABLE, SCRIPT, tables())


if __name__ == "__main__":
    main()
