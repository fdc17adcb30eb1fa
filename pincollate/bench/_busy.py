"""Is the machine quiet enough for the figures? The load before a run, and how far its rounds spread.

The benchmark's figures are ratios of methods timed in rotating rounds of one run, so a
steady load slows them alike; a load that comes and goes does not. Two signs say that the
run met one, and the report then says its figures cannot be trusted:

* **Load.** The 1-minute load average read before the run (the benchmark's own work is not
  in it yet) of :data:`LOAD_SHARE` of the cores or more: other processes held the CPUs.
* **Spread.** A method whose rounds differ by a factor of :data:`SPREAD` or more (a
  quiet 2-core machine stays within 1.5x): rounds met different machines. Where there are
  :data:`TRIM_FROM` rounds or more, the lowest and the highest are left out: one round that
  met a pause of the interpreter or of the system (a quick run's round of a few
  milliseconds) is one event, not a busy machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

__all__ = ["LOAD_SHARE", "SPREAD", "TRIM_FROM", "busy_reasons", "format_busy", "load_average"]

#: A load average of this share of the cores, before the run, marks the machine busy.
LOAD_SHARE = 0.5
#: A method's highest round over its lowest, by this factor or more, marks the rounds unsteady.
SPREAD = 2.0
#: Rounds from which the lowest and the highest are left out of the spread.
TRIM_FROM = 5


def load_average() -> float | None:
    """The 1-minute load average, or ``None`` where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_reasons(load: float | None, cores: int | None, rounds: Iterable[tuple[str, Sequence[float]]]) -> list[str]:
    """Why the figures cannot be trusted; empty when the machine looked quiet.

    ``rounds`` holds each method's label and its rounds' figures (a ratio or a rate each).

    Examples:
        >>> busy_reasons(0.2, 2, [("vlm mm_collate", [0.8, 0.9])])
        []
        >>> busy_reasons(3.5, 2, [("vlm mm_collate", [0.10, 11.74]), ("video mm_collate", [0.9, 1.0])])
        ['load average 3.50 on 2 cores before the run', 'rounds of vlm mm_collate spread 0.10-11.74']

        One round of six far from the rest is left out; two are not:

        >>> busy_reasons(None, 2, [("ragged", [1.1, 1.2, 0.3, 1.2, 1.1, 1.2])])
        []
        >>> busy_reasons(None, 2, [("ragged", [1.1, 1.2, 0.3, 1.2, 0.4, 1.2])])
        ['rounds of ragged spread 0.40-1.20 (the lowest and highest of 6 left out)']
    """
    reasons = []
    if load is not None and cores and load >= LOAD_SHARE * cores:
        reasons.append(f"load average {load:.2f} on {cores} cores before the run")
    for label, values in rounds:
        ordered = sorted(values)
        if not ordered:
            continue
        trimmed = len(ordered) >= TRIM_FROM
        low, high = (ordered[1], ordered[-2]) if trimmed else (ordered[0], ordered[-1])
        if high >= SPREAD * low:
            left_out = f" (the lowest and highest of {len(ordered)} left out)" if trimmed else ""
            reasons.append(f"rounds of {label} spread {low:.2f}-{high:.2f}{left_out}")
    return reasons


def format_busy(reasons: list[str]) -> str:
    """The report's warning line, or ``""``."""
    if not reasons:
        return ""
    return (
        "WARNING: the machine was busy (" + "; ".join(reasons) + "): these figures are unreliable. "
        "Rerun on a quiet machine before quoting them."
    )
