"""Model families: what every tool knows about a kind of model.

`family.py` the record (its `Kind` and the facts tools ask), `registry.py` the records and the model classes
they belong to, `model_api.py` a module bound to its record (init, rngs, loss, score, predict), `losses.py` each
family's loss over `token_loss.py`'s cross-entropy and `chunked_logits.py`, `head_predictions.py` the task
heads' predictions, `cloze_logits.py` the logits at a cloze's blank, `entries.py` where prompt and prefix tuning
enter each family's stacks.
"""
