"""Horovod in this process (the ``horovodrun`` launcher is in tests/conftest.py).

Horovod is optional (scripts/install_horovod.sh builds it): without it these tests skip, unless
``AIKIT_REQUIRE_HOROVOD=1`` says the environment promised it, and then they fail.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def hvd(require_horovod):
    """``horovod.torch`` initialised in this process as a world of one; shut down afterwards so
    that later tests see a single process again."""
    import horovod.torch as hvd

    hvd.init()
    yield hvd
    hvd.shutdown()
