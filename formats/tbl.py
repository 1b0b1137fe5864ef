"""TBL v2 container: layout, codecs, a streaming writer and an mmap reader.

The byte layout is specified in ``docs/formats/tbl-v2.md`` and is the one
``turboloader`` 2.39 writes and reads (docs/design.md §3)::

    [header 64 B][index N x 24 B][payloads (+ CRC-32 trailers)][metadata blocks]

Contract:

* :class:`TblWriter` streams: payloads, index entries and metadata blocks go
  to spool files beside the output as they arrive, so memory stays constant in
  the number of samples; :meth:`TblWriter.close` assembles the final file under
  a temporary name and renames it into place. With ``extensions=False`` the
  output is a plain TurboLoader file, byte-identical to ``TblWriterV2``'s for the
  same inputs; with ``extensions=True`` (default) it adds warp's extensions
  (CRC-32 payload trailers, index CRC-32, ZSTD entries, warp JSON metadata,
  metadata block and section CRC-32s), each announced by a header flag bit,
  which a TurboLoader reader either ignores or refuses (it never returns
  wrong bytes; see the spec). With all of them every byte a reader uses is
  under a CRC it checks.
* :class:`TblReader` memory-maps a file, validates header, index CRC and every
  index entry at open (offsets in range, no overlaps, plausible sizes), and
  returns zero-copy ``memoryview`` payloads in O(1); with ``verify=True`` each
  read checks the payload's CRC. Metadata is checked against the section CRC
  before its first parse, and each block against its own CRC when read. Broken invariants raise one typed error each
  (:class:`BadMagic`, :class:`UnsupportedVersion`, :class:`TruncatedFile`,
  :class:`CorruptIndex`, :class:`ChecksumMismatch`, :class:`CorruptMetadata`,
  :class:`DecompressionError`), all :class:`~warpdata.core.errors.DataError`\\ s
  naming the file, the sample and the offset.

The code is in three modules: :mod:`warpdata.formats.tbl_layout` (structs, flags, CRCs, errors,
codecs), :mod:`warpdata.formats.tbl_writer` and :mod:`warpdata.formats.tbl_reader`; every name
stays importable from here.
"""

from __future__ import annotations

from warpdata.core.errors import (
    DataError as DataError,  # the module's error bases, as before the split
)
from warpdata.core.errors import MissingInputError as MissingInputError
from warpdata.core.errors import UsageError as UsageError
from warpdata.core.errors import WarpError as WarpError
from warpdata.formats.tbl_layout import (
    _BIG_ENDIAN as _BIG_ENDIAN,
)
from warpdata.formats.tbl_layout import (
    _U32 as _U32,
)
from warpdata.formats.tbl_layout import (
    COMPRESSIONS,
    CRC32_RESIDUE,
    E_HAS_METADATA,
    E_LZ4,
    E_ZSTD,
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    EXTENSION_FLAGS,
    F_COMPRESSED,
    F_HAS_CHECKSUMS,
    F_HAS_METADATA,
    F_INDEX_CRC32,
    F_META_CRC32,
    F_PAYLOAD_CRC32,
    F_WARP_METADATA,
    F_ZSTD,
    FORMAT_CODES,
    FORMATS,
    HEADER,
    HEADER_SIZE,
    KNOWN_FLAGS,
    LZ4_MAX_RATIO,
    MAGIC,
    MAX_DIM,
    META_BLOCK,
    META_BLOCK_SIZE,
    META_CUSTOM,
    META_JSON,
    META_MSGPACK,
    META_NONE,
    META_PROTOBUF,
    PRECOMPRESSED,
    TRAILER_SIZE,
    VERSION,
    BadMagic,
    ChecksumMismatch,
    CorruptIndex,
    CorruptMetadata,
    CorruptSample,
    DecompressionError,
    EncodedSample,
    Header,
    SampleInfo,
    SampleNotFound,
    TblError,
    TruncatedFile,
    UnsupportedVersion,
    canonical_json,
    crc16,
    crc32,
    encode_sample,
    entry_codec,
    parse_header,
    resolve_compression,
)
from warpdata.formats.tbl_layout import (
    _tls as _tls,
)
from warpdata.formats.tbl_layout import (
    _zstd_c as _zstd_c,
)
from warpdata.formats.tbl_layout import (
    _zstd_d as _zstd_d,
)
from warpdata.formats.tbl_reader import (
    TblReader,
)
from warpdata.formats.tbl_writer import (
    _HUGE_PAGE as _HUGE_PAGE,
)
from warpdata.formats.tbl_writer import (
    TblWriter,
    write_tbl,
)
from warpdata.formats.tbl_writer import (
    _copy_range as _copy_range,
)
from warpdata.formats.tbl_writer import (
    _DirectPayloads as _DirectPayloads,
)
from warpdata.formats.tbl_writer import (
    _staging_buffer as _staging_buffer,
)

__all__ = [
    "META_CUSTOM",
    "META_JSON",
    "META_MSGPACK",
    "META_NONE",
    "META_PROTOBUF",
    "BadMagic",
    "COMPRESSIONS",
    "CRC32_RESIDUE",
    "ChecksumMismatch",
    "CorruptIndex",
    "CorruptMetadata",
    "CorruptSample",
    "DecompressionError",
    "ENTRY",
    "ENTRY_DTYPE",
    "ENTRY_SIZE",
    "EXTENSION_FLAGS",
    "E_HAS_METADATA",
    "E_LZ4",
    "E_ZSTD",
    "EncodedSample",
    "FORMATS",
    "FORMAT_CODES",
    "F_COMPRESSED",
    "F_HAS_CHECKSUMS",
    "F_HAS_METADATA",
    "F_INDEX_CRC32",
    "F_META_CRC32",
    "F_PAYLOAD_CRC32",
    "F_WARP_METADATA",
    "F_ZSTD",
    "HEADER",
    "HEADER_SIZE",
    "Header",
    "KNOWN_FLAGS",
    "LZ4_MAX_RATIO",
    "MAGIC",
    "MAX_DIM",
    "META_BLOCK",
    "META_BLOCK_SIZE",
    "PRECOMPRESSED",
    "SampleInfo",
    "SampleNotFound",
    "TRAILER_SIZE",
    "TblError",
    "TblReader",
    "TblWriter",
    "TruncatedFile",
    "UnsupportedVersion",
    "VERSION",
    "canonical_json",
    "crc16",
    "crc32",
    "encode_sample",
    "entry_codec",
    "parse_header",
    "resolve_compression",
    "write_tbl",
]
