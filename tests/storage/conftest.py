"""The Ceph RADOS Gateway fixtures (tests/support/ceph.py) for every module here: one session
fixture, so one cluster per run however many modules use it."""

from support.ceph import rgw, rgw_server  # noqa: F401  (fixtures)
