"""Run by test_long_lines.py in a fresh process: the peak resident memory of a text-files task's first batch.

Usage: python long_line_memory_c.py SHORT_FILE LONG_FILE HEADROOM_BYTES. The first batch of SHORT_FILE
sets the baseline; then the address space is capped at its current size plus HEADROOM_BYTES and the
first batch of LONG_FILE is read. Prints {"baseline": bytes, "peak": bytes} as JSON.
"""

import json
import resource
import sys

from ptmjax.data import pipeline
from ptmjax.tasks import pretraining


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def address_space_bytes() -> int:
    with open("/proc/self/status") as f:
        (kib,) = (line.split()[1] for line in f if line.startswith("VmSize:"))
    return int(kib) * 1024


def first_batch(name: str, path: str) -> None:
    pretraining.register_text_files_task(name, path)
    dataset = pipeline.get_dataset(name, "train", {"inputs": 32, "targets": 8}, 8, seed=0, shuffle=False)
    next(dataset.as_numpy_iterator())


if __name__ == "__main__":
    short_file, long_file, headroom = sys.argv[1], sys.argv[2], int(sys.argv[3])
    first_batch("reliability_c_short_lines", short_file)
    baseline = peak_resident_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes() + headroom, resource.RLIM_INFINITY))
    first_batch("reliability_c_long_line", long_file)
    print(json.dumps({"baseline": baseline, "peak": peak_resident_bytes()}))
