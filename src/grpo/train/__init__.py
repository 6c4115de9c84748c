"""Training: the trainer loop, the policy (and critic) update, optimizers, warm-up, checkpoints."""
