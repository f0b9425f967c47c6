"""The same checks `provisioner verify` runs, here against the molecule instance."""

from provisioner.checks.test_allocator import *  # noqa: F403


def test_the_test_service_runs(host):
    """converge started it; without this the running-process check could skip."""
    assert host.service("provisioner-alloc-test.service").is_running
