"""Using a trained model: a workdir's config, tokenizer and params as ``Loaded``, and
the features and predictions of the loaded network.
"""
