"""Checkpoint conversion between ptmjax and Hugging Face transformers.

One module per family: `hf_t5`, `hf_gpt2`, `hf_bert` (BERT and RoBERTa), `hf_albert`,
`hf_electra`, `hf_bart` (BART and mBART), each with from_hf_config / to_hf_config /
hf_to_params / params_to_hf / build_hf_model and its `HEADS` (the Hugging Face classes it
converts, `hf_heads.Head`). `hf` finds them, and reads and writes whole checkpoint
directories (`hf.load`, `hf.save`); `hf_task_heads` converts the fine-tuning classes;
`checkpoint` turns directories into ptmjax model folders.
"""
