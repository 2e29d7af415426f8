"""What a front end and the dispatcher exchange: token ids in, vectors out, packed and unpacked unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from windve.dispatcher import messages


@pytest.mark.parametrize("lengths", [[75], [1], [3, 1, 7], [512] * 4 + [2]])
def test_sequences_round_trip_through_bytes(lengths):
    rng = np.random.default_rng(len(lengths))
    sequences = [rng.integers(0, 30522, size=n, dtype=np.int32) for n in lengths]
    lengths_bytes, ids_bytes = messages.pack_sequences(sequences)
    # What the link hands the dispatcher: bytes copied off the socket.
    back = messages.unpack_sequences(bytes(lengths_bytes), bytes(ids_bytes))
    assert [len(seq) for seq in back] == lengths
    for sent, received in zip(sequences, back):
        assert received.dtype == np.int32
        np.testing.assert_array_equal(received, sent)


@pytest.mark.parametrize(
    "lengths, ids",
    [
        ([], [1, 2]),  # no sequence
        ([2], [1, 2, 3]),  # more ids than the lengths say
        ([2, 2], [1, 2, 3]),  # fewer
        ([3, 0], [1, 2, 3]),  # an empty sequence
        ([4, -1], [1, 2, 3]),  # a negative length that makes the sum right
    ],
)
def test_malformed_frames_are_refused(lengths, ids):
    lengths_bytes = np.asarray(lengths, dtype=np.int32).tobytes()
    ids_bytes = np.asarray(ids, dtype=np.int32).tobytes()
    with pytest.raises(ValueError, match="malformed"):
        messages.unpack_sequences(lengths_bytes, ids_bytes)


def test_vectors_arrive_writable():
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = messages.unpack_vectors(vectors.tobytes(), 3, 4)
    back /= 2  # the front end normalizes in place
    np.testing.assert_array_equal(back * 2, vectors)


def test_an_embed_request_and_its_answer_each_travel_as_one_frame(tmp_path):
    """What a front end sends and what it reads back, over a real Unix socket."""
    import asyncio

    from tests.dispatcher.fake_dispatcher import connected_front_end
    from windve.dispatcher.board import StateBoard

    board = tmp_path / "board"
    StateBoard(board, create=True).close()
    address = str(tmp_path / "dispatcher.sock")
    sequences = [np.arange(1, 76, dtype=np.int32), np.arange(5, 9, dtype=np.int32)]
    vectors = np.arange(2 * 384, dtype=np.float32).reshape(2, 384)

    async def round_trip():
        received: asyncio.Queue = asyncio.Queue()
        async with connected_front_end(address, board, received.put_nowait) as (front_end, dispatcher):
            ticket = front_end.submit(sequences)
            frames = await asyncio.wait_for(received.get(), 10)
            header = messages.unpack(frames[0])
            answer = {"id": header["id"], "status": messages.OK, "n": 2, "dim": 384, "vectors": vectors.data}
            dispatcher.send([messages.pack(answer)])
            await asyncio.wait_for(ticket.future, 10)
            return frames, header, ticket.result()

    frames, header, answered = asyncio.run(round_trip())
    assert len(frames) == 1
    received = messages.unpack_sequences(header["lengths"], header["ids"])
    for sent, got in zip(sequences, received, strict=True):
        np.testing.assert_array_equal(got, sent)
    np.testing.assert_array_equal(answered, vectors)


def test_a_front_end_whose_dispatcher_goes_answers_its_waiting_requests_unavailable_at_once(tmp_path):
    import asyncio

    import pytest

    from queue_manager.protocol import Unavailable
    from tests.dispatcher.fake_dispatcher import connected_front_end
    from windve.dispatcher.board import StateBoard

    board = tmp_path / "board"
    StateBoard(board, create=True).close()
    address = str(tmp_path / "dispatcher.sock")

    async def body():
        async with connected_front_end(address, board) as (front_end, dispatcher):
            waiting = front_end.submit([np.arange(1, 9, dtype=np.int32)])
            await asyncio.sleep(0)  # the request is written at the end of this turn
            dispatcher.close()  # the dispatcher's end goes
            await asyncio.wait_for(waiting.future, 10)
            later = front_end.submit([np.arange(1, 9, dtype=np.int32)])
            return waiting, later

    waiting, later = asyncio.run(body())
    with pytest.raises(Unavailable, match="dispatcher has gone"):
        waiting.result()
    assert later.future.done()
    with pytest.raises(Unavailable, match="dispatcher has gone"):
        later.result()
