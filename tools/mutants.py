"""Mutation check of the acl backend: each mutation below is a bug a real card would punish;
the acl tests, run on FakeAcl, must fail (kill it) for every one.

Each mutation is applied alone to a copy of the package in a temporary folder (the working
tree is never touched), and the acl tests run against that copy. Exit status 1 names every
mutation that survived. The list is documented in docs/backends.md ("Mutation check"); this
script refuses to run when the two disagree.

Run: `make mutants` or `python tools/mutants.py [--only NAME ...]`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "backends.md"
TESTS = [  # the fast ones first: -x stops at the first failure
    "tests/test_acl_constants.py",
    "tests/test_acl_handover.py",
    "tests/test_acl_reports.py",
    "tests/test_backend_acl.py",
    "tests/test_acl_chain.py",
    "tests/test_acl_sequences.py",
    "tests/test_fake_acl_samples.py",
]
ACL = "inferchain/backends/acl.py"
BUFFERS = "inferchain/backends/acl_buffers.py"
STATE = "inferchain/backends/acl_state.py"
GEARS = "inferchain/backends/acl_gears.py"
CONSTANTS = "inferchain/backends/acl_constants.py"
HANDOVER = "inferchain/backends/acl_handover.py"
REPORT = "inferchain/testing/fake_acl/_report.py"  # the fake itself: its new surface
MDL = "inferchain/testing/fake_acl/_mdl.py"
TIMEOUT_S = 600


@attrs.frozen
class Mutation:
    """Replace `old` (exactly once in `path`) by `new`."""

    name: str
    path: str
    old: str
    new: str


def _callback_moved() -> tuple[str, str]:
    """(old, new) of the completion callback launched before the D2H copies it must follow:
    the span from the copies to the launch, and the launch moved to its start."""
    text = (REPO / ACL).read_text(encoding="utf-8")
    launch = text[text.index("        if self._reports is not None:  # its callback") :]
    launch = launch[: launch.index("\n", launch.index("rt.launch_callback")) + 1]
    span = text[text.index("        counts = []\n") : text.index(launch) + len(launch)]
    return span, launch + span[: -len(launch)]


MUTATIONS = [
    Mutation(
        "skip-set-context",
        ACL,
        "ret: int = self._acl.rt.set_context(self._context)",
        "ret: int = ACL_SUCCESS",
    ),
    Mutation(
        "no-set-context-at-launch",
        ACL,
        '            self._call(self._make_current(), "rt.set_context")\n'
        "            data = [buffer_set.in_slots[i] for i in self._data_index]",
        "            data = [buffer_set.in_slots[i] for i in self._data_index]",
    ),
    Mutation(
        "wrong-teardown-order",
        ACL,
        "        for buffer_set in self._sets:\n"
        "            buffer_set.release(acl, attempt)\n"
        "        if self._state is not None:\n"
        "            self._state.release(acl, attempt)\n"
        "            self._state = None\n"
        "        if self._constants is not None:\n"
        "            self._constants.release(acl, attempt)\n"
        "            self._constants = None\n"
        "        for pool in self._pools.values():  # the blocks no consumer is reading\n"
        "            pool.close(attempt)\n"
        "        self._pools = {}\n"
        "        for buffer_set in self._sets:\n"
        "            if buffer_set.stream:\n"
        '                attempt(rt.destroy_stream(buffer_set.stream), "rt.destroy_stream")\n'
        "                buffer_set.stream = 0\n",
        "        for buffer_set in self._sets:\n"
        "            if buffer_set.stream:\n"
        '                attempt(rt.destroy_stream(buffer_set.stream), "rt.destroy_stream")\n'
        "                buffer_set.stream = 0\n"
        "        for buffer_set in self._sets:\n"
        "            buffer_set.release(acl, attempt)\n"
        "        if self._state is not None:\n"
        "            self._state.release(acl, attempt)\n"
        "            self._state = None\n"
        "        if self._constants is not None:\n"
        "            self._constants.release(acl, attempt)\n"
        "            self._constants = None\n"
        "        for pool in self._pools.values():  # the blocks no consumer is reading\n"
        "            pool.close(attempt)\n"
        "        self._pools = {}\n",
    ),
    Mutation(
        "missing-sync-before-reading-outputs",
        ACL,
        "ret = self._acl.rt.synchronize_stream(buffer_set.stream)\n"
        '                self._call(ret, f"rt.synchronize_stream (stream',
        'ret = ACL_SUCCESS\n                self._call(ret, f"rt.synchronize_stream (stream',
    ),
    Mutation(
        "sync-the-wrong-stream",
        ACL,
        "ret = self._acl.rt.synchronize_stream(buffer_set.stream)\n"
        '                self._call(ret, f"rt.synchronize_stream (stream',
        "ret = self._acl.rt.synchronize_stream(self._sets[0].stream)\n"
        '                self._call(ret, f"rt.synchronize_stream (stream',
    ),
    Mutation(
        "no-sync-at-teardown",
        ACL,
        'attempt(rt.synchronize_stream(buffer_set.stream), "rt.synchronize_stream")',
        "None",
    ),
    Mutation(
        "no-event-wait-between-executions",
        ACL,
        "if previous is not None and previous is not buffer_set:",
        "if False:",
    ),
    Mutation(
        "numpy-int-count",
        ACL,
        "count = math.prod(shape) * slot.dtype.itemsize",
        "count = np.prod(shape) * slot.dtype.itemsize",
    ),
    Mutation(
        "keyword-args",
        BUFFERS,
        "rt.malloc(slot.size, ACL_MEM_MALLOC_HUGE_FIRST)",
        "rt.malloc(size=slot.size, policy=ACL_MEM_MALLOC_HUGE_FIRST)",
    ),
    Mutation("init-with-none", ACL, "ret = acl.init()", "ret = acl.init(None)"),
    Mutation(
        "unaligned-async-copy",
        ACL,
        "slot.ptr, slot.size, slot.host_ptr, count, ACL_MEMCPY_HOST_TO_DEVICE, stream",
        "slot.ptr, slot.size, array.ctypes.data, count, ACL_MEMCPY_HOST_TO_DEVICE, stream",
    ),
    Mutation(
        "per-batch-malloc",
        ACL,
        "            count = self._stage(array, slot, rows, axis, run)\n",
        "            count = self._stage(array, slot, rows, axis, run)\n"
        "            rt.malloc(slot.size, 0)\n",
    ),
    Mutation(
        "swapped-datasets",
        ACL,
        "self._model_id, buffer_set.in_dataset, buffer_set.out_dataset, stream",
        "self._model_id, buffer_set.out_dataset, buffer_set.in_dataset, stream",
    ),
    Mutation(
        "no-input-copy",
        ACL,
        "            ret = rt.memcpy_async(\n"
        "                slot.ptr, slot.size, slot.host_ptr, count,",
        "            ret = ACL_SUCCESS if slot else rt.memcpy_async(\n"
        "                slot.ptr, slot.size, slot.host_ptr, count,",
    ),
    Mutation(
        "gear-too-small",
        ACL,
        "bisect.bisect_left(self._batch_gears, rows)",
        "bisect.bisect_left(self._batch_gears, rows) - 1",
    ),
    Mutation(
        "gear-cached-across-sets",
        ACL,
        "if gear != buffer_set.gear:",
        "if gear != self._sets[0].gear:",
    ),
    Mutation(
        "one-staging-buffer-for-all-sets",
        ACL,
        "        data = [buffer_set.in_slots[i] for i in self._data_index]\n        for k, (array",
        "        data = [self._sets[0].in_slots[i] for i in self._data_index]\n"
        "        for k, (array",
    ),
    Mutation(
        "free-without-destroying-data-buffers",
        BUFFERS,
        'attempt(acl.destroy_data_buffer(slot.buffer), "destroy_data_buffer")',
        "None",
    ),
    Mutation(
        "dims-gear-too-small",
        GEARS,
        "if gear.batch < rows or",
        "if gear.batch < rows - 1 or",
    ),
    Mutation(
        "batch-axis-staged-unpadded",
        ACL,
        "        if axis and rows != run:\n",
        "        if False:\n",
    ),
    Mutation(
        "outputs-not-cut-on-their-batch-axis",
        ACL,
        "out = out[(slice(None),) * axis + (slice(0, launched.rows),)]",
        "out = out",
    ),
    Mutation(
        "state-blocks-ignored",
        STATE,
        "            for block in range(c.outer):\n                at =",
        "            for block in range(1):\n                at =",
    ),
    Mutation(
        "constant-read-from-each-rows-own-lane",
        CONSTANTS,
        "        homes = rows.homes\n",
        "        homes = rows.write\n",
    ),
    Mutation(
        "constant-lane-not-padded",
        CONSTANTS,
        "            if size < held:\n",
        "            if False:\n",
    ),
    Mutation(
        "constant-fed-every-step",
        ACL,
        "            if k in carried or k in held:",
        "            if k in carried:",
    ),
    Mutation(
        "callback-before-the-output-copies",
        ACL,
        *_callback_moved(),
    ),
    Mutation(
        "collect-without-waiting-for-the-callback",
        ACL,
        "                self._reports.wait(buffer_set.index)\n",
        "                pass\n",
    ),
    Mutation(
        "handover-block-not-pinned",
        HANDOVER,
        "        if not lease.pin():\n",
        "        if False:\n",
    ),
    Mutation(
        "handover-given-back-before-the-copy",
        HANDOVER,
        "        pinned.append(lease)\n",
        "        pinned.append(lease)\n        lease.release()\n",
    ),
    Mutation(
        "handover-unpinned-before-the-sync",
        ACL,
        "            if self._reports is not None:\n                self._reports.wait(",
        "            unpin(buffer_set.pinned, self._model.name)\n"
        "            buffer_set.pinned = []\n"
        "            if self._reports is not None:\n                self._reports.wait(",
    ),
    Mutation(
        "handover-rows-from-the-first-row",
        HANDOVER,
        "        src = leases[start].ptr + column[start].row * size\n",
        "        src = leases[start].ptr\n",
    ),
    Mutation(
        "handover-blocks-kept-at-close",
        HANDOVER,
        "                if block.pins == 0 and block.ptr:\n",
        "                if False:\n",
    ),
    Mutation(
        "fake-callback-before-its-stream-work",
        REPORT,
        "    synchronized(st, report.clock)\n",
        "",
    ),
    Mutation(
        "fake-callback-without-subscription",
        REPORT,
        "            if tid is None:\n",
        "            if False:\n",
    ),
    Mutation(
        "fake-gear-sized-buffers-refused",
        MDL,
        "        gear = self._dataset(in_ds).gear  # a dynamic run: GE checks no sizes\n",
        "        gear = None\n",
    ),
]


def documented() -> list[str]:
    """The mutation names docs/backends.md lists (`- \\`name\\`: ...` under its heading)."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("### Mutation check", 1)[-1].split("\n## ", 1)[0]
    return re.findall(r"^- `([a-z0-9-]+)`", section, flags=re.MULTILINE)


def apply(root: Path, mutation: Mutation) -> None:
    path = root / mutation.path
    text = path.read_text(encoding="utf-8")
    if text.count(mutation.old) != 1:
        raise SystemExit(f"{mutation.name}: the text to mutate is not in {mutation.path} once")
    path.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")


def run_tests(root: Path) -> tuple[bool, str]:
    """Run the acl tests against the package copy under `root`: (passed, last output)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    where = subprocess.run(  # run from `root`: the current folder comes first on sys.path
        [sys.executable, "-c", "import inferchain; print(inferchain.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(root)):
        raise SystemExit(f"the copy is not what gets imported ({where}); cannot run mutants")
    config = ["-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO)]
    tests = [str(REPO / t) for t in TESTS]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *config, *tests],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return False, "timed out"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", help="run these mutations only")
    args = parser.parse_args()
    names = [m.name for m in MUTATIONS]
    if documented() != names:
        raise SystemExit(f"docs/backends.md lists {documented()}, this script has {names}")
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    survivors = []
    with tempfile.TemporaryDirectory(prefix="inferchain-mutants-") as tmp:
        pristine = Path(tmp) / "pristine"
        shutil.copytree(REPO / "inferchain", pristine / "inferchain")
        passed, summary = run_tests(pristine)
        if not passed:
            raise SystemExit(f"the acl tests fail without any mutation: {summary}")
        for mutation in chosen:
            root = Path(tmp) / mutation.name
            shutil.copytree(pristine, root)
            apply(root, mutation)
            started = time.perf_counter()
            passed, summary = run_tests(root)
            verdict = "SURVIVED" if passed else "killed"
            took = time.perf_counter() - started
            print(f"{mutation.name:40s} {verdict:8s} {took:5.1f}s  {summary}", flush=True)
            if passed:
                survivors.append(mutation.name)
            shutil.rmtree(root)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutations killed")
    if survivors:
        raise SystemExit(f"mutations that survived: {', '.join(survivors)}")


if __name__ == "__main__":
    main()
