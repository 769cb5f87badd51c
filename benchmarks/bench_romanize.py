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
  deterministic  the same recipe with every model `deterministic: true` (`run
              --deterministic`): each encoder unit padded to 32 ids, every step batch at 512
              rows of a 64-wide `memory`; its throughput ratio to `inferchain` (B13) and
              whether its hypotheses are the package's (the encoder's padding is not)
  ceiling_*   the job's ceiling (`ceilings.py`), timed in the same rounds: the encoder in the
              package's batches and the decoder's step rows (every live beam of every step,
              counted on one run of the continuous loop, dealt to the encoder batches by
              their units) in full batches of the recipe's decoder max_batch_size at each
              encoder batch's width, on bare one-thread sessions, over the machine's cores.
              Beam search on the host is left out: the bound is the models'.
Target: inferchain >= 1.3x the package, >= 90 % of the ceiling. Every side's hypotheses
(texts and scores) must be identical to the package's.
Run: `python benchmarks/bench_romanize.py [--quick]`; writes benchmarks/results/bench_romanize.json
(a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from ceilings import bare_session, cores, cpu_bound, fraction, model_seconds
from common import deterministic_cost, interleave, median, table, timed, write_results

import inferchain as ic
from inferchain.config import deterministic

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
    det = ic.OfflineInference(deterministic(ic.load_recipe(RECIPE))).init()

    def recipe() -> None:
        outputs["inferchain"] = list(oi.run(units))

    def recipe_deterministic() -> None:
        outputs["deterministic"] = list(det.run(units))

    sides = {
        "package": timed(package),
        "continuous": timed(continuous),
        "inferchain": timed(recipe),
        "deterministic": timed(recipe_deterministic),
    }
    full = next(m for m in oi.recipe.models if m.name == "decoder").max_batch_size
    enc_feeds, dec_feeds = ceiling_feeds(beam, ideal, spec, units, encoder, decoder, full)
    res = beam.resources_dir()
    bare_encoder, bare_decoder = (
        bare_session(str(res / f)) for f in ("encoder.onnx", "decoder.onnx")
    )
    sides["ceiling_encoder"] = model_seconds(bare_encoder, enc_feeds)
    sides["ceiling_decoder"] = model_seconds(bare_decoder, dec_feeds)
    try:
        samples_s = interleave(sides, rounds)
        steps = oi.stats().models["decoder"].sequences
    finally:
        oi.close()
        det.close()
    ncores = cores()
    stages = [samples_s.pop("ceiling_encoder"), samples_s.pop("ceiling_decoder")]
    ceiling = cpu_bound(stages, ncores)
    of_ceiling = fraction(ceiling, samples_s["inferchain"])
    identical = {name: out == outputs["package"] for name, out in outputs.items()}
    secs = {k: median(v) for k, v in samples_s.items()}
    rows = [("side", "seconds", "names/s", "x package", "identical")]
    for name, s in secs.items():
        rows.append(
            (name, f"{s:.3f}", f"{n / s:.0f}", f"{secs['package'] / s:.2f}", str(identical[name]))
        )
    sec = median(ceiling)
    rows.append((f"ceiling ({ncores} cores)", f"{sec:.3f}", f"{n / sec:.0f}",
                 f"{secs['package'] / sec:.2f}", f"inferchain at {of_ceiling:.0%}"))  # fmt: skip
    print(f"{n} units, {rounds} rounds (medians), {args.threads} threads, {args.slots} slots")
    print(table(rows))
    cost = deterministic_cost(samples_s, outputs)
    print(
        f"deterministic: {cost['throughput_ratio']:.2f}x the default's throughput; "
        f"byte-identical to the default: {cost['identical_to_default']}"
    )
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
            "deterministic": cost,
            "ceiling": {
                "seconds": median(ceiling),
                "encoder_s": median(stages[0]),
                "decoder_s": median(stages[1]),
                "decoder_batches": len(dec_feeds),
                "cores": ncores,
                "inferchain_fraction": of_ceiling,
            },
        },
    )
    print(f"wrote {path}")
    if not all(v for k, v in identical.items() if k != "deterministic"):
        raise SystemExit("hypotheses differ from the package's")


class _CountingDecoder:
    """A decoder session that counts the rows of every step it runs."""

    def __init__(self, session: Any) -> None:
        self.session, self.rows = session, 0

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> Any:
        self.rows += len(feed["prefix"])
        return self.session.run(names, feed)


def ceiling_feeds(
    beam: Any, ideal: Any, spec: Any, units: list[str], encoder: Any, decoder: Any, full: int
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """The encoder's feeds (the package's batches) and the decoder's (the job's step rows in
    full batches of `full` rows, each encoder batch's share at its own width)."""
    counting = _CountingDecoder(decoder)
    ideal.continuous_hypotheses(encoder, counting, spec, units)
    pad, batch = spec.vocab.pad_id, ideal.ENCODE_BATCH
    from arabic_name_romanizer.inference import pad_batch

    enc_feeds, dec_feeds = [], []
    for i in range(0, len(units), batch):
        src, mask = pad_batch([spec.source_ids(u) for u in units[i : i + batch]], pad)
        enc_feeds.append({"src": src, "src_mask": mask})
        encoded = beam.encode_chunk(
            encoder, [spec.source_ids(u) for u in units[i : i + batch]], pad
        )
        share = round(counting.rows * len(encoded) / len(units))
        rows = np.arange(full) % len(encoded)
        feed = {
            "prefix": np.full((full, 1), spec.vocab.bos_id, dtype=np.int64),
            "memory": np.stack([encoded[r].memory for r in rows]),
            "src_mask": np.stack([encoded[r].src_mask for r in rows]),
            "hidden": np.stack([encoded[r].hidden for r in rows]),
        }
        dec_feeds += [feed] * (share // full)
        if share % full:
            dec_feeds.append({k: v[: share % full] for k, v in feed.items()})
    return enc_feeds, dec_feeds


if __name__ == "__main__":
    main()
