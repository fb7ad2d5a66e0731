"""The machinery every adapter shares, under them: where a process runs, collectives, RNG
snapshots, the gradient-accumulation engine, the Keras backend and its seam, what the process
remembers between calls (:mod:`aikit.runtime.process`: the plans ``init()`` published, the one home
of aikit's process state), and what both frameworks' adapters share without a framework (the range
test's results, the LR finders' state cache, the plots, the served names of Run:AI's classes).

``aikit.runtime.Torch`` and ``aikit.runtime.Keras`` load their framework; this package and its
modules beside them load none. The layers point down: ``aikit.core`` <
``aikit.runtime`` < ``aikit.ga`` < ``aikit.elastic``, ``aikit.lr_finder``, ``aikit.autolrs`` <
``aikit.integrations`` (``tests/test_layers.py`` checks every import).
"""
