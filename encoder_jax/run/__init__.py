"""The run: the training engine and what it drives (pretraining, state, checkpoints,
metrics, console, feeding, the multi-process runtime, the compilation cache and
profiler, the workdir).
"""
