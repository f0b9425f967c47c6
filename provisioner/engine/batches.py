"""Rolling runs: --batch (hosts, or a share of the fleet, per batch) and --max-fail (the share
of a batch that may fail before the roll stops)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BadInput

# Rolling runs: the extra vars site.yml's role plays read as `serial` and `max_fail_percentage`
# (unset: every host at once, no threshold).
SERIAL_VAR = "provisioner_serial"
MAX_FAIL_VAR = "provisioner_max_fail_percentage"
_BATCH_RE = re.compile(r"^\s*(\d+)\s*(%?)\s*$")


@dataclass(frozen=True)
class Batch:
    """A rolling run's batch size as given: a number of hosts, or a share of the fleet."""

    value: int
    percent: bool

    def __str__(self) -> str:
        return f"{self.value}{'%' if self.percent else ''}"

    def hosts(self, fleet: int) -> int:
        """Hosts per batch in a fleet of `fleet` (a share rounds down, as Ansible's serial does,
        and is at least one host); refused when it is none or more than the fleet."""
        if self.value == 0:
            raise BadInput(f"--batch {self}: a batch of no hosts never ends; give 1 or more hosts, or a share like 25%")
        if self.percent:
            if self.value > 100:
                raise BadInput(f"--batch {self}: more than the whole fleet; give a share from 1% to 100%")
            return max(1, fleet * self.value // 100)
        if self.value > fleet:
            raise BadInput(
                f"--batch {self}: more hosts than the {fleet} this run reaches; give 1 to {fleet}, or a share like 25%"
            )
        return self.value


def parse_batch(value: str) -> Batch:
    """`--batch N` (hosts) or `--batch P%` (a share of the fleet); anything else is refused."""
    m = _BATCH_RE.match(value)
    if not m:
        raise BadInput(f"--batch {value!r} is not a number of hosts or a share: give e.g. --batch 10 or --batch 25%")
    return Batch(int(m[1]), bool(m[2]))


def parse_max_fail(value: str) -> int:
    """`--max-fail P%`: the share of a batch's hosts that may fail before the roll stops (0-100)."""
    m = _BATCH_RE.match(value)
    if not m or int(m[1]) > 100:
        raise BadInput(
            f"--max-fail {value!r} is not a share from 0% to 100%: give e.g. --max-fail 10% (0%: stop at the first failure)"
        )
    return int(m[1])
