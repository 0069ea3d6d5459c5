"""RookWorld GRPO: reinforcement learning from verifiable rewards for chess language models."""

__version__ = "0.1.0"
