"""Process memory, read the same way whatever the framework."""

from __future__ import annotations

import resource
import sys


def peak_rss_mib() -> float:
    """Peak resident set size of this process, MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
