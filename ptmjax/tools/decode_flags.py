"""The DecodeConfig that `ptmjax eval` and `ptmjax infer` decode with: its gin bindings, then the flags."""

from __future__ import annotations

import argparse
import dataclasses
import re

import gin

from ptmjax.decoding import DecodeConfig
from ptmjax.gin_files import parse_gin

DECODE_FLAGS = tuple(field.name for field in dataclasses.fields(DecodeConfig))  # the flags are its field names
DECODE_BINDING = re.compile(r"\s*([\w.]+/)?([\w.]+\.)?DecodeConfig\.\w+\s*=")  # [scope/][module.]DecodeConfig.field =


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """DecodeConfig() with `args.gin_bindings`, then the decode flags that were given (not None)."""
    for binding in args.gin_bindings:
        if not DECODE_BINDING.match(binding):
            raise ValueError(f"--gin_bindings {binding!r}: eval and infer bind only DecodeConfig (e.g. "
                             "'DecodeConfig.top_k = 40'); the model is the one saved in --model_dir, so change it "
                             "with `ptmjax train` or `ptmjax convert`")
    parse_gin([], args.gin_bindings)
    try:
        config = DecodeConfig()
    finally:
        gin.clear_config()
    flags = {name: getattr(args, name) for name in DECODE_FLAGS if getattr(args, name, None) is not None}
    return dataclasses.replace(config, **flags)
