"""Errors w4 knows how to report, each carrying its process exit code.

One exit-code scheme for the whole CLI (docs/cli.md):
  0 success, 1 a check failed or the run failed, 2 usage error,
  3 the environment cannot run this (no CUDA GPU, no nvcc, kernel build failed),
  4 input refused (bad or unsupported checkpoint, unsafe file, existing output),
  130 interrupted (Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130  # the shell convention for SIGINT


class W4Error(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code = EXIT_FAILED


class CheckFailed(W4Error):
    """A check ran and its result was wrong."""

    exit_code = EXIT_FAILED


class UsageError(W4Error):
    """The command line asks for something that cannot be done as written."""

    exit_code = EXIT_USAGE


class EnvironmentUnavailable(W4Error):
    """This machine cannot run what was asked (no CUDA GPU, no nvcc, kernel build failed)."""

    exit_code = EXIT_ENVIRONMENT


class InputRefused(W4Error):
    """The input was looked at and refused: unsupported format, inconsistent or unsafe files."""

    exit_code = EXIT_REFUSED


class OutputFailed(W4Error):
    """OUTPUT_DIR could not be written: another w4 holds it, someone changed it during the run, or
    the disk is full."""

    exit_code = EXIT_FAILED


class Interrupted(W4Error):
    """A stop request (Ctrl-C, SIGTERM, SIGHUP) ended the run; the message says what it left."""

    exit_code = EXIT_INTERRUPTED
