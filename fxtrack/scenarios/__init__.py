"""Scenarios: what is run and measured (train, inference, ...), framework-neutral."""
