"""Probing frozen models: every layer's hidden states and attention maps, ELMo's scalar mix, linear probes
per layer, LAMA-style cloze probing, and attention statistics (what `ptmjax probe` runs)."""
