"""Input pipeline: sources -> tokenizer -> prepared shards -> resumable example stream."""
