"""``tpu.aot`` plans the very programs a run runs: its train and eval steps lower to the same
text as the steps ``main``'s run (``api.pretrain.run``) trained and evaluated with."""

import jax
import jax.numpy as jnp

from encoder_jax import data as data_lib
from encoder_jax.api import pretrain
from encoder_jax.run import engine
from encoder_jax.run import pretraining
from encoder_jax.tpu import programs

from support import tiny_config


def test_compile_lowers_the_steps_main_runs(prepared_dir, tmp_path):
  c = tiny_config.get_config(tiny_config.one_phase(prepared_dir))
  # Accumulation and an odd seed: a program of its own (no earlier run's is reused), with
  # the micro-batch scan and the seed's keys in it.
  c.seed = 4099
  c.train.update(num_steps=2, batch_size=16, grad_accum_steps=2, eval_every_steps=2,
                 eval_batches=1, log_every_steps=1)
  c.checkpoint.every_steps = 2
  before = set(engine._PROGRAMS)  # pylint: disable=protected-access
  pretrain.run(c, str(tmp_path / 'run'))
  ran = {k[0]: engine._PROGRAMS[k]  # pylint: disable=protected-access
         for k in engine._PROGRAMS if k not in before}  # pylint: disable=protected-access
  assert set(ran) == {'train', 'eval'}, sorted(ran)

  tables = pretraining.vocab_tables(c, data_lib.load_or_prepare(c))
  target = programs.build(c, jax.devices(), tables)
  (phase,) = target.phases
  batch = programs.abstract_batch(c, target.mesh, phase.seq_len)
  planned = target.pieces.train_step(phase)
  assert (planned.lower(target.state, batch).as_text()
          == ran['train'].lower(target.state, batch).as_text())
  index = jax.ShapeDtypeStruct((), jnp.int32)
  planned_eval = pretraining.make_eval_step(c, target.objective, target.mesh,
                                            target.pieces.shards.params, phase)
  assert (planned_eval.lower(target.state.params, batch, index).as_text()
          == ran['eval'].lower(target.state.params, batch, index).as_text())

  # What the comparison can tell apart: another schedule is another program.
  c.optim.warmup_steps = 1
  other = programs.build(c, jax.devices(), tables)
  assert (other.pieces.train_step(phase).lower(other.state, batch).as_text()
          != ran['train'].lower(target.state, batch).as_text())
