"""aikit inside the trainers users already run: PyTorch Lightning, the Hugging Face Trainer, Accelerate and Ray Train.

``aikit.integrations.lightning`` (extra ``lightning``), ``aikit.integrations.huggingface`` and
``aikit.integrations.accelerate`` (extra ``huggingface``) and ``aikit.integrations.ray`` (extra
``ray``) each load their trainer when imported; this package loads nothing.
"""
