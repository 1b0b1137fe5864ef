"""Build a training-ready artifact from raw data, as a TOML config describes.

The config's [source] format picks the pipeline: coco, yolo or jsonl labels
build a validated tensor warehouse (TWH1 shards + manifest); raw or npy
arrays are tiled, compressed and written as a Zarr v3 array; captions build
a feature cache for pretraining. The artifact is written under a temporary
name and renamed when complete; an identical existing version is reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from warpdata.cli import output as out

EXAMPLES = """
  warp etl --config examples/transform.toml            # tensor warehouse
  warp etl -q --config transform.toml | xargs warp publish ws/coco --from
  cat vol.raw | warp etl --config volume.toml --input -  # array from stdin to Zarr
  warp etl --config captions.toml --workers 2 --json   # feature cache
  warp etl --config transform.toml --executor dask -j 8   # on a local Dask cluster
  warp etl --config transform.toml --executor dask:/shared/scheduler.json
"""


def main(
    config: Annotated[Path, typer.Option("--config", "-c", help="The TOML config (see examples/).", metavar="TOML")],
    clear: Annotated[bool, typer.Option("--clear", help="Rebuild even if an identical version exists (also WAREHOUSE_CLEAR=1).")] = False,
    allow_invalid: Annotated[bool, typer.Option("--allow-invalid", help="Build even when validation thresholds are exceeded.")] = False,
    workers: Annotated[int | None, typer.Option("--workers", "-j", min=1, help="Worker count (default: WARP_WORKERS or CPUs).")] = None,
    input_: Annotated[str | None, typer.Option("--input", "-i", help="Override [source] path; '-' reads stdin.")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Override [output] root.")] = None,
    executor: Annotated[str | None, typer.Option(
        "--executor", "-x", metavar="NAME",
        help="Where shard tasks run: local (default), process, dask (a LocalCluster), dask://HOST:PORT (or "
             "tcp://HOST:PORT, as 'dask scheduler' prints it) or dask:SCHEDULER_FILE (an existing cluster), ray "
             "(also [build] executor, WARP_EXECUTOR).")] = None,
) -> int:
    from warpdata.core import envvars
    from warpdata.core.config import parse_toml
    from warpdata.etl.pipelines import EtlRequest, resolve

    data, source = parse_toml(config)
    run = resolve(data, source)
    req = EtlRequest(config_path=config, config=data, source=source,
                     clear=clear or envvars.flag("WAREHOUSE_CLEAR"), allow_invalid=allow_invalid,
                     workers=workers, input=input_, output=output, executor=executor)
    result = run(req)
    opts = out.options()
    if opts.json:
        out.emit_json({"status": result.status, "kind": result.kind, "path": result.path, **result.summary})
    elif opts.quiet:
        out.data(result.path)
    else:
        if result.metrics.get("phases_s") and result.metrics.get("cpu_s") is not None:
            _render_phases(result.metrics)
        out.table(f"{result.kind} {result.status}: {result.path}", ["", ""], result.rows, to_stderr=True)
        out.data(result.path)
    return result.exit_code


def _render_phases(m: dict[str, Any]) -> None:
    """The build's phase timings (a warehouse's metrics.json) as a table on stderr."""
    rows = [[k, f"{v:.3f}", ""] for k, v in m["phases_s"].items()]
    rows += [[f"cpu:{k}", f"{v:.3f}", f"{m['cpu_ms_per_sample'].get(k, 0):.2f} ms/img"] for k, v in m["cpu_s"].items()]
    if m.get("build_samples_per_s"):
        rows.append(["rate", f"{m['build_samples_per_s']:.1f} img/s", f"{m['build_mb_per_s']:.1f} MB/s"])
        rows.append(["writes", f"{100 * m.get('direct_io_fraction', 0):.0f} % O_DIRECT", "WARP_DIRECT_IO"])
    for code, n in sorted(m["skip_reasons"].items()):
        rows.append([f"skip:{code}", str(n), ""])
    out.table("etl phases (seconds)", ["phase", "time", "per sample"], rows, to_stderr=True)
