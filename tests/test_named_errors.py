"""aikit refuses with the named errors of ``aikit.core.errors``, never a bare built-in one.

Read from the source, as tests/test_layers.py reads imports: every ``raise`` of a bare
``ValueError``, ``TypeError`` or ``RuntimeError`` in aikit is named here, so a refusal a user
reads is always an ``AikitError`` (``InvalidValue``, ``InvalidType``, ``InvalidState``, ...),
which is still the built-in it replaces (``except ValueError`` keeps working).
"""

from __future__ import annotations

import ast

import pytest

from aikit.core.errors import AikitError, InvalidState, InvalidType, InvalidValue
from tests.test_layers import aikit_sources

BARE = ("ValueError", "TypeError", "RuntimeError")
# "module:line text" -> why it must stay bare; empty: every refusal of aikit has a name
ALLOWED: dict[str, str] = {}


def bare_raises(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """``module:line: raise X`` for every bare ``X`` of :data:`BARE` raised in ``sources``
    (module name -> (source text, is a package ``__init__``)), except :data:`ALLOWED`."""
    found = []
    for module, (text, _) in sorted(sources.items()):
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            allowed = f"{module}:{lines[node.lineno - 1].strip()}" in ALLOWED
            if isinstance(raised, ast.Name) and raised.id in BARE and not allowed:
                found.append(f"{module}:{node.lineno}: raise {raised.id}: raise the named error of "
                             "aikit.core.errors instead (InvalidValue, InvalidType, InvalidState)")
    return found


def test_aikit_raises_no_bare_value_type_or_runtime_error():
    sources = aikit_sources()
    assert len(sources) > 50
    assert bare_raises(sources) == []


@pytest.mark.parametrize("source", [
    "def f(x):\n    raise ValueError(f'x must be positive, got {x}')\n",
    "def f():\n    raise TypeError\n",
    "class C:\n    def step(self):\n        raise RuntimeError('call set_epoch() first') from None\n",
])
def test_a_planted_bare_raise_is_named(source):
    (found,) = bare_raises({"aikit.core.planted": (source, False)})
    assert found.startswith("aikit.core.planted:") and "raise the named error" in found


def test_named_errors_and_re_raises_pass():
    source = ("from aikit.core.errors import InvalidValue\n"
              "def f(x):\n    try:\n        g()\n    except ValueError as error:\n"
              "        raise type(error)(f'{error} (hint)') from None\n    raise InvalidValue(f'bad {x}')\n"
              "def h():\n    raise\n")
    assert bare_raises({"aikit.core.fine": (source, False)}) == []


def test_each_named_error_is_still_the_builtin_it_replaced():
    assert issubclass(InvalidValue, ValueError) and issubclass(InvalidType, (TypeError, ValueError))
    assert issubclass(InvalidState, RuntimeError) and issubclass(InvalidState, AikitError)
    assert not issubclass(InvalidState, ValueError)
