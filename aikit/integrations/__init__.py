"""aikit inside the trainers users already run: PyTorch Lightning and the Hugging Face Trainer.

``aikit.integrations.lightning`` (extra ``lightning``) and ``aikit.integrations.huggingface``
(extra ``huggingface``) each load their trainer when imported; this package loads nothing.
"""
