"""The encoder networks: ``registry`` (every kind by name), one module per kind, the shared
trunk, ``config.EncoderConfig`` (every ``config.model`` field, typed), attention and layers."""
