"""Moves host batches onto the mesh, with a background thread that keeps one step ahead.

Each prefetched batch travels with the data-iterator state *after* it was drawn, so the
state saved in a checkpoint is exactly "the batches consumed so far", however far the
prefetch thread has read ahead.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import jax
import numpy as np
from jax.sharding import NamedSharding


def to_global(batch: dict[str, np.ndarray], sharding: NamedSharding,
              global_rows: int | None = None) -> dict[str, jax.Array]:
  """This process's rows -> one global array per key of ``global_rows`` rows (default: the
  processes' rows side by side), split over the batch mesh axes."""
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    shape = None if global_rows is None else (int(global_rows),) + v.shape[1:]
    out[k] = jax.make_array_from_process_local_data(sharding, v, shape)
  return out


class Prefetcher:
  """Iterates ``(batch, state_after_batch)`` from a data iterator in a background thread."""

  def __init__(self, iterator, depth: int = 2):
    self._iterator = iterator
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self):
    try:
      while not self._stop.is_set():
        batch = next(self._iterator)
        item = (batch, self._iterator.get_state())
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
    except BaseException as e:  # pylint: disable=broad-except
      self._queue.put(e)

  def __iter__(self) -> Iterator[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    return self

  def __next__(self):
    item = self._queue.get()
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self):
    self._stop.set()
    self._thread.join(timeout=5)
