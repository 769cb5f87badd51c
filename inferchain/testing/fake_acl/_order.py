"""FakeAcl's happens-before ledger: races are found from the order of calls, never by timing.

Each stream numbers the tasks it is given (1, 2, ...). A *clock* maps a stream handle to
the last task number that is known complete (the host's clock, advanced by
`synchronize_stream` and `synchronize_event`) or ordered before (a stream's clock, advanced
by `stream_wait_event`; a stream is always ordered after its own earlier tasks). Device
memory and models remember, per stream, the last task that read or wrote them. An access is
legal only when every conflicting earlier access by another stream is in the accessor's
clock, so a missing synchronisation fails on every run, however fast the fake device was.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

Clock = dict[int, int]  # stream handle -> task number (1-based)


def merge(into: Clock, other: Mapping[int, int]) -> None:
    """Advance `into` to cover `other` as well."""
    for handle, seq in other.items():
        if seq > into.get(handle, 0):
            into[handle] = seq


def unordered(accesses: Mapping[int, int], clock: Mapping[int, int], own: int = 0) -> list[int]:
    """Streams whose last access is not ordered before an observer with `clock` (`own`: the
    observer's own stream, ordered by stream order)."""
    return [h for h, seq in accesses.items() if h != own and clock.get(h, 0) < seq]


@attrs.define(eq=False)
class Accesses:
    """Per stream, the last task that read and that wrote one object (memory, a model)."""

    reads: Clock = attrs.Factory(dict)
    writes: Clock = attrs.Factory(dict)

    def conflicts(self, clock: Mapping[int, int], *, write: bool, own: int = 0) -> list[int]:
        """Streams racing an access: earlier writes for a read; reads and writes for a write."""
        found = unordered(self.writes, clock, own)
        if write:
            found += [h for h in unordered(self.reads, clock, own) if h not in found]
        return found

    def note(self, stream: int, seq: int, *, write: bool) -> None:
        (self.writes if write else self.reads)[stream] = seq
