r"""TBL v2 container: layout, codecs, a streaming writer and an mmap reader.

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
  :class:`DecompressionError`), all :class:`~warpdata.core.errors.DataError`\ s
  naming the file, the sample and the offset.

The code is in three modules: :mod:`warpdata.formats.tbl_layout` (structs, flags, CRCs, errors,
codecs), :mod:`warpdata.formats.tbl_writer` and :mod:`warpdata.formats.tbl_reader`; every name
stays importable from here.
"""

from __future__ import annotations

from warpdata.core.errors import (  # the module's error bases, as before the split
    DataError as DataError,
)
from warpdata.core.errors import MissingInputError as MissingInputError
from warpdata.core.errors import UsageError as UsageError
from warpdata.core.errors import WarpError as WarpError
from warpdata.formats import tbl_layout as _layout
from warpdata.formats.tbl_layout import *  # noqa: F403 - the layout's public names (its __all__)
from warpdata.formats.tbl_layout import _BIG_ENDIAN as _BIG_ENDIAN
from warpdata.formats.tbl_layout import _U32 as _U32
from warpdata.formats.tbl_layout import _tls as _tls
from warpdata.formats.tbl_layout import _zstd_c as _zstd_c
from warpdata.formats.tbl_layout import _zstd_d as _zstd_d
from warpdata.formats.tbl_reader import TblReader
from warpdata.formats.tbl_writer import _HUGE_PAGE as _HUGE_PAGE
from warpdata.formats.tbl_writer import TblWriter, write_tbl
from warpdata.formats.tbl_writer import _copy_range as _copy_range
from warpdata.formats.tbl_writer import _DirectPayloads as _DirectPayloads
from warpdata.formats.tbl_writer import _staging_buffer as _staging_buffer

__all__ = [*_layout.__all__, "TblReader", "TblWriter", "write_tbl"]
