"""The console script's first word: a sub-command (its own options passed through), a Hydra
override or option (the app), or neither (the list of sub-commands, exit status 2)."""

from __future__ import annotations

import subprocess

import pytest

from conftest import run_fxtrack
from fxtrack.cli import SUBCOMMANDS


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return run_fxtrack(cwd, *args, timeout=300)


@pytest.mark.parametrize("word", ["nonsense", "help", "reprot"])
def test_an_unknown_subcommand_lists_the_subcommands(tmp_path, word):
    proc = cli(word, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"invalid choice: '{word}'" in proc.stderr
    assert all(name in proc.stderr for name in SUBCOMMANDS), proc.stderr
    assert "hydra" not in proc.stderr.lower()  # not Hydra's override parser error
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_subcommand_gets_its_own_arguments(tmp_path):
    proc = cli("sync", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: fxtrack sync") and "--uri" in proc.stdout


def test_overrides_and_hydra_options_still_reach_the_app(tmp_path):
    proc = cli("size=tiny", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "name: tiny" in proc.stdout
    proc = cli("~experiment", "--cfg", "job", cwd=tmp_path)  # a deletion override has no `=`
    assert proc.returncode == 0, proc.stderr
