"""What a test needs from the machine (Horovod, network namespaces, torch_xla's environment):
missing, it is skipped with the reason, or failed where the test command installed it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def skip_or_fail(flag: str, message: str) -> NoReturn:
    """Skip the test for ``message`` (what is missing, and how to get it), or fail it when
    ``AIKIT_REQUIRE_<flag>=1``: scripts/test.sh sets it where it installs the capability, so a
    broken install cannot pass as a skip."""
    if os.environ.get(f"AIKIT_REQUIRE_{flag}") == "1":
        pytest.fail(f"AIKIT_REQUIRE_{flag}=1 but {message}")
    pytest.skip(message)
