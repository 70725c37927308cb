"""The bench's table and the machine it ran on."""

from __future__ import annotations

import os
import platform

import jax
import numpy as np

from cacheresearch import __version__


def format_row(c: dict) -> str:
    def f(x, spec):
        if x is None:
            width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
            return "-".rjust(int(width or 1))
        return format(x, spec)

    note = c.get("path", "")
    if c.get("cost_vs_random") is not None:
        note += f"; {c['cost_vs_random']:.2f}x random (both queue=True)"
    elif c.get("ratio") is None and c.get("libcachesim_s") is not None:
        note += "; no parallel figure"
    return (f"{c['workload']:<11} {c['name']:<28} {c['accesses']:>9} {c['configs']:>5} "
            f"{f(c['project_s'], '10.4f')} {f(c['project_compile_s'], '7.2f')} {f(c['libcachesim_s'], '9.4f')} "
            f"{f(c.get('libcachesim_parallel_s'), '9.4f')} {f(c.get('libcachesim_workers'), '3d')} "
            f"{f(c['ratio'], '8.3f')} {f(c.get('ratio_sequential'), '8.3f')} {f(c['ratio_with_compile'], '8.3f')} "
            f"{f(c['project_hit_rate'], '6.4f')} {f(c['libcachesim_hit_rate'], '6.4f')} "
            f"{f(c.get('peak_rss_mb'), '6.0f')}  {note}")


HEADER = (f"{'workload':<11} {'case':<28} {'accesses':>9} {'cfgs':>5} {'project_s':>10} {'compile':>7} "
          f"{'lcs_1core':>9} {'lcs_par':>9} {'wk':>3} {'ratio':>8} {'r_1core':>8} {'r+comp':>8} "
          f"{'p_hit':>6} {'l_hit':>6} {'rss_mb':>6}  path")
LEGEND = ("ratio = libCacheSim s / project s: lcs_par (libCacheSim on wk worker processes) for cases with several "
          "configurations, lcs_1core for single_*; r_1core = lcs_1core / project s; r+comp adds the compile")


def format_table(report: dict) -> str:
    lines = [HEADER, "-" * len(HEADER)]
    lines += [format_row(c) for c in report["cases"]]
    lines.append(LEGEND)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- machine info
def machine_info(lcs=None) -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem_gb = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None

    def ver(mod):
        try:
            return __import__(mod).__version__
        except Exception:  # noqa: BLE001
            return None

    lcs_ver = None
    if lcs is not None:
        lcs_ver = getattr(lcs, "__version__", None)
        if lcs_ver is None:
            try:
                from importlib.metadata import version  # noqa: PLC0415

                lcs_ver = version("libcachesim")
            except Exception:  # noqa: BLE001
                lcs_ver = "unknown"
    return {
        "cpu": cpu, "cores": os.cpu_count(), "cores_usable": affinity, "memory_gb": mem_gb, "loadavg_at_start": load,
        "platform": platform.platform(), "python": platform.python_version(),
        "jax_backend": jax.default_backend(), "jax_devices": [str(d) for d in jax.devices()],
        "versions": {"cacheresearch": __version__, "jax": jax.__version__, "jaxlib": ver("jaxlib"),
            "numpy": np.__version__,
                     "libcachesim": lcs_ver},
    }
