"""A griffe extension for the docs site: the docstrings' Sphinx roles as Markdown.

aikit's docstrings cross-reference with Sphinx roles (:class:`~aikit.core.plan.Plan`,
:func:`aikit.elastic.Torch.init`), which mkdocstrings would print verbatim. This turns a role
naming an ``aikit.`` object into an autorefs link, so ``mkdocs build --strict`` fails on a
reference to something that does not exist, and any other role into inline code.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([\w.]+)(\(\))?`")


def markdown(match: re.Match) -> str:
    short, target, call = match.group(1), match.group(2), match.group(3) or ""
    text = target.rsplit(".", 1)[-1] if short else target
    return f"[`{text}{call}`][{target}]" if target.startswith("aikit.") else f"`{text}{call}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(markdown, obj.docstring.value)
