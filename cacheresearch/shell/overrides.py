"""Command-line overrides checked before Hydra runs, so that a user's mistake is one line naming the key and
what is allowed (Hydra's own messages run to ten lines and end with a hint about stack traces).

:func:`check_overrides` returns that line, or None when the overrides compose and pass the precheck. It checks
the config-group choices (``experiment=NAME``, ``replica=NAME``, ...; each of a multirun's comma-separated values)
against the files of ``configs/``, then composes the configuration the way the sweep will (Hydra's compose API)
and turns a composition error into one line: an unknown key names its parent's known keys; then the composed
configuration's names, input files and traces (:func:`cacheresearch.shell.precheck.precheck`). None of it
imports an engine: the entry points call it before they import the shell. Overrides with Hydra flags
(``-m``, ``--cfg``, ...) or sweeps other than a plain comma list are left to Hydra after the group check (each
job is prechecked when it runs).
"""

from __future__ import annotations

from cacheresearch.shell.schema import CONFIG_DIR

__all__ = ["check_overrides", "group_options"]


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` (``experiment``, ``replica``, ``hydra/launcher``, ...): the files of
    ``configs/``, and for Hydra's own groups (``hydra/...``) the options its installed plugins register too
    (``hydra/launcher=joblib``, ``submitit_local``, ...: about 0.4 s to discover, only for those groups)."""
    d = CONFIG_DIR / group
    out = {p.stem for p in d.glob("*.yaml")} if d.is_dir() else set()
    if group.startswith("hydra/") and out:
        from hydra.core.config_store import ConfigStore  # noqa: PLC0415
        from hydra.core.plugins import Plugins  # noqa: PLC0415

        Plugins.instance()  # registers the plugins' configs
        try:
            out |= {n.removesuffix(".yaml") for n in ConfigStore.instance().list(group)}
        except OSError:  # a group no plugin registers
            pass
    return sorted(out)


def _split(arg: str) -> tuple[str, str] | None:
    if "=" not in arg or arg.startswith("-"):
        return None
    key, value = arg.split("=", 1)
    return key.lstrip("+~").replace("override ", "").strip().lstrip("/"), value


def _group_error(key: str, value: str) -> str | None:
    group = key.replace(".", "/")
    if not (CONFIG_DIR / group).is_dir() or not group_options(group):
        return None
    if value.startswith(("[", "range(", "choice(", "glob(")):
        return None
    for v in (x.strip() for x in value.split(",")):
        if v and v not in ("null", "default") and v not in group_options(group):
            what = "experiment" if group == "experiment" else f"{group} option"
            return f"{key}={v}: unknown {what}; choose one of {group_options(group)}"
    return None


def _known_keys(overrides: list[str], key: str) -> list[str]:
    """The keys beside ``key`` in the configuration composed from the group choices alone."""
    from omegaconf import DictConfig, OmegaConf  # noqa: PLC0415

    try:
        cfg = _compose([o for o in overrides if (s := _split(o)) and (CONFIG_DIR / s[0].replace(".", "/")).is_dir()])
    except Exception:  # noqa: BLE001 - the listing is a courtesy
        return []
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir  # noqa: PLC0415

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="cacheresearch.sweep"):
        return compose(config_name="config", overrides=list(overrides))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    for cut in (" Set the environment variable", " full_key:"):
        text = text.split(cut)[0]
    return text


def _compose_error(overrides: list[str]):
    """(None, the composed configuration), or (one line, None) when ``overrides`` do not compose."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException  # noqa: PLC0415

    try:
        return None, _compose(overrides)
    except Exception as e:  # noqa: BLE001 - every composition error becomes one line
        cause = e.__cause__ or e.__context__ or e
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
            key = str(cause.full_key)
            known = _known_keys(overrides, key)
            where = f"known keys of {key.rsplit('.', 1)[0]}" if "." in key else "known top-level keys"
            return (f"{key}: unknown key; {where}: {known}" if known else f"{key}: unknown key"), None
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            return f"{cause.full_key}: {_one_line(cause.msg if hasattr(cause, 'msg') else cause)}", None
        return _one_line(e), None


def check_overrides(args: list[str]) -> str | None:
    """One line naming the key and what is allowed, or None when ``args`` compose."""
    pairs = [p for p in (_split(a) for a in args) if p]
    for key, value in pairs:
        msg = _group_error(key, value)
        if msg:
            return msg
    if any(a.startswith("-") for a in args):
        return None  # Hydra's flags (-m, --cfg, ...): Hydra checks them
    if any("," in v and not v.startswith(("[", "{", "'", '"')) for _, v in pairs):
        return None  # a sweep: each job is checked when it composes
    plain = [a for a in args if not (_split(a) or ("",))[0].startswith("hydra")]
    msg, cfg = _compose_error(plain)
    if msg:
        return msg
    from cacheresearch.shell.precheck import precheck  # noqa: PLC0415

    return _added_to_schema(plain) or precheck(cfg)


def _added_to_schema(overrides: list[str]) -> str | None:
    """``+KEY=VALUE`` adds a key Hydra accepts anywhere; under a typed section of the schema (``cache``,
    ``engine``, ...) a key it does not declare is a typo that would be ignored: one line naming it. Free-form
    sections (``study``, ``fleet.variants``, ...) take any key."""
    import dataclasses  # noqa: PLC0415

    from omegaconf import DictConfig, OmegaConf  # noqa: PLC0415

    added = [a for a in overrides if a.startswith("+") and not a.startswith("++") and _split(a)]
    if not added:
        return None
    try:
        cfg = _compose([o for o in overrides if o not in added])
    except Exception:  # noqa: BLE001 - _compose_error reported what it could
        return None
    for a in added:
        key = _split(a)[0]
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node)) \
                and key.rsplit(".", 1)[-1] not in node:
            where = f"known keys of {parent}" if parent else "known top-level keys"
            return f"{key}: unknown key; {where}: {sorted(node.keys())}"
    return None
