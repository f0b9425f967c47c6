"""The same checks `provisioner verify` runs, here against the molecule instance."""

from provisioner.checks.test_cpu_tuning import *  # noqa: F403
