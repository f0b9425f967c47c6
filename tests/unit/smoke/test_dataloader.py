"""The DataLoader workload's target code: where its worker and thread counts come from."""

from __future__ import annotations

from provisioner.smoke.workloads import dataloader


def test_a_count_comes_from_the_environment_else_the_plan_and_says_which(monkeypatch):
    p = {"plan": {"dataloader_workers": 3}}
    monkeypatch.setenv("PROVISIONER_DATALOADER_WORKERS", "5")
    assert dataloader._from_env("PROVISIONER_DATALOADER_WORKERS", p, "dataloader_workers", 1, "x") == (
        5, "PROVISIONER_DATALOADER_WORKERS from the environment")
    monkeypatch.delenv("PROVISIONER_DATALOADER_WORKERS")
    assert dataloader._from_env("PROVISIONER_DATALOADER_WORKERS", p, "dataloader_workers", 1, "x") == (
        3, "the plan's dataloader_workers: PROVISIONER_DATALOADER_WORKERS is not in the environment")
