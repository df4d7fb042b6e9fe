"""Where models live on disk: a model folder (`model_dir.py`: its config, tokenizer, generation ids, base
folder and parameters), its Orbax checkpoints (`checkpoints.py`: the train state and the data position, saved
asynchronously), what is done with a damaged one (`damaged_checkpoints.py`: set aside, resume from the next),
a file or folder written whole (`written_whole.py`: beside its place, renamed in once complete), and whether a
folder takes what a run will write (`writable.py`). Training writes here; loading, inference, evaluation,
conversion and probing read here.
"""
