"""Which updates were applied: known on the host, or flagged on the device and read when asked.

Every aikit torch optimizer counts the updates it applied (what an ``UpdateScheduler``, a trace's
warmup or AutoLRS count) and those skipped for an inf/NaN gradient. Where the update ran on the
host the outcome is known at once (:meth:`Outcomes.record`). A fused optimizer handed the inf/NaN
flag skips inside its kernel (:mod:`aikit.runtime.Torch.amp`): its flags stay on the device, as
they are (:meth:`Outcomes.flag`: no work added to the update), until someone asks (:meth:`Outcomes.settle`: one read for
all of them); a read is due at the latest every ``max_skips_in_a_row`` updates, AMP's included, so
that a run of skips is refused in time (every ``MAX_UNREAD`` without a limit: :meth:`Outcomes.due`).
"""

from __future__ import annotations

from typing import Any

import torch

from aikit.core.skips import SkipCount
from aikit.runtime.Torch import amp

ON_DEVICE = "found on the device by the fused optimizer's check"
MAX_UNREAD = 100  # the flags are read at least this often (without max_skips_in_a_row)


class Outcomes:
    """The updates ``applied``, whether the last was (``stepped``), and the ``skips`` (the flags
    come from AMP's ``scaler`` where it scales, else from aikit's finiteness check)."""

    def __init__(self, skips: SkipCount, scaler: Any = None) -> None:
        self.skips = skips
        self.scaler = scaler if amp.enabled(scaler) else None  # its flags: by AMP's scaler, else by aikit's check
        self.applied = 0  # updates applied (skips not counted)
        self.stepped = False  # whether the last update was applied
        self._unread: list[torch.Tensor] = []  # the inf/NaN flags of updates decided on the device, in order

    def record(self, stepped: bool) -> bool:
        """An update whose outcome the host knows (the flags before it read first)."""
        self.settle()
        self.applied += stepped
        self.stepped = stepped
        return stepped

    def flag(self, found: torch.Tensor) -> None:
        """An update a fused optimizer decided on the device from ``found`` (nonzero: skipped):
        kept there as it is, not read, no work added to the update."""
        self._unread.append(found)

    def due(self) -> bool:
        """Whether the flags must be read now: lest a run of non-finite skips go on unrefused, and
        lest they pile up where nobody asks."""
        limit = self.skips.max_in_a_row
        return len(self._unread) >= (MAX_UNREAD if limit is None else limit - self.skips.in_a_row)

    def settle(self) -> bool:
        """Whether the last update was applied, the flags kept on the device read first (one read
        for all; nothing to read otherwise) and their skips counted, warned about or refused."""
        if self._unread:
            flags, self._unread = self._unread, []
            skips = (torch.stack(flags) > 0).tolist()  # the one read
            skipped = sum(skips)
            in_a_row = next((i for i, skip in enumerate(reversed(skips)) if not skip), len(skips))
            self.applied += len(flags) - skipped
            self.stepped = not skips[-1]
            if skipped and self.scaler is not None:
                self.skips.amp_skipped(self.scaler.get_scale, skipped, last_in_a_row=in_a_row, updates=len(flags))
            elif skipped:
                self.skips.nonfinite(ON_DEVICE, count=skipped, last_in_a_row=in_a_row, updates=len(flags))
            else:
                self.skips.applied()
        return self.stepped
