"""Filters of the monitoring role: systemd time spans, as the timer's OnBootSec= and
OnUnitActiveSec= read them (systemd.time(7), "Parsing Time Spans")."""

from __future__ import annotations

import re
from typing import Any

# Units systemd accepts in a time span, in seconds; a number without a unit is seconds.
# Case matters: M is months, m minutes.
_UNITS: dict[str, float] = {
    **dict.fromkeys(("usec", "us", "µs", "μs"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "s", ""), 1.0),
    **dict.fromkeys(("minutes", "minute", "min", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 604800.0),
    **dict.fromkeys(("months", "month", "M"), 2629800.0),
    **dict.fromkeys(("years", "year", "y"), 31557600.0),
}
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([^\d\s.]*)")


def monitoring_timespan_seconds(value: Any) -> float | None:
    """A systemd time span ("1h", "90min", "1h 30min", "3600") in seconds; None when it is not one."""
    text = str(value).strip() if value is not None else ""
    if not text:
        return None
    total, pos = 0.0, 0
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None or m.group(2) not in _UNITS:
            return None
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return total


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"monitoring_timespan_seconds": monitoring_timespan_seconds}
