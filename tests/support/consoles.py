"""A console that keeps the lines it says, for the tests that read what a run prints."""

from encoder_jax.run import console as console_lib


class Lines(console_lib.Console):
  def __init__(self):
    super().__init__()
    self.lines = []

  def say(self, text):
    self.lines.append(text)
