"""Command-line argument types (tui/cli/args.py): bad arguments are usage errors before any work."""

from __future__ import annotations

import pytest

from tests.e2e import test_cli_hostile_args
from tests.e2e.test_cli_hostile_args import BAD_ARGUMENTS, run, usage_error

no_sweeps = test_cli_hostile_args.no_sweeps  # test_cli_hostile_args's pytest fixture


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_are_usage_errors_before_any_work(
    capsys: pytest.CaptureFixture[str], no_sweeps: None, case: str
) -> None:
    argv, argument, fragment = BAD_ARGUMENTS[case]
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out
    last = usage_error(err)
    assert argument in last and fragment in last, last
