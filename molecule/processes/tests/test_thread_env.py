"""The same checks `provisioner verify` runs, here against the molecule instance."""

from provisioner.checks.test_thread_env import *  # noqa: F403
