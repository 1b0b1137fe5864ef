"""Scan a directory tree of captioned media for the feature cache.

Contract: :func:`scan` walks ``root`` (sorted, deterministic; hidden files
and directories skipped) and returns the usable :class:`MediaItem` list in
relative-path order. A media file's caption is the same-name ``.txt`` file
beside it (``cat.jpg`` → ``cat.txt``), stripped, with an optional prefix.
Every media file is either returned or quarantined in the given
:class:`~warpdata.etl.quarantine.Quarantine` under the run named by its first
directory level (``"."`` for files directly under ``root``):

================== ========= ============================================
reason             category  when
================== ========= ============================================
``missing-caption`` missing  no same-name caption file
``empty-caption``   invalid  the caption is empty or only whitespace
``bad-caption``     invalid  the caption is not UTF-8 text
``unsupported-format`` invalid not an image or video extension, or a video
                             when OpenCV (the frame decoder) is not installed
``unreadable``      missing  the file cannot be read (permissions, I/O), or is
                             not a regular file (FIFO, device, socket)
``path-outside-root`` invalid a symlink (media or caption) leading out of ``root``
``too-large``       invalid  a caption over :data:`MAX_CAPTION_BYTES`
================== ========= ============================================

Nothing outside ``root`` is ever read: directory symlinks are not followed
and file symlinks must resolve inside ``root``.

Videos become one sample each: their middle frame, decoded with OpenCV's
FFmpeg backend (``opencv-python-headless``, a core dependency).
Undecodable images and videos are found later, when the build decodes them
(``decode-error``/``truncated``). Each item carries an xxh3-128 digest of its
media and caption bytes: the cache fingerprint covers the content, not paths
and sizes, so a same-size edit still invalidates the cache.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

import xxhash
from warpdata.core.errors import MissingInputError
from warpdata.etl.quarantine import Quarantine, register_reason

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
VIDEO_EXTS = frozenset({".mp4", ".mov", ".avi", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv"})

register_reason("missing-caption", "missing", "the media file has no same-name caption (.txt) file")
register_reason("empty-caption", "invalid", "the caption file is empty or only whitespace")
register_reason("bad-caption", "invalid", "the caption file is not UTF-8 text")
# the same codes and texts as the tensor warehouse's (warpdata.warehouse.labels)
MAX_CAPTION_BYTES = 16 << 20
register_reason("unsupported-format", "invalid",
                "the file is not a supported image (videos need a frame decoder that is not installed)")


def video_decoder() -> bool:
    """Whether OpenCV (warp's video frame decoder) is importable."""
    import importlib.util

    return importlib.util.find_spec("cv2") is not None


@dataclass(frozen=True)
class MediaItem:
    key: str  # path relative to the root, POSIX separators
    path: str
    caption: str  # prefix + stripped caption text
    run: str  # first directory level, "." at the root
    digest: str  # xxh3-128 over media bytes, caption bytes
    is_video: bool = False


@dataclass
class ScanResult:
    items: list[MediaItem]
    orphan_captions: int  # .txt files with no media beside them
    files_seen: int


def _refused(path: str, root_real: str, max_bytes: int | None = None) -> tuple[str, str] | None:
    """(reason, why) when ``path`` must not be read: a link leading out of the root, or not a regular file."""
    if os.path.islink(path):
        real = os.path.realpath(path)
        if real != root_real and not real.startswith(root_real.rstrip("/") + "/"):
            return "path-outside-root", f"is a symlink to {real}, outside the source directory"
    try:
        st = os.stat(path)
    except OSError as e:
        return "unreadable", str(e.strerror or e)
    if not stat.S_ISREG(st.st_mode):
        return "unreadable", "is not a regular file"
    if max_bytes is not None and st.st_size > max_bytes:
        return "too-large", f"is {st.st_size} bytes, over the {max_bytes >> 20} MiB caption limit"
    return None


def _hash_file(path: str, h: xxhash.xxh3_128, buf: bytearray) -> None:
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])


def media_entry(rel0: str, path: str, key_prefix: str, captions: set[str], caption_ext: str, can_video: bool,
                quarantine, used: set[str]) -> tuple[str, str, str, str] | None:
    """``(key, run, caption rel, caption key)`` of media file ``rel0`` (a path relative to the scanned
    root, ``/``-separated), or None after rejecting it into ``quarantine``: a format that cannot be
    decoded, or no caption beside it. Its caption goes into ``used`` either way. The one rule for a
    local folder and a bucket listing."""
    rel = key_prefix + rel0
    run = key_prefix + rel0.split("/", 1)[0] if "/" in rel0 else (key_prefix.rstrip("/") or ".")
    stem0, ext = posixpath.splitext(rel0)
    ext = ext.lower()
    cap_rel0 = next((c for c in (stem0 + caption_ext, stem0 + caption_ext.upper()) if c in captions), None)
    if cap_rel0 is not None:
        used.add(cap_rel0)
    if ext in VIDEO_EXTS and not can_video:
        quarantine.reject(run, rel, path, "unsupported-format",
                          f"{rel}: video frames cannot be decoded: OpenCV is not installed "
                          "(pip install opencv-python-headless)")
        return None
    if ext not in IMAGE_EXTS and ext not in VIDEO_EXTS:
        quarantine.reject(run, rel, path, "unsupported-format",
                          f"{rel}: '{ext or '(no extension)'}' is not a supported image format "
                          f"(images: {', '.join(sorted(IMAGE_EXTS))}; videos: {', '.join(sorted(VIDEO_EXTS))})")
        return None
    if cap_rel0 is None:
        quarantine.reject(run, rel, path, "missing-caption",
                          f"{rel}: no caption file {posixpath.basename(stem0) + caption_ext} beside it")
        return None
    return rel, run, cap_rel0, key_prefix + cap_rel0


def scan(root: str | os.PathLike, quarantine: Quarantine, *, caption_prefix: str = "",
         caption_ext: str = ".txt", exclude: tuple[str | os.PathLike, ...] = (),
         key_prefix: str = "") -> ScanResult:
    """``exclude``: directories not to descend into (the cache itself when it lies under ``root``).

    ``key_prefix`` (``"d1/"`` for the second ``[[directory]]``) is prepended to every key, sample id
    and run name, so records of several source directories never share a key.
    """
    rootp = Path(root)
    skip = {os.path.realpath(p) for p in exclude}
    if not rootp.is_dir():
        raise MissingInputError(f"{rootp}: source directory does not exist",
                                hint="check [source] path in the config (or --input)")
    caption_ext = caption_ext.lower()
    root_real = os.path.realpath(rootp)
    media: list[tuple[str, str]] = []
    captions: set[str] = set()
    files_seen = 0
    for dirpath, dirnames, filenames in os.walk(rootp):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and os.path.realpath(os.path.join(dirpath, d)) not in skip)
        rel_dir = os.path.relpath(dirpath, rootp)
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            files_seen += 1
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            if os.path.splitext(name)[1].lower() == caption_ext:
                captions.add(rel)
            else:
                media.append((rel, os.path.join(dirpath, name)))
    media.sort()
    items: list[MediaItem] = []
    used_captions: set[str] = set()
    buf = bytearray(1 << 20)
    can_video = video_decoder()
    for rel0, path in media:
        got = media_entry(rel0, path, key_prefix, captions, caption_ext, can_video, quarantine, used_captions)
        if got is None:
            continue
        rel, run, cap_rel0, cap_rel = got
        cap_path = os.path.join(rootp, cap_rel0)
        bad = _refused(path, root_real)
        if bad is None:
            bad = _refused(cap_path, root_real, MAX_CAPTION_BYTES)
            if bad is not None:
                quarantine.reject(run, rel, cap_path, bad[0], f"{cap_rel}: {bad[1]}")
                continue
        else:
            quarantine.reject(run, rel, path, bad[0], f"{rel}: {bad[1]}")
            continue
        try:
            with open(cap_path, "rb") as f:
                raw = f.read(os.fstat(f.fileno()).st_size + 1)  # what the stat promised (read(n) allocates n)
            if len(raw) > MAX_CAPTION_BYTES:
                quarantine.reject(run, rel, cap_path, "too-large", f"{cap_rel}: over the caption limit")
                continue
            text = raw.decode("utf-8-sig").strip()
        except UnicodeDecodeError as e:
            quarantine.reject(run, rel, cap_path, "bad-caption", f"{cap_rel}: not UTF-8 ({e.reason} at byte {e.start})")
            continue
        except OSError as e:
            quarantine.reject(run, rel, cap_path, "unreadable", f"{cap_rel}: {e.strerror or e}")
            continue
        if not text:
            quarantine.reject(run, rel, cap_path, "empty-caption", f"{cap_rel}: caption is empty")
            continue
        h = xxhash.xxh3_128()
        try:
            _hash_file(path, h, buf)
        except OSError as e:
            quarantine.reject(run, rel, path, "unreadable", f"{rel}: {e.strerror or e}")
            continue
        h.update(b"\0caption\0")
        h.update(raw)
        items.append(MediaItem(rel, path, caption_prefix + text, run, h.hexdigest(), posixpath.splitext(rel0)[1].lower() in VIDEO_EXTS))
    return ScanResult(items, len(captions - used_captions), files_seen)


def source_digest(items: list[MediaItem]) -> str:
    """One digest over every usable item's key and content (order-independent input, sorted)."""
    h = xxhash.xxh3_128()
    for it in items:
        h.update(it.key.encode("utf-8"))
        h.update(b"\0")
        h.update(it.digest.encode("ascii"))
        h.update(b"v" if it.is_video else b"i")
        h.update(b"\n")
    return h.hexdigest()
