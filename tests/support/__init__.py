"""What the tests share: the tiny config, the family of pretraining runs, the Cloud Storage
emulator, the worker devices, commands run in the test's process or held at a step, and the
Hugging Face fixtures. On pytest's path as ``support`` (``pythonpath = tests`` in setup.cfg):
``from support import tiny_config``. The modules import on use (``hf_fixtures`` imports
torch), so this file imports none of them.
"""

import importlib.util
import os
import sys

# The repository's root, and the tiny config as a file for ``--config=`` (a command's flag).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_CONFIG = os.path.join(ROOT, 'tests', 'support', 'tiny_config.py')


def benchmark(name: str):
  """``benchmarks/<name>.py`` (a script, not a package) imported by its path, once, as the
  module ``name`` (a dataclass of it looks its module up in ``sys.modules``)."""
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'benchmarks',
                                                                     f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]
