"""Opening a plan's items, one of them ahead of time.

The next item is opened while the evaluator would otherwise wait for the agent, so loading its
env rarely sits between an ENV_CREATE and its reply. Only for plans whose items have envs of
their own (``Plan.prepare_ahead``): opening one must not touch the running item's env. An item
that fails to open ahead keeps its exception, raised when the item is asked for, where it can be
reported.
"""

from __future__ import annotations

from arbiter.server.formats.base import OpenItem, Plan


class ItemOpener:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.ahead = plan.prepare_ahead
        self.prepared: tuple[int, OpenItem | Exception] | None = None

    def pending(self, index: int) -> bool:
        """Item ``index`` may be opened ahead and is not yet."""
        return self.ahead and (self.prepared is None or self.prepared[0] != index)

    def prepare(self, index: int) -> None:
        try:
            self.prepared = (index, self.plan.open(self.plan.items[index]))
        except Exception as exc:  # raised when the item is asked for (open)
            self.prepared = (index, exc)

    def open(self, index: int) -> OpenItem:
        """Item ``index``, opened: the one prepared ahead if it is that one."""
        if self.prepared is not None and self.prepared[0] == index:
            opened, self.prepared = self.prepared[1], None
            if isinstance(opened, Exception):
                raise opened
            return opened
        return self.plan.open(self.plan.items[index])

    def discard(self) -> None:
        """The evaluation ended: an item prepared ahead will never be played."""
        self.prepared = None
