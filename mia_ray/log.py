"""The one progress log (stderr, timestamped): the bottom floor, imported by any module."""

from __future__ import annotations

import sys
import time

from mia_ray.redact import scrub


def log(msg: str, who: str = "mia-ray") -> None:
    """``[who HH:MM:SS] msg`` on stderr, flushed (Ray forwards workers' stderr to the driver)."""
    print(f"[{who} {time.strftime('%H:%M:%S')}] {scrub(msg)}", file=sys.stderr, flush=True)


def note(msg: str) -> None:
    """A log line the user should read: something was skipped, assumed or left out."""
    log(f"note: {msg}")
