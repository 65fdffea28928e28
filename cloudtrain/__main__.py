"""`python -m cloudtrain`, and the `cloudtrain` command's entry point."""


def main() -> None:
    """Load the CLI and run it. A Ctrl-C while it loads (the first fraction of a second) is
    the same one line as later, not a traceback."""
    import sys

    try:
        from .cli import main as run
    except KeyboardInterrupt:
        from .errors import EXIT_INTERRUPTED

        sys.stderr.write("\ninterrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    run()


if __name__ == "__main__":
    main()
