"""The layers under OfflineInference: Scheduler -> ExecutionEngine -> ModelWorker.

- `request` / `work`: the per-item Request (state machine) and the batch-level Work;
- `records`: every record passed between the layers (Batch down; BatchResult up; Plan);
- `scheduler`: waiting queues, slots, memory budget, priorities, dependencies, deadlines;
- `batcher`: same-shape grouping and the batching window;
- `engine`: the one loop thread and its step();
- `worker` / `buffers`: one model instance, its streams and host buffers, on its thread.

Nothing here imports a concrete backend: only the `Backend` / `Session` interface.
"""
