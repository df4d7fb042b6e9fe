"""Where models live on disk: a model folder (`model_dir.py`: its config, tokenizer, generation ids, base
folder and parameters), its Orbax checkpoints (`checkpoints.py`: the train state and the data position, saved
asynchronously) and what is done with a damaged one (`damaged_checkpoints.py`: set aside, resume from the
next). Training writes here; loading, inference, evaluation, conversion and probing read here.
"""
