"""Local text files as a seqio source, one document per line: checked before the first step, long lines split.

`TextFilesSource.get_dataset` first reads every file it will serve (this host's
shard of the split), once per process and file version (path, size and
modification time):

* files none of which holds any text (all empty or blank) are refused, with a
  ValueError naming them (they used to end training with a bare StopIteration);
* a file more than `BINARY_FRACTION` of whose bytes are control characters or
  invalid UTF-8 is refused as binary, with a ValueError naming it;
* invalid UTF-8 in a file that is otherwise text gives a warning naming the
  file and counting the undecodable bytes (the tokenizer reads them as unknown
  tokens, or as raw bytes with a byte vocabulary).

Then it reads the lines with seqio's `TextLineDataSource` and cuts lines longer
than `max_document_bytes` into bounded pieces (`ptmjax.data.document_pieces`).
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import re
import warnings
from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

from ptmjax.data import document_pieces

BINARY_FRACTION = 0.3
READ_BLOCK_BYTES = 1 << 20
_CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\t\n\v\f\r") + b"\x7f"
_WHITESPACE_BYTES = b" \t\n\v\f\r"
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # what 'surrogateescape' makes of each undecodable byte
_LISTED_FILES = 5


@dataclasses.dataclass(frozen=True)
class FileScan:
    """What one pass over a file found; a binary file's pass stops once it is known to be binary."""

    size: int
    undecodable_bytes: int
    control_bytes: int
    has_text: bool

    @property
    def is_binary(self) -> bool:
        return self.undecodable_bytes + self.control_bytes > BINARY_FRACTION * self.size


def scan_text_file(path: str) -> FileScan:
    """Counts a file's undecodable (invalid UTF-8) and control bytes, and whether it holds non-blank text."""
    stat = tf.io.gfile.stat(path)
    return _scan(path, stat.length, stat.mtime_nsec)


@functools.lru_cache(maxsize=4096)
def _scan(path: str, size: int, mtime_nsec: int) -> FileScan:
    """One pass over one version of a file; `size` and `mtime_nsec` key the cache, so an edited file is read again."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    undecodable = control = 0
    has_text = False
    with tf.io.gfile.GFile(path, "rb") as f:
        while block := f.read(READ_BLOCK_BYTES):
            undecodable += len(_ESCAPED_BYTE.findall(decoder.decode(block)))
            control += len(block) - len(block.translate(None, _CONTROL_BYTES))
            has_text = has_text or bool(block.translate(None, _WHITESPACE_BYTES))
            if undecodable + control > BINARY_FRACTION * size:
                break
        else:
            undecodable += len(_ESCAPED_BYTE.findall(decoder.decode(b"", final=True)))
    return FileScan(size, undecodable, control, has_text)


def _listing(files: Sequence[str]) -> str:
    more = len(files) - _LISTED_FILES
    return ", ".join(files[:_LISTED_FILES]) + (f" and {more} more" if more > 0 else "")


def check_text_files(files: Sequence[str], split: str) -> None:
    """Refuses binary files and a split without text, warns of invalid UTF-8 (see the module doc)."""
    scans = {path: scan_text_file(path) for path in files}
    for path, scan in scans.items():
        if scan.is_binary:
            raise ValueError(
                f"{path} is binary, not text: at least {scan.undecodable_bytes + scan.control_bytes:,} of its "
                f"{scan.size:,} bytes are control characters or invalid UTF-8; remove it from the {split!r} "
                "files or convert it to UTF-8 text, one document per line"
            )
    if not any(scan.has_text for scan in scans.values()):
        raise ValueError(
            f"the {split!r} files hold no text (empty or blank): {_listing(list(files))}; point the {split!r} "
            "pattern at UTF-8 text files, one document per line"
        )
    for path, scan in scans.items():
        if scan.undecodable_bytes:
            warnings.warn(
                f"{path}: {scan.undecodable_bytes:,} of its {scan.size:,} bytes are not valid UTF-8; they train as "
                "unknown tokens (raw bytes with a byte vocabulary): convert the file to UTF-8",
                stacklevel=2,
            )


class TextFilesSource(seqio.TextLineDataSource):
    """seqio's TextLineDataSource whose files are checked before reading and whose long lines are split."""

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        max_document_bytes: int = document_pieces.DEFAULT_MAX_DOCUMENT_BYTES,
    ):
        document_pieces.check_max_bytes(max_document_bytes)
        super().__init__(split_to_filepattern)
        self._max_document_bytes = max_document_bytes

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        **kwargs,
    ) -> tf.data.Dataset:
        lines = super().get_dataset(split, shuffle, seed, shard_info, **kwargs)  # refuses a pattern without files
        files = list(self.list_shards(split))
        if shard_info:  # the files this host reads: seqio shards the file list the same way
            files = files[shard_info.index :: shard_info.num_shards]
        check_text_files(files, split)
        return document_pieces.split_long_lines(lines, self._max_document_bytes)
