"""The smoke test's target half: what runs on a host, shipped there as one zipapp
(provisioner.smoke.zipapp builds it on the control node).

`parent` runs as root with the system Python and the standard library only: it reads the host
and starts each workload's worker, the same archive run by the ML environment's Python. Nothing
here imports the judgement; the archive holds only this package, the workload modules and the
two layers below them (provisioner.smoke.base, provisioner.smoke.hardware).
"""
