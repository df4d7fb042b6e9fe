"""Test session setup: emulate an 8-device mesh on the CPU before JAX starts."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
