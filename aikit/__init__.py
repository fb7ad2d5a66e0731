"""aikit: elastic batch sizes for PyTorch and TensorFlow/Keras, with the learning rate kept right.

``import aikit`` loads no framework; ``aikit.elastic.Torch`` or ``aikit.elastic.TF`` (and the
other per-framework packages) load theirs when imported.
"""

__version__ = "0.1.0"
