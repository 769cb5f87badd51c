"""The layers under OfflineInference: Scheduler -> ExecutionEngine -> ModelWorker.

- `request` / `work`: the per-item Request (state machine) and the batch-level Work;
- `records`: the frozen records passed between the layers (Batch down; BatchResult up; Plan);
- `scheduler`: waiting queues, slots, memory budget, priorities, dependencies, deadlines;
- `batcher`: same-shape grouping and the batching window;
- `workers`: each model's workers as the engine dispatches to them (streams, capacity);
- `engine`: the one loop thread and its step, in named phases;
- `worker` / `buffers`: one model instance, its streams and host buffers, on its thread;
- `callbacks`: the thread that runs request callbacks;
- the sequence layer, which the engine drives through `sequences` (its one seam):
  `state_pool` (lanes of carried state), `step_batcher` (steps until they make a batch),
  `sequence_runner` (whole sequences run by a Stepper).

Nothing here imports a concrete backend: only the worker reaches the `Backend` / `Session`
interface, and the Scheduler and the engine import no backend module at all.
"""
