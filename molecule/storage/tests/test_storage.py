"""The same checks `provisioner verify` runs, here against the molecule instance."""

from provisioner.checks.test_storage import *  # noqa: F403
