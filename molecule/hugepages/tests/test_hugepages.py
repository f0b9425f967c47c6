"""The same checks `provisioner verify` runs, here against the molecule instance."""

from provisioner.checks.test_hugepages import *  # noqa: F403
