"""provisioner-status: the expected vs the live value of every setting the roles manage.

    provisioner-status [--expected-dir /etc/provisioner/expected] [--plan /etc/provisioner/plan.json]
                       [--json] [--textfile DIR]

Each role that manages a host setting declares, at the end of its run, what it expects in
EXPECTED_DIR/ROLE.json: {"schema": 1, "role": ROLE, "checks": [CHECK, ...]}, a CHECK being a
mapping with "name", "probe", "expected" and the probe's own keys. This script reads the
live value of each check with its probe and says ok, drifted (with both values) or not
applicable (with the reason). It changes nothing on the host.

Probes: sysctl (the live value where the role applied it, and always the value systemd-sysctl
applies at boot), thp, login_env, service_env, tuned, governor, epp, hugepages, mount, md and
doctor (mlstack-doctor --json).

Exit status: 0 when nothing drifted, 1 when something did, 2 on bad input (the expected
directory or a file in it cannot be read; a host never provisioned has no expected directory):
the reason on stderr, or with --json as {"schema", "host", "error", "fix"} on stdout. With
--textfile DIR it also writes DIR/provisioner_status.prom for node_exporter's textfile
collector, atomically.

Runs as root with the system Python and the standard library only (prometheus_client is used
for the textfile when it is importable); shipped by role shared.
"""
