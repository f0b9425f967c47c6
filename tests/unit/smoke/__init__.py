"""The smoke workloads' target code, one test module per workload (provisioner/smoke/workloads/NAME.py)."""
