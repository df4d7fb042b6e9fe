"""BitFit (Ben Zaken et al., 2022): fine-tune only the bias terms, `train.trainable = [BITFIT_PARAMS]`.

The bias terms are every parameter named 'bias': the biases of the dense
layers (attention query, key, value and output, the MLP, the heads) and the
LayerNorm offsets, as BitFit's "all bias terms" setting trains them. BERT,
RoBERTa, ALBERT, ELECTRA, BART and GPT-2 have them; T5 (v1.0, v1.1, Switch)
has none: its dense layers are bias-free and its RMS norms have no offset, so
the pattern matches nothing there and BitFit does not apply to T5.
"""

BITFIT_PARAMS = r"^(.*/)?bias$"  # paths as ptmjax.tree_paths.path_name names them, e.g. 'layers_0/attention/query/bias'
