"""The same checks `provisioner verify` runs, here against the molecule instance."""

from provisioner.checks.test_mlstack import *  # noqa: F403
