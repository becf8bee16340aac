"""The names of the serving contract (trainer.export's SavedModel signatures and their inputs).

Plain strings, no TensorFlow or Keras: the model server loads exports with TensorFlow alone, so it
imports these names from here instead of trainer.export, which needs tf-keras (the training stack).
"""

SERVING_SIGNATURE = "serving_default"  # tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
PIXELS_SIGNATURE = "pixels"
IMAGE_BYTES_INPUT = "image_bytes"
PIXELS_INPUT = "pixels"
# The TensorFlow that writes the exports (pyproject.toml's train extra; a test ties the two): a TF
# Serving older than it may not know the ops of its SavedModels.
EXPORTER_TENSORFLOW = (2, 21)
