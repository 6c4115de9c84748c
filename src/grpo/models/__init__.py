"""Policy, reference, value and reward models: loading, the built-in tiny model and its tokenizer."""
