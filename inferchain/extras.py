"""Optional packages: what a recipe or a tool needs beyond the core, checked once, up front.

`require(modules, extra, what)` imports every module it is given and raises one
`MissingDependency` naming all that are missing and the command that installs them:
`pip install 'inferchain[EXTRA]'` with the extra's pins, read from inferchain's own package
metadata (so the hint never drifts from `pyproject.toml`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Iterable

from inferchain.errors import MissingDependency


def extra_pins(extra: str) -> tuple[str, ...]:
    """The requirements (with their version pins) that `inferchain[extra]` installs; () when
    inferchain's metadata is not there (a source tree on `sys.path`) or names no such extra."""
    try:
        requirements = importlib.metadata.requires("inferchain") or []
    except importlib.metadata.PackageNotFoundError:
        return ()
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    pins = []
    for requirement in requirements:
        spec, _, condition = requirement.partition(";")
        if marker.search(condition):
            pins.append(spec.strip())
    return tuple(pins)


#: modules whose package on PyPI has another name
DISTRIBUTIONS = {"cv2": "opencv-python", "PIL": "pillow", "yaml": "pyyaml"}


def install_hint(extra: str | None, modules: Iterable[str] = ()) -> str:
    """`pip install 'inferchain[EXTRA]' (its pins)`, or without an extra `pip install` of
    the modules' packages (their top-level names, or `DISTRIBUTIONS`')."""
    if extra is None:
        tops = {m.split(".")[0] for m in modules}
        return "pip install " + " ".join(sorted(DISTRIBUTIONS.get(t, t) for t in tops))
    pins = extra_pins(extra)
    listed = f" ({', '.join(pins)})" if pins else ""
    return f"pip install 'inferchain[{extra}]'{listed}"


def missing(modules: Iterable[str]) -> dict[str, str]:
    """Module -> why it does not import, for each of `modules` that does not (a missing
    package, or one whose native library is missing)."""
    found: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except (ImportError, OSError) as e:  # soundfile raises OSError without libsndfile
            found[name] = f"{type(e).__name__}: {e}"
    return found


def require(modules: Iterable[str], extra: str | None, what: str) -> None:
    """Import each of `modules`; one `MissingDependency` naming `what` needs them, every one
    that is missing, and the install command (`install_hint`)."""
    absent = missing(modules)
    if absent:
        raise MissingDependency(missing_message(what, absent, extra))


def missing_message(what: str, absent: dict[str, str], extra: str | None) -> str:
    """`WHAT needs M1, M2, which do not import here (reasons): pip install ...`."""
    names = ", ".join(absent)
    reasons = "; ".join(absent.values())
    verb = "does" if len(absent) == 1 else "do"
    return (
        f"{what} needs {names}, which {verb} not import here ({reasons}): "
        f"{install_hint(extra, absent)}"
    )
