"""aikit inside the trainers users already run: PyTorch Lightning, the Hugging Face Trainer and Ray Train.

``aikit.integrations.lightning`` (extra ``lightning``), ``aikit.integrations.huggingface`` (extra
``huggingface``) and ``aikit.integrations.ray`` (extra ``ray``) each load their trainer when
imported; this package loads nothing.
"""
