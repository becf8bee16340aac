"""The trainer: ingest Fashion-MNIST, train CNN variants across workers, select and publish.

Keras 3 cannot train under MultiWorkerMirroredStrategy (keras-team/keras#20585), so the trainer
uses tf-keras: `tf.keras` must resolve to it too, before TensorFlow is first imported.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ info lines drown ours
