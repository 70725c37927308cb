"""The entry point: ``python -m cacheresearch.sweep experiment=NAME`` (the shell: :mod:`cacheresearch.shell`)."""

from cacheresearch.shell.sweep import SweepError, compose_config, main, run, run_experiment  # noqa: F401

if __name__ == "__main__":
    import sys

    from cacheresearch.shell.overrides import check_overrides

    _msg = check_overrides(sys.argv[1:])  # a user's mistake: one line naming the key, not Hydra's ten
    if _msg:
        print(f"cacheresearch.sweep: error: {_msg}", file=sys.stderr)
        sys.exit(2)
    main()
