"""Compressing a model: a smaller or faster one that computes nearly what it computed.

- Knowledge distillation: distillation (the train step's objective, `train.objective = @Distillation()`),
  distillation_losses (each paper's loss), distillation_weights (each term's weight, or its schedule),
  layer_maps (which teacher layer each student layer learns from), teacher (the frozen teacher in the run's
  extra state), student_init (a student starting from its teacher's layers), hidden_projection (TinyBERT's
  learned projection for a student of another width).
- Quantization: quantization_scheme (int8, int4, nf4, ternary, binary), quantization (the stored integers:
  `quantized(model)`), fake_quantization (training with them: `fake_quantized(model)`), float_model (the float
  model that computes what an adapted one computes, for export and QLoRA's merge).
- Pruning: magnitude_masks, magnitude_pruning and pruning_schedule (weights, one-shot or gradual, as extra
  state); head_masks, head_importance and head_pruning (attention heads); layerdrop (whole layers).
- Dynamic inference: early_exit, early_exit_loss, early_exit_policies, early_exit_runner and
  early_exit_evaluation (DeeBERT, PABEE); token_dropping and token_dropping_evaluation (PoWER-BERT).
"""
