"""Which updates were applied: known on the host, or flagged on the device and read when asked.

Every aikit torch optimizer counts the updates it applied (what an ``UpdateScheduler``, a trace's
warmup or AutoLRS count) and those skipped for an inf/NaN gradient. Where the update ran on the
host the outcome is known at once (:meth:`Outcomes.record`). A fused optimizer handed the inf/NaN
flag skips inside its kernel (:mod:`aikit.runtime.Torch.amp`): its outcomes stay on the device,
summed there (:meth:`Outcomes.flag`), until someone asks (:meth:`Outcomes.settle`: one read for
all of them); without AMP a read is due at the latest every ``max_skips_in_a_row`` updates, so
that a run of skips is refused in time (:meth:`Outcomes.due`).
"""

from __future__ import annotations

import torch

from aikit.core.skips import SkipCount

ON_DEVICE = "found on the device by the fused optimizer's check"
MAX_UNREAD = 100  # without max_skips_in_a_row, the flags are read at least this often


class Outcomes:
    """The updates ``applied``, whether the last was (``stepped``), and the ``skips``."""

    def __init__(self, skips: SkipCount) -> None:
        self.skips = skips
        self.applied = 0  # updates applied (skips not counted)
        self.stepped = False  # whether the last update was applied
        self._unread: tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, bool] | None = None

    def record(self, stepped: bool) -> bool:
        """An update whose outcome the host knows (the flags before it read first)."""
        self.settle()
        self.applied += stepped
        self.stepped = stepped
        return stepped

    def flag(self, found: torch.Tensor, by_amp: bool) -> None:
        """An update a fused optimizer decided on the device from ``found`` (nonzero: skipped, by
        AMP's scaler with ``by_amp``, else for a non-finite gradient): summed there, not read."""
        flag = (found > 0).to(torch.int64)
        updates, skips, in_a_row, _, _ = self._unread or (0, 0, 0, None, by_amp)
        self._unread = (updates + 1, skips + flag, (in_a_row + flag) * flag, flag, by_amp)

    def due(self) -> bool:
        """Whether the non-finite flags must be read now, lest a run of skips go on unrefused."""
        return (self._unread is not None and not self._unread[4]
                and self._unread[0] >= (self.skips.max_in_a_row or MAX_UNREAD))

    def settle(self) -> bool:
        """Whether the last update was applied, the flags kept on the device read first (one read
        for all; nothing to read otherwise) and their skips counted, warned about or refused."""
        if self._unread is not None:
            (updates, skips, in_a_row, last, by_amp), self._unread = self._unread, None
            skipped, in_a_row, last_skipped = torch.stack([skips, in_a_row, last]).tolist()  # the one read
            self.applied += updates - skipped
            self.stepped = not last_skipped
            if by_amp:
                self.skips.amp_skipped(skipped)
            elif skipped:
                self.skips.nonfinite(ON_DEVICE, count=skipped, last_in_a_row=in_a_row, updates=updates)
            else:
                self.skips.applied()
        return self.stepped
