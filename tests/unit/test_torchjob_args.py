"""The PyTorch test job's argument errors: exit 2 with one line naming the fault, under the
usage of the role given (ps, worker, ddp), not the top-level one that lists only roles."""

from __future__ import annotations

import os

import pytest

from tensorlights.testbed import torchjob
from tensorlights.testbed.socket_holder import clean_env


@pytest.mark.parametrize(
    ("argv", "role", "message"),
    [
        (
            ["ps", "--master", "10.0.0.1:29500", "--workers", "2", "--shards", "2",
             "--transport", "rpc"],
            "ps",
            "--shards: 1 or more, and more than 1 only with --transport gloo",
        ),
        (
            ["ps", "--master", "10.0.0.1:29500", "--workers", "2", "--shards", "2",
             "--rank", "2"],
            "ps",
            "--rank 2: a PS shard's rank is 0..1",
        ),
        (["worker", "--workers", "2"], "worker", "--master, --rank required"),
        (["ddp", "--master", "10.0.0.1:29500", "--rank", "1"], "ddp", "--workers required"),
    ],
)  # fmt: skip
def test_an_argument_error_prints_its_roles_usage(
    argv: list[str],
    role: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in os.environ.keys() - clean_env().keys():  # torchrun's and other launchers'
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit) as exited:
        torchjob.main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("usage: ") and f" {role} " in lines[0]
    assert f" {role}: error: {message}" in lines[-1]
