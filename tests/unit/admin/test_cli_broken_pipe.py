"""``spark-sb status --json | head``: when the reader of standard output goes away, the command line stops quietly
with exit 1 (Python's "Note on SIGPIPE"), with no BrokenPipeError traceback and no "Exception ignored" line at
exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from spark_sb.admin import cli

#: A ``spark-sb`` with one more command, ``flood``, that prints LINES lines: the real console entry point.
CHILD = textwrap.dedent(
    """
    import sys
    from spark_sb.admin import cli

    def add_flood(subparsers, common):
        p = subparsers.add_parser("flood", parents=[common])
        p.set_defaults(func=lambda args: [print("x" * 100) for _ in range(LINES)] and 0)

    cli.COMMANDS.append(add_flood)
    sys.argv = ["spark-sb", "flood"]
    cli.console_main()
    """
)


def _run_into_a_closed_pipe(lines: int, *, unbuffered: bool) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: `| head` that already has its lines
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    try:
        return subprocess.run(
            [sys.executable, "-c", CHILD.replace("LINES", str(lines))],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    ("lines", "unbuffered"),
    [
        (3, False),  # fits stdout's buffer: the pipe breaks at the flush
        (10_000, False),  # more than the buffer: it breaks inside the command's print
        (3, True),  # PYTHONUNBUFFERED: inside the print too
    ],
)
def test_a_reader_that_went_away_ends_the_command_quietly_with_exit_1(lines: int, unbuffered: bool) -> None:
    done = _run_into_a_closed_pipe(lines, unbuffered=unbuffered)
    assert done.returncode == 1
    assert done.stderr == ""  # no traceback, no "error: BrokenPipeError", no "Exception ignored"


def test_a_broken_pipe_in_process_is_exit_1_and_no_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def add_broken(subparsers: object, common: object) -> None:
        def func(args: object) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        p = subparsers.add_parser("broken", parents=[common])  # type: ignore[attr-defined]
        p.set_defaults(func=func)

    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, add_broken])
    assert cli.main(["broken"]) == 1
    assert capsys.readouterr().err == ""
