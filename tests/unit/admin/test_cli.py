"""The command line tells a user's mistake in one line and exits 2, never with a Python traceback (issue 32 item 2);
an unexpected failure is one line too (exit 1), its traceback only with -vv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_sb.admin import cli

KEY = "c2VjcmV0LWtleS1kby1ub3QtbG9n"


def _config(tmp_path: Path, primary_endpoint: str) -> Path:
    path = tmp_path / "sb.yaml"
    path.write_text(
        "primary:\n"
        f'  connection_string: "Endpoint={primary_endpoint};SharedAccessKeyName=k;SharedAccessKey={KEY}"\n'
        "secondary:\n"
        f'  connection_string: "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey={KEY}"\n'
        "entity: orders\n"
    )
    return path


def _run(capsys: Any, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize("command", ["provision", "status"])
def test_an_endpoint_without_its_scheme_is_one_line_naming_the_key_and_exit_2(
    tmp_path: Path, capsys: Any, command: str
) -> None:
    code, err = _run(capsys, command, "--config", str(_config(tmp_path, "127.0.0.1:5682")))
    assert code == 2
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "primary.connection_string" in lines[0] and "sb://" in lines[0]
    assert KEY not in err


def test_a_missing_config_file_is_one_line_and_exit_2(tmp_path: Path, capsys: Any) -> None:
    code, err = _run(capsys, "provision", "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "Traceback" not in err and "nope.yaml" in err


def test_an_unexpected_failure_is_one_line_without_a_traceback_unless_asked(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError(f"the admin endpoint went away (key {KEY})")

    monkeypatch.setattr("spark_sb.admin.provisioning.provision_backlog_queues", boom)
    config = str(_config(tmp_path, "sb://127.0.0.1:5682"))
    code, err = _run(capsys, "provision", "--config", config)
    assert code == 1
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()] == [
        "error: RuntimeError: the admin endpoint went away (key ***) (-vv shows the traceback)"
    ]
    code, err = _run(capsys, "-vv", "provision", "--config", config)
    assert code == 1 and "Traceback" in err and KEY not in err
