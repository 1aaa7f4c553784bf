"""Training code shared by the trainer and the hybrid (lent rollout) workers."""
