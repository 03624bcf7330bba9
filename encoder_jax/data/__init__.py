"""Input pipeline: sources -> tokenizer -> prepared shards -> resumable example stream.

  prepared = load_or_prepare(config)        # prepares once per config, then reuses; the
                                            # hosts of a run: one prepares, the others wait
  it = make_train_iterator(config, prepared, process_index, process_count)
  batch = next(it)                          # numpy dict for this process and the next step
  state = it.get_state(); it.set_state(state)
  eval_it = make_eval_iterator(config, prepared, seq_len, process_index, process_count)

Modules: ``sources`` (text/JSONL/tfds/embedded), ``sentences`` (splitter), ``embedded``
(stdlib docstring corpus), ``tokenizer`` / ``tokenizer_training``, ``preparation`` and
``shards`` (prepared format), ``prepare_once`` (one preparer per directory, a file lock), ``mixing`` (alpha sampling, epoch order), ``builders`` (NSP,
SOP, FULL-/DOC-SENTENCES) and ``iterators``. Nothing here imports JAX.
"""

from encoder_jax.data.embedded import embedded_corpus
from encoder_jax.data.iterators import make_eval_iterator
from encoder_jax.data.iterators import make_train_iterator
from encoder_jax.data.preparation import load_or_prepare
from encoder_jax.data.preparation import prepare
from encoder_jax.data.preparation import PreparedData
from encoder_jax.data.tokenizer import Tokenizer

__all__ = ['embedded_corpus', 'load_or_prepare', 'make_eval_iterator',
           'make_train_iterator', 'prepare', 'PreparedData', 'Tokenizer']
