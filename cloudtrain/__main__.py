"""`python -m cloudtrain`, and the `cloudtrain` command's entry point."""


def main() -> None:
    """Load the CLI and run it. A Ctrl-C while it loads (the first fraction of a second) is
    the same one line as later, not a traceback. The process ends with the status the CLI
    chose (130 after Ctrl-C), never killed by a signal it has already handled."""
    import sys

    try:
        from .cli import main as run
    except KeyboardInterrupt:
        from .errors import EXIT_INTERRUPTED

        sys.stderr.write("\ninterrupted\n")
        _forget_interrupt()
        raise SystemExit(EXIT_INTERRUPTED) from None
    try:
        run()
    finally:
        _forget_interrupt()


def _forget_interrupt() -> None:
    """A KeyboardInterrupt that left an exec() of a string (dataclasses and namedtuple build
    their methods so: a Ctrl-C that lands in a lazy import) marks the interpreter as ended by
    Ctrl-C, and under `python -m` it then kills itself with SIGINT at exit, after the cleanup
    and whatever SystemExit says. The CLI handled that Ctrl-C; the next exec of a string
    clears the mark (CPython resets it before each such run). A KeyboardInterrupt that does
    escape is marked again after this, as it should be."""
    exec("")  # noqa: S102 - a constant empty program


if __name__ == "__main__":
    main()
