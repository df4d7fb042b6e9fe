"""Reading TensorBoard event files back, for the tests of what runs log."""

import os


def tensorboard_scalars(folder):
    """{tag: {step: value}} of the event files in one TensorBoard run folder."""
    import tensorflow as tf

    scalars = {}
    for name in os.listdir(folder):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars
