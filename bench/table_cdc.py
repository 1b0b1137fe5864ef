"""What Parquet pages two versions of a table share, by writer layout (issue 39, item 2).

Counts, no timings: a table of ``--rows`` rows (id, a label, a score, a 40-float16 embedding, a
caption: the fleet table's columns) is written as version 1; version 2 relabels 1 % of the rows,
replaces 1 % (new score, embedding, caption) and appends 1 %; version 3 deletes 1 % at random.
Each is written three ways: warp publish's page layout (256-row pages, 65,536-row groups, a page
index), the same with pyarrow's content-defined chunking at its defaults (pyarrow >= 21,
``use_content_defined_chunking=True``), and with small chunks (4-32 KiB). Printed per layout and
edit: the bytes of the new version's data pages whose exact bytes no page of version 1 has
(what a store deduplicating pages would have to upload), against the file.

    python bench/table_cdc.py [--rows 200000]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os


def table(n: int, seed: int, first_id: int = 0):
    import numpy as np
    import pyarrow as pa

    r = np.random.default_rng(seed)
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    return pa.table({"id": ids, "label": pa.array([f"class-{i % 100}" for i in ids.tolist()]),
                     "score": r.random(n).astype(np.float32),
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(r.standard_normal(n * 40).astype(np.float16)), 40),
                     "text": pa.array(np.char.add("caption ", r.integers(0, 1 << 62, n).astype(str)).tolist())})


def versions(n: int):
    """(v1, v2 = 1 % relabelled + 1 % replaced + 1 % appended, v3 = 1 % deleted)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    v1 = table(n, 0)
    idx = rng.choice(n, n // 50, replace=False)
    relabel, replace = idx[: n // 100], idx[n // 100:]
    labels = v1.column("label").to_pylist()
    for i in relabel:
        labels[i] = "class-x"
    other = table(n, 1)
    emb = v1.column("emb").combine_chunks().values.to_numpy(zero_copy_only=False).reshape(n, 40).copy()
    other_emb = other.column("emb").combine_chunks().values.to_numpy(zero_copy_only=False).reshape(n, 40)
    score = v1.column("score").to_numpy().copy()
    text = v1.column("text").to_pylist()
    for i in replace:
        emb[i], score[i], text[i] = other_emb[i], other.column("score")[int(i)].as_py(), other.column("text")[int(i)].as_py()
    v2 = pa.table({"id": v1.column("id"), "label": pa.array(labels), "score": pa.array(score),
                   "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 40), "text": pa.array(text)})
    v2 = pa.concat_tables([v2, table(n // 100, 2, first_id=n)])
    keep = np.ones(n, bool)
    keep[rng.choice(n, n // 100, replace=False)] = False
    return v1, v2, v1.filter(pa.array(keep))


def pages(t, cdc) -> tuple[dict[bytes, int], int]:
    """SHA-256 of each data page -> its bytes, and the file's size."""
    import pyarrow.parquet as pq
    from warpdata.formats import parquet_pages as pp

    b = io.BytesIO()
    kw = {"write_page_index": True, "max_rows_per_page": 256, "row_group_size": 65536, "use_dictionary": ["label"]}
    if cdc:
        kw["use_content_defined_chunking"] = cdc
    pq.write_table(t, b, **kw)
    data = b.getvalue()
    n = int.from_bytes(data[-8:-4], "little")
    fmd = pp.footer_of(data[-8 - n:])
    out = {}
    for g in range(pp.row_group_count(fmd)):
        for leaf in range(pp.leaf_count(fmd, g)):
            off, length = pp.offset_index(fmd, g, leaf)
            for p in pp.pages_for_rows(fmd, g, leaf, data[off:off + length]).pages:
                out[hashlib.sha256(data[p.offset:p.offset + p.size]).digest()] = p.size
    return out, len(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args()
    print(f"# load {os.getloadavg()[0]:.2f}; {args.rows:,} rows; counts, not timings")
    v1, v2, v3 = versions(args.rows)
    layouts = [("publish's pages (256 rows)", None), ("+ CDC, pyarrow defaults", True),
               ("+ CDC, 4-32 KiB chunks", {"min_chunk_size": 4096, "max_chunk_size": 32768})]
    print("| layout | edit | new version | page bytes not in v1 | share of the file |")
    print("|---|---|---|---|---|")
    for name, cdc in layouts:
        base, _ = pages(v1, cdc)
        for edit, t in (("1 % relabel + 1 % replace + 1 % append", v2), ("1 % deleted", v3)):
            got, size = pages(t, cdc)
            fresh = sum(s for h, s in got.items() if h not in base)
            print(f"| {name} | {edit} | {size / 1e6:.1f} MB | {fresh / 1e6:.2f} MB | {fresh / size:.1%} |")


if __name__ == "__main__":
    main()
