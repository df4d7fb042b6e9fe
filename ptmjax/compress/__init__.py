"""Compressing a model: knowledge distillation, a smaller student trained against a frozen teacher.

distillation (the train step's objective, `train.objective = @Distillation()`), distillation_losses (each
paper's loss), layer_maps (which teacher layer each student layer learns from), teacher (the frozen teacher in
the run's extra state), student_init (a student starting from its teacher's layers).
"""
