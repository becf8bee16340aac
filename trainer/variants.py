"""The names of the CNN variants, importable without TensorFlow.

The pipeline and the stack config validate `variants` against these; `trainer.models` registers one
builder per name and refuses any other.
"""

VARIANTS = ("cnn", "cnn_dropout", "cnn_batchnorm")
