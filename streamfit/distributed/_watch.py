"""Hung learners: while the coordinator waits on learners, it pings each; one that leaves a ping unanswered is hung.

A learner's worker process can stop without dying (SIGSTOP, a debugger, a deadlocked event loop, a machine
swapping): Ray sees a live process, and its calls simply never return, so the group would wait at the next
barrier for ever.  While the coordinator waits for learners' calls it sends each learner a ping
(``Learner.pid``, answered by the learner's event loop, also while a batch trains in its step thread) every
``timeout / 4`` seconds; a ping left unanswered for ``timeout`` seconds makes that learner hung
(:class:`LearnerHungError`): the coordinator kills it (Ray restarts it) and restarts the group from the last
global checkpoint, as for a learner that died.  Slow training is not a hang: the pings are answered meanwhile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from streamfit.exceptions import StreamfitError

__all__ = ["Fault", "LearnerHungError", "Watch", "DEFAULT_LEARNER_TIMEOUT"]

#: seconds a learner may leave a ping unanswered before it is declared hung (``learner_timeout``,
#: ``--learner-timeout``): well above a learner's longest legitimate pause of its event loop (restoring a state,
#: a garbage collection), well below what an operator would wait for a stuck run
DEFAULT_LEARNER_TIMEOUT = 60.0

_POLL = 0.1  # s between looks at the calls waited on


@dataclass(frozen=True)
class Fault:
    """A learner the coordinator replaced: ``kind`` is ``"died"`` (Ray reported it dead: its process, or its
    node, lost) or ``"hung"`` (its ping unanswered for ``seconds``); ``round`` is the round it was lost in."""

    learner: int
    kind: str
    round: int
    seconds: float = 0.0


class LearnerHungError(StreamfitError):
    """Learner ``learner`` left a ping unanswered for ``seconds`` (more than ``learner_timeout``)."""

    def __init__(self, learner: int, seconds: float) -> None:
        super().__init__(f"learner {learner} did not answer for {seconds:.1f} s: hung")
        self.learner = learner
        self.seconds = seconds


class Watch:
    """Waits for learners' calls, pinging the learners meanwhile (``timeout`` None: no pings, wait for ever)."""

    def __init__(self, ray: Any, timeout: float | None) -> None:
        self.ray = ray
        self.timeout = timeout
        self.interval = None if timeout is None else timeout / 4

    def wait(self, calls: Sequence[tuple[int, Any, Any]], on_poll: Callable[[], None] | None = None) -> list[Any]:
        """The results of ``calls`` (``(learner index, actor, object ref)``), in order; ``on_poll`` is called
        between looks.  Raises :class:`LearnerHungError` for a learner silent too long, Ray's error for one dead."""
        refs = [ref for _, _, ref in calls]
        pings: dict[int, tuple[Any, float]] = {}
        heard: dict[int, float] = {}
        start = time.monotonic()
        while True:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=_POLL)
            if len(ready) == len(refs):
                return list(self.ray.get(refs))
            if on_poll is not None:
                on_poll()
            if self.timeout is None or self.interval is None:
                continue
            now, done = time.monotonic(), set(ready)
            for index, actor, ref in calls:
                if ref in done:
                    pings.pop(index, None)
                    continue
                if index in pings:
                    ping, sent = pings[index]
                    if self.ray.wait([ping], timeout=0)[0]:
                        self.ray.get(ping)  # a learner that died raises Ray's error here
                        del pings[index]
                        heard[index] = now
                    elif now - sent >= self.timeout:
                        raise LearnerHungError(index, now - sent)
                if index not in pings and now - heard.get(index, start) >= self.interval:
                    pings[index] = (actor.pid.remote(), now)
