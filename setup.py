"""ptmjax: pre-training and adapting pre-trained language models in JAX/Flax."""

import setuptools

CORE = [
    "jax[cpu]>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "chex>=0.1.92,<0.2",
    "gin-config>=0.5.0,<0.6",
    "seqio==0.0.20",
    "tensorflow>=2.21,<2.22",
    "tensorflow-text>=2.21.1,<2.22",
    "tensorflow-datasets>=4.9.10,<4.10",
    "sentencepiece>=0.2.1,<0.3",
    # Byte-level BPE and WordPiece vocabularies of imported models (ptmjax/data/hf_tokenizer_vocabulary.py).
    "tokenizers>=0.23,<0.24",
    "tensorboard>=2.21,<2.22",
    "matplotlib>=3.9,<4",
    "tqdm>=4.66,<5",
    "rich>=13,<16",
    # Evaluation metrics (ptmjax/metrics.py); nltk is rouge_score's tokenizer dependency.
    "scikit-learn>=1.9,<2",
    "scipy>=1.17,<2",
    "sacrebleu>=2.6,<3",
    "rouge-score>=0.1.2,<0.2",
    "nltk>=3.10,<4",
    # Quantization's numerics (ptmjax/compress/quantization.py): pure Python over jax and flax.
    "qwix>=0.1.8,<0.2",
]

HARNESS = ["lm-eval>=0.4.13,<0.5"]

setuptools.setup(
    name="ptmjax",
    version="0.1.0",
    description=__doc__,
    packages=setuptools.find_packages(include=["ptmjax", "ptmjax.*"]),
    python_requires=">=3.11,<3.13",
    install_requires=CORE,
    extras_require={
        # gensim ships the word-vector sets that ptmjax/evaluation/word_vectors.py reads (analogies, WordSim-353,
        # SimLex-999), and is the reference its tests compare with.
        "test": ["pytest>=8,<10", "pytest-timeout>=2.3,<3", "pytest-xdist>=3.6,<4", *HARNESS, "gensim>=4.4,<4.5"],
        "hf": ["torch==2.13.0", "transformers>=5.20,<6", "safetensors>=0.4,<1"],
        # The TPU runtime and compiler that jax 0.10.2's `jax[tpu]` extra pins; `ptmjax compile` needs only this
        # (no TPU) to compile for TPU topologies.
        "tpu": ["libtpu==0.0.42.*"],
        # lm-evaluation-harness's tasks on ptmjax models (ptmjax/inference/harness.py, `ptmjax eval --harness`);
        # without torch, which only its own `hf` extra pulls in.
        "harness": HARNESS,
        # The documentation site (docs/documentation.md): Sphinx with MyST Markdown, the API reference by autodoc2.
        "docs": ["sphinx>=9.0,<10", "myst-parser>=5.0,<6", "sphinx-autodoc2>=0.5,<0.6", "sphinx-book-theme>=1.4,<2"],
    },
    entry_points={"console_scripts": ["ptmjax=ptmjax.cli:main"]},
)
