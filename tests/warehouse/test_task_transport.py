"""A shard task's trip to a process or cluster worker: its samples go as columns (two joined
arrays, one list per field) and come back equal, field by field; the Dask runner sends a batch
of tasks as one pickle the scheduler does not open (warp/etl/runners.py, ``pack_batch``)."""

from __future__ import annotations

import pickle

import cloudpickle
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.etl.runners import pack_batch, run_packed_batch
from warpdata.warehouse.images import ImageProbe
from warpdata.warehouse.shards import ShardTask
from warpdata.warehouse.transform import TransformSpec
from warpdata.warehouse.validate import ValidSample, pack_samples, unpack_samples

_text = st.text(max_size=12)


@st.composite
def samples(draw) -> ValidSample:
    n = draw(st.integers(0, 5))
    boxes = np.array(draw(st.lists(st.lists(st.floats(-1e6, 1e6), min_size=4, max_size=4), min_size=n,
                                   max_size=n)), np.float64).reshape(n, 4)
    classes = np.array(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n, max_size=n)), np.int32)
    probe = ImageProbe(draw(st.sampled_from(["jpeg", "png"])), draw(st.integers(1, 10**5)),
                       draw(st.integers(1, 10**5)), draw(st.integers(1, 8)))
    return ValidSample(key=draw(_text), image=draw(_text), run=draw(_text), source=draw(_text), boxes=boxes,
                       classes=classes, frame_id=draw(st.integers(0, 10**9)), run_id=draw(_text), probe=probe,
                       sha256=draw(_text), nbytes=draw(st.integers(0, 10**9)),
                       stat_key=draw(st.tuples(st.integers(0, 10**9), st.integers(0, 10**18), st.integers(0, 10**9))),
                       url=draw(st.none() | _text), local=draw(st.none() | _text),
                       ann_ids=draw(st.none() | st.lists(_text, max_size=n)))


def _same(a: ValidSample, b: ValidSample) -> None:
    assert type(b) is ValidSample and type(b.probe) is ImageProbe
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape
            assert np.array_equal(x, y, equal_nan=True), name
        else:
            assert x == y and type(x) is type(y), name


def _task(ss: list[ValidSample]) -> ShardTask:
    return ShardTask(3, "shard-000003", "/out/shard-000003.twh1", TransformSpec(64, 48), 32, 64, ss,
                     upload=None)


@settings(max_examples=60, deadline=None)
@given(st.lists(samples(), max_size=8))
def test_a_task_pickles_back_equal(ss):
    task = _task(ss)
    back = pickle.loads(pickle.dumps(task, protocol=5))
    assert (back.index, back.shard_id, back.path, back.spec, back.max_boxes, back.capacity, back.upload) == \
        (task.index, task.shard_id, task.path, task.spec, task.max_boxes, task.capacity, task.upload)
    assert len(back.samples) == len(ss)
    for a, b in zip(ss, back.samples, strict=True):
        _same(a, b)


def test_columns_are_two_arrays_not_two_per_sample():
    ss = [ValidSample(f"k{i}", f"/img/{i}.jpg", "r", "s", np.full((i % 3, 4), i, np.float64),
                      np.full(i % 3, i, np.int32), i, "r0", ImageProbe("jpeg", 10, 10, 1), "0" * 64, 100)
          for i in range(64)]
    packed = pack_samples(ss)
    assert packed is not None
    arrays = [x for x in packed if isinstance(x, np.ndarray)]
    assert len(arrays) == 2  # boxes and classes, joined
    # out-of-band buffers a Dask client would make: two for the shard, not 128
    bufs: list = []
    pickle.dumps(_task(ss), protocol=5, buffer_callback=bufs.append)
    assert len(bufs) == 2
    for a, b in zip(ss, unpack_samples(packed), strict=True):
        _same(a, b)


def test_samples_whose_arrays_differ_travel_one_by_one():
    a = ValidSample("a", "/a", "r", "s", np.zeros((1, 4)), np.zeros(1, np.int32), 0, "r0",
                    ImageProbe("png", 1, 1, 1), "x", 1)
    b = ValidSample("b", "/b", "r", "s", np.zeros((1, 4), np.float32), np.zeros(1, np.int32), 1, "r0",
                    ImageProbe("png", 1, 1, 1), "y", 1)
    assert pack_samples([a, b]) is None  # float64 beside float32: joining would change a dtype
    back = pickle.loads(pickle.dumps(_task([a, b])))
    _same(a, back.samples[0])
    _same(b, back.samples[1])
    assert back.samples[1].boxes.dtype == np.float32


def _double(x: int) -> int:
    return 2 * x


def test_a_packed_batch_is_bytes_and_runs_in_order():
    payload = pack_batch([1, 2, 3])
    assert isinstance(payload, bytes)
    assert run_packed_batch(_double, payload) == [(True, 2), (True, 4), (True, 6)]


def test_a_batch_that_does_not_pickle_is_handed_on_as_it_is():
    import threading

    tasks = [threading.Lock()]  # no pickler takes a lock: Dask's own pickling then names it
    assert pack_batch(tasks) is tasks
    with_lambda = pack_batch([lambda: 1])  # cloudpickle takes what Dask's pickling takes
    assert isinstance(with_lambda, bytes) and cloudpickle.loads(with_lambda)[0]() == 1
