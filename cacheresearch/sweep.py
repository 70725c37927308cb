"""The entry point: ``python -m cacheresearch.sweep experiment=NAME`` (the shell: :mod:`cacheresearch.shell`)."""

from cacheresearch.shell.sweep import SweepError, compose_config, main, run, run_experiment  # noqa: F401

if __name__ == "__main__":
    main()
