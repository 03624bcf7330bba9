"""Fine-tuning tasks."""
