"""PyTorch: ``nn.Module`` models, SDPA attention, autocast, ``torch.compile``."""
