"""Pack a WebDataset tar into one TBL v2 file (also installed as `tar_to_tbl`).

IN is a .tar or .tar.gz (ustar, GNU and PAX long names), or '-' for stdin.
Members are grouped into samples by WebDataset key; each sample's image is
stored with its format, width and height read from the image header (never
decoded), and its other members (.json, .cls, .txt, ...) are kept as JSON
metadata with the sample's key. Members that cannot be stored are counted as
skipped with their reason. OUT is written under a temporary name and renamed
when complete; the file opens in TurboLoader 2.39 unless --compression zstd.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out

EXAMPLES = """
  warp tar-to-tbl shard-000000.tar train.tbl
  tar_to_tbl shard-000000.tar train.tbl --verify --workers 2
  curl -s https://host/shard.tar.gz | warp tar-to-tbl - train.tbl --on-error warn
  warp tar-to-tbl data.tar data.tbl --compression zstd --level 9 --json
"""


def main(
    input: Annotated[str, typer.Argument(help="WebDataset .tar/.tar.gz, or '-' for stdin.", metavar="IN")],
    output: Annotated[str, typer.Argument(help="The .tbl file to write.", metavar="OUT")],
    compression: Annotated[str, typer.Option("--compression", "-c", metavar="auto|none|lz4|zstd",
                                             help="auto: store JPEG/PNG/WEBP as is (compression saves ~0 %), LZ4 the rest. "
                                                  "zstd files do not open in TurboLoader.")] = "auto",
    level: Annotated[int | None, typer.Option("--level", help="Compression level (LZ4 >1 = high compression; ZSTD 1-22, default 3).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", min=0, help="Checksum/compression threads (default: WARP_WORKERS or CPUs).")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Re-read OUT after writing and check every checksum.")] = False,
    on_error: Annotated[str, typer.Option("--on-error", metavar="raise|skip|warn",
                                          help="A sample whose image header is unreadable: stop (raise), leave it out "
                                               "quietly (skip) or with a warning (warn).")] = "raise",
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace OUT if it exists.")] = False,
    max_member_mb: Annotated[int, typer.Option("--max-member-mb", min=1, metavar="N",
                                               help="Refuse a tar member declaring more than N MiB (guards "
                                                    "against damaged headers and gzip bombs).")] = 1024,
) -> int:
    import os

    from warpdata.core.errors import UsageError
    from warpdata.tbl.converter import ConvertRequest, convert

    if workers is None:
        from warpdata.etl.workers import env_workers

        workers = env_workers() or 0  # a malformed WARP_WORKERS is a ConfigError (exit 78), as in every ETL

    if os.path.lexists(output) and not force:  # fails early; the final move checks again, atomically
        raise UsageError(f"{output} already exists", hint="pass --force to replace it, or choose another OUT")
    req = ConvertRequest(input=input, output=output, compression=compression, level=level,
                         workers=workers, verify=verify, on_error=on_error,
                         max_member_bytes=max_member_mb << 20, replace=force)
    total = os.path.getsize(input) if input != "-" and os.path.isfile(input) else None
    with out.progress(f"tar-to-tbl {os.path.basename(output)}", total=total, unit="B") as bar:
        last = [0]

        def progress(_samples: int, pos: int) -> None:
            if pos - last[0] >= 1 << 20:  # redraws cost more than converting a sample
                bar.advance(pos - last[0])
                last[0] = pos

        res = convert(req, progress=progress, warn=out.warn)
    if out.options().json:
        out.emit_json(res.to_dict())
        return 0
    if out.options().quiet:  # -q: only the output path, for pipelines
        out.data(str(output))
        return 0
    d = res.to_dict()
    rows = [
        ["samples", f"{res.samples:,}"],
        ["sidecars", f"{res.sidecars:,}"],
        ["skipped members", f"{res.skipped:,}"],
        *[[f"  {reason}", f"{n:,}"] for reason, n in res.skipped_by_reason.items()],
        ["formats", ", ".join(f"{k} {v:,}" for k, v in res.formats.items()) or "-"],
        ["compressed samples", f"{res.compressed_samples:,}"],
        ["input bytes", f"{res.tar_bytes:,}" if res.tar_bytes is not None else "(stream)"],
        ["output bytes", f"{res.output_bytes:,}"],
        ["output / input", f"{d['ratio']:.4f}" if d["ratio"] else "-"],
        ["seconds", f"{res.seconds:.2f}"],
        ["samples/s", f"{res.samples_per_s:,.0f}"],
        ["verified", {True: "yes", None: "no (use --verify)"}.get(res.verified, "no")],
    ]
    out.table(f"{input} -> {output}", ["", "value"], rows)
    for ex in res.skipped_examples[:5]:
        out.detail(f"skipped {ex['member']}: {ex['reason']}")
    return 0
