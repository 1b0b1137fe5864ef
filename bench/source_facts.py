"""Source requests of the feature-cache and tiles ETLs reading from S3: a cold build, a no-op
rerun, and a rerun after one source object is overwritten (issue 37 item 2).

Counts what the moto S3 server (127.0.0.1, request counting: tests/support/s3fixtures.py) saw of
the source prefix: LIST requests, GETs and HEADs of source objects, and the distinct objects read.
Each run is a fresh ``python -m warpdata etl`` process with one ``WARP_CACHE_DIR``, so a run knows
only what an earlier run recorded. Run it with any checkout's interpreter to compare code::

    .venv/bin/python bench/source_facts.py --captions 60
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def counts(server, bucket: str, prefix: str) -> dict[str, int]:
    reqs = [q for q in server.requests() if q["bucket"] == bucket]
    src = [q for q in reqs if q["key"].startswith(prefix + "/") or q["key"] == prefix]
    return {"LIST": sum(1 for q in reqs if q["key"] == "" and "list-type" in q["query"]
                        and f"prefix={prefix}" in q["query"]),
            "GET": sum(1 for q in src if q["method"] == "GET"),
            "HEAD": sum(1 for q in src if q["method"] == "HEAD"),
            "objects read": len({q["key"] for q in src if q["method"] in ("GET", "HEAD")})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--captions", type=int, default=60, help="good captioned images in the source folder")
    args = ap.parse_args()

    import boto3
    import numpy as np
    from support.s3fixtures import s3_env, start_moto_server
    from warpdata.sampledata import captions
    from warpdata.sampledata.volume import photo_like_volume

    server = start_moto_server()
    env = {**os.environ, **s3_env(server.endpoint)}
    os.environ.update(s3_env(server.endpoint))
    client = boto3.client("s3", endpoint_url=server.endpoint)
    bucket = "bench-source-facts"
    client.create_bucket(Bucket=bucket)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        env["WARP_CACHE_DIR"] = str(tmp / "cache")

        def etl(cfg: Path, *extra: str) -> dict:
            r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "-q", *extra],
                               capture_output=True, text=True, env=env, timeout=900)
            if r.returncode != 0:
                raise SystemExit(f"warp etl failed ({r.returncode}): {r.stderr}")
            return json.loads(r.stdout)

        def phase(name: str, prefix: str, run) -> None:
            server.reset()
            res = run()
            print(f"  {name:<28} status={res['status']:<11} {counts(server, bucket, prefix)}")

        # the feature cache: captions.generate's folder (good images, a video where OpenCV encodes one, the
        # planted broken files), one good image then overwritten with another's bytes
        gen = captions.generate(tmp / "cap", count=args.captions, seed=0)
        media = Path(gen["path"])
        files = sorted(p for p in media.rglob("*") if p.is_file())
        for p in files:
            client.put_object(Bucket=bucket, Key=f"fc/{p.relative_to(media).as_posix()}", Body=p.read_bytes())
        ncap = sum(1 for p in files if p.suffix == ".txt")
        print(f"feature cache: s3://{bucket}/fc, {len(files)} objects ({ncap} captions), local output")
        fc = ("--input", f"s3://{bucket}/fc", "--output", str(tmp / "fc-out"))
        phase("cold build", "fc", lambda: etl(Path(gen["config"]), *fc))
        phase("no-op rerun", "fc", lambda: etl(Path(gen["config"]), *fc))
        jpgs = sorted(p for p in files if p.suffix == ".jpg" and "group_000" in p.as_posix())
        client.put_object(Bucket=bucket, Key=f"fc/{jpgs[0].relative_to(media).as_posix()}", Body=jpgs[1].read_bytes())
        phase("one image overwritten", "fc", lambda: etl(Path(gen["config"]), *fc))
        phase("no-op rerun after it", "fc", lambda: etl(Path(gen["config"]), *fc))

        # tiles: one .npy input object, a local output
        vol = tmp / "v.npy"
        np.save(vol, photo_like_volume((64, 128, 128), "uint16", seed=1))
        client.put_object(Bucket=bucket, Key="tiles/v.npy", Body=vol.read_bytes())
        cfg = tmp / "tiles.toml"
        cfg.write_text(f"""
[source]
path = "s3://{bucket}/tiles/v.npy"
format = "npy"
[tiles]
chunks = [16, 64, 64]
backend = "cpu"
[output]
path = "{tmp / 'tiles-out.zarr'}"
""")
        print(f"tiles: s3://{bucket}/tiles/v.npy ({vol.stat().st_size} bytes), local output")
        phase("cold build", "tiles", lambda: etl(cfg))
        phase("no-op rerun", "tiles", lambda: etl(cfg))
        np.save(vol, photo_like_volume((64, 128, 128), "uint16", seed=2))
        client.put_object(Bucket=bucket, Key="tiles/v.npy", Body=vol.read_bytes())
        phase("input overwritten", "tiles", lambda: etl(cfg))
        phase("no-op rerun after it", "tiles", lambda: etl(cfg))
    server.stop()


if __name__ == "__main__":
    main()
