"""The machinery every adapter shares, under them: where a process runs, collectives, RNG
snapshots, the gradient-accumulation engine, the Keras backend and its seam, and what the
process remembers between calls (:mod:`aikit.runtime.process`: the plans ``init()`` published,
the one home of aikit's process state).

``aikit.runtime.Torch`` and ``aikit.runtime.Keras`` load their framework; this package and
:mod:`aikit.runtime.process` load none. The layers point down: ``aikit.core`` <
``aikit.runtime`` < ``aikit.ga`` < ``aikit.elastic``, ``aikit.lr_finder``, ``aikit.autolrs`` <
``aikit.integrations`` (``tests/test_layers.py`` checks every import).
"""
