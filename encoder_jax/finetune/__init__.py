"""Fine-tuning: task heads on the pretrained encoder, trained end to end (``main`` is the CLI)."""
