"""Measurement shared by every framework: the one step timer, statistics, process memory."""
