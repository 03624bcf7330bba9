"""TPU planning: compiling a config's steps for a TPU slice on any host, and what the
compiled HLO says.
"""
