"""warpdata.core.errors: the one "rejected with a reason" class."""

from __future__ import annotations


def test_one_rejected_with_a_reason_class_for_every_pipeline():
    """The image probe, confined reads, both decoders and ingest raise one class (warpdata.core.errors)."""
    from warpdata.core.errors import Rejected, WarpError
    from warpdata.features.transform import DecodeFailure
    from warpdata.publishing.ingest import Rejected as IngestRejected
    from warpdata.warehouse.images import ProbeError
    from warpdata.warehouse.labels import UnsafeFile
    from warpdata.warehouse.transform import DecodeError

    assert {ProbeError, UnsafeFile, DecodeError, DecodeFailure, IngestRejected} == {Rejected}
    assert not issubclass(Rejected, WarpError)  # a quarantine verdict, caught by its pipeline


def test_a_rejection_pickles_whole():
    """A worker process hands a rejection back to the driver with its reason, message and size."""
    import pickle

    from warpdata.core.errors import Rejected

    r = pickle.loads(pickle.dumps(Rejected("too-large", "a.jpg: 9 MB over the limit", 9_000_000)))
    assert (type(r), r.reason, r.message, r.size, str(r)) == (
        Rejected, "too-large", "a.jpg: 9 MB over the limit", 9_000_000, "a.jpg: 9 MB over the limit")
