"""Input pipeline: sources -> tokenizer -> prepared shards -> resumable example stream.

  prepared = load_or_prepare(config)        # prepares once per config, then reuses; the
                                            # hosts of a run: one prepares, the others wait
  it = make_train_iterator(config, prepared, rows=(lo, hi))   # this process's global rows
  batch = next(it)                          # numpy dict: rows lo..hi of the next global batch
  state = merge_states([every process's it.get_state()]); it.set_state(state)  # any topology
  eval_it = make_eval_iterator(config, prepared, seq_len, rows=(lo, hi))

Modules: ``sources`` (text/JSONL/tfds/embedded), ``sentences`` (splitter), ``embedded``
(stdlib docstring corpus), ``tokenizer`` (one interface), ``tokenizer_kinds`` (the kinds'
registry), ``tokenizer_files`` / ``tokenizer_training`` / ``tokenizer_export`` (each kind's
files: read, trained, exported to Hugging Face), ``preparation`` and ``shards`` (prepared
format), ``prepare_once`` (one preparer per directory, a file lock), ``mixing`` (alpha
sampling, epoch order), ``builders`` (NSP, SOP, FULL-/DOC-SENTENCES) and ``iterators``.
Nothing here imports JAX.
"""

from encoder_jax.data.embedded import embedded_corpus
from encoder_jax.data.iterators import make_eval_iterator
from encoder_jax.data.iterators import make_train_iterator
from encoder_jax.data.iterators import merge_states
from encoder_jax.data.preparation import load_or_prepare
from encoder_jax.data.preparation import prepare
from encoder_jax.data.preparation import PreparedData
from encoder_jax.data.tokenizer import Tokenizer

__all__ = ['embedded_corpus', 'load_or_prepare', 'make_eval_iterator',
           'make_train_iterator', 'merge_states', 'prepare', 'PreparedData', 'Tokenizer']
