"""`with` for everything that has a `close()`: one `__enter__` / `__exit__` pair to inherit."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """A base class: `with thing:` gives `thing` and calls `thing.close()` at the end, also
    when the block raises. A subclass that must start something first overrides `__enter__`."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
