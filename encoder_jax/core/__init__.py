"""What every part of encoder_jax shares and nothing in it depends on: config fields
declared where they are read, the optional dependencies, the chips a run can be
planned for, sequence-length phases, the contract of what the engine trains, the
optimizer and schedule, and the device mesh with its sharding rules.
"""
