"""B9 of BENCHMARKS.md: beam-search romanization of thousands of name units.

Sides, interleaved (A B ...) after a warm-up round, on the same units from the package's
own names.sqlite3, on the same cores (the machine's 2):
  package     arabic_name_romanizer's OnnxModel.transliterate_units (batch_size 256, dedupe
              off; `--threads` intra-op threads, its 2 by default): each batch of 256 names
              decoded in lock step until its last name ends
  continuous  the ideal hand-written loop (recipes/romanize/ideal.py; `--threads` threads):
              the same encoder batches, then decoder steps over `--slots` live names, a
              finished name's slot refilled at once
  inferchain  the recipe (recipes/romanize): `oi.run(units)`; the encoder in the package's
              batches (`batching: fill`, one thread), one decoder sequence of 2 beams per
              unit, the steps of every live unit batched together on two one-thread
              decoder instances (the recipe's own session options)
Target: inferchain >= 1.3x the package. Every side's hypotheses (texts and scores) must be
identical to the package's.
Run: `python benchmarks/bench_romanize.py [--quick]`; writes benchmarks/results/bench_romanize.json
(a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from common import interleave, median, table, timed, write_results

import inferchain as ic

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "romanize"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 units, 1 round")
    parser.add_argument("--units", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slots", type=int, default=128, help="live names in the loop")
    parser.add_argument(
        "--threads", type=int, default=2, help="intra-op threads of the package and the loop"
    )
    args = parser.parse_args()
    n, rounds = (512, 1) if args.quick else (args.units, args.rounds)

    beam = ic.import_recipe_module(RECIPE, "beam")
    ideal = ic.import_recipe_module(RECIPE, "ideal")
    units = ideal.sample_units(n)
    spec = beam.BeamSpec.from_dir()
    model = ideal.package_model(threads=args.threads)
    encoder, decoder = ideal.open_sessions(args.threads)
    outputs: dict[str, list[Any]] = {}

    def package() -> None:
        outputs["package"] = ideal.package_hypotheses(model, units)

    def continuous() -> None:
        outputs["continuous"] = ideal.continuous_hypotheses(
            encoder, decoder, spec, units, args.slots
        )

    oi = ic.OfflineInference(ic.load_recipe(RECIPE)).init()

    def recipe() -> None:
        outputs["inferchain"] = list(oi.run(units))

    sides = {
        "package": timed(package),
        "continuous": timed(continuous),
        "inferchain": timed(recipe),
    }
    try:
        samples_s = interleave(sides, rounds)
        steps = oi.stats().models["decoder"].sequences
    finally:
        oi.close()
    identical = {name: out == outputs["package"] for name, out in outputs.items()}
    secs = {k: median(v) for k, v in samples_s.items()}
    rows = [("side", "seconds", "names/s", "x package", "identical")]
    for name, s in secs.items():
        rows.append(
            (name, f"{s:.3f}", f"{n / s:.0f}", f"{secs['package'] / s:.2f}", str(identical[name]))
        )
    print(f"{n} units, {rounds} rounds (medians), {args.threads} threads, {args.slots} slots")
    print(table(rows))
    path = write_results(
        "bench_romanize",
        {
            "quick": args.quick,
            "units": n,
            "rounds": rounds,
            "threads": args.threads,
            "slots": args.slots,
            "seconds": secs,
            "samples_s": samples_s,
            "names_per_s": {k: n / v for k, v in secs.items()},
            "speedup_vs_package": {
                k: median([p / s for p, s in zip(samples_s["package"], v, strict=True)])
                for k, v in samples_s.items()
            },
            "hypotheses_identical": identical,
            "target": ">= 1.3x",
            "decoder_steps": None if steps is None else steps.to_dict(),
        },
    )
    print(f"wrote {path}")
    if not all(identical.values()):
        raise SystemExit("hypotheses differ from the package's")


if __name__ == "__main__":
    main()
