"""What the reliability tests share: a tiny GPT-2 as transformers saves it, and mounted read-only or small disks."""

import subprocess

import pytest

from ptmjax.models import GPT2Config

TINY_GPT2 = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_length=16)


@pytest.fixture
def tiny_gpt2() -> GPT2Config:
    return TINY_GPT2


@pytest.fixture(scope="module")
def hf_gpt2_dir(tmp_path_factory):
    """A Hugging Face GPT-2 folder of `TINY_GPT2`, written by transformers' save_pretrained."""
    pytest.importorskip("transformers")
    from ptmjax.convert import hf_gpt2

    directory = tmp_path_factory.mktemp("hf_gpt2")
    hf_gpt2.build_hf_model(TINY_GPT2).save_pretrained(directory)
    return directory


@pytest.fixture
def mount():
    """mount(path, *options): mounts a tmpfs (`mount('dir', 'size=256k')`) or, with 'bind', re-mounts `path`
    read-only over itself; unmounted after the test. Skips where this process may not mount (not root)."""
    mounted = []

    def mount_at(path, *options):
        path = str(path)
        if "bind" in options:
            commands = [["mount", "--bind", path, path], ["mount", "-o", "remount,bind,ro", path]]
        else:
            commands = [["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", path]]
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                if mounted and mounted[-1] == path:
                    subprocess.run(["umount", path], capture_output=True)
                    mounted.pop()
                pytest.skip(f"cannot mount here ({done.stderr.strip()})")
            if command is commands[0]:
                mounted.append(path)

    yield mount_at
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", path], check=True)
