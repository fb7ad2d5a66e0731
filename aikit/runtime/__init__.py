"""The machinery every adapter shares, under them: where a process runs, collectives, RNG
snapshots, the gradient-accumulation engine, the Keras backend and its seam, and the plan
the last ``init()`` published.

``aikit.runtime.Torch`` and ``aikit.runtime.Keras`` load their framework; this package and
:mod:`aikit.runtime.published` load none. The layers point down: ``aikit.core`` <
``aikit.runtime`` < ``aikit.ga`` < ``aikit.elastic``, ``aikit.lr_finder``, ``aikit.autolrs`` <
``aikit.integrations`` (``tests/test_layers.py`` checks every import).
"""
