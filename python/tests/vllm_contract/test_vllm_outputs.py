"""The library's reader of vLLM's engine-core outputs (dynamo_ctx/backends/vllm_outputs.py)
against the installed vLLM: it knows every field of vLLM's output structs, the
layouts it hands the library are the ones the library's golden test reads
(go/engineout/testdata), and messages vLLM's own encoder writes, sent by a ZeroMQ
PUSH socket as vLLM's engine core sends them, reach the worker as vLLM's own reader
would hand them on.

Run by ``make test-vllm`` (with vLLM installed; skipped elsewhere).
"""

from __future__ import annotations

import importlib.util
import io
import json
import select
import time
from pathlib import Path
from typing import Any, List, Tuple

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed here: `make test-vllm` runs these tests", allow_module_level=True)

import zmq  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason, UtilityOutput  # noqa: E402
from vllm.v1.engine.exceptions import EngineDeadError  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402

from dynamo_ctx._lib import native  # noqa: E402
from dynamo_ctx.backends import vllm_outputs  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[3] / "go" / "engineout" / "testdata" / "vllm-0.32.0.json"


def test_it_knows_every_field_of_vllms_outputs() -> None:
    message, output = vllm_outputs.layouts(EngineCoreOutput, EngineCoreOutputs)
    assert message[EngineCoreOutputs.__struct_fields__.index("outputs")] == "o"
    assert output[EngineCoreOutput.__struct_fields__.index("request_id")] == "i"
    assert output[EngineCoreOutput.__struct_fields__.index("new_token_ids")] == "t"
    golden = json.loads(GOLDEN.read_text())
    import vllm

    if vllm.__version__ == golden["vllm"]:
        assert (message, output) == (golden["message_layout"], golden["output_layout"])


def _listen(tmp_path: Path) -> Tuple[int, io.FileIO, str]:
    path = str(tmp_path / "out")
    message, output = vllm_outputs.layouts(EngineCoreOutput, EngineCoreOutputs)
    h, fd = native().engine_outputs_listen(path.encode(), message.encode(), output.encode(), 9, 0.0)
    return h, io.FileIO(fd, "rb"), path  # the pipe's read end, non-blocking


def _take(pipe: io.FileIO, n: int) -> List[Any]:
    got: List[Any] = []
    buf = bytearray()
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        if not select.select([pipe], [], [], 0.5)[0]:
            continue
        data = pipe.read(1 << 20)
        if data is None:
            continue
        buf += data
        got += vllm_outputs.parse(buf)
    return got


def test_vllms_own_messages_come_through_whole(tmp_path: Path) -> None:
    h, pipe, path = _listen(tmp_path)
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.connect("ipc://" + path)
        enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
        sent = [
            EngineCoreOutputs(outputs=[EngineCoreOutput("a-12345678", [1, 2]), EngineCoreOutput("b-12345678", [3])]),
            EngineCoreOutputs(outputs=[EngineCoreOutput("a-12345678", [4], finish_reason=FinishReason.LENGTH)]),
            EngineCoreOutputs(utility_output=UtilityOutput(call_id=3, result=None)),
        ]
        for m in sent:
            push.send_multipart(enc.encode(m))
        push.send(b"ENGINE_CORE_DEAD")
        got = _take(pipe, 4)
        assert len(got) == 4
        for m, (frames, flags) in zip(sent, got):
            back = dec.decode(frames)
            assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in back.outputs] == \
                [(o.request_id, o.new_token_ids, o.finish_reason) for o in m.outputs]
            assert flags == bytes(len(m.outputs)) if m.outputs else flags == b""  # none routed: none delivered
        assert got[3] == ([b"ENGINE_CORE_DEAD"], b"")
        assert native().engine_outputs_sent(h) == 0
    finally:
        ctx.destroy(linger=0)
        native().engine_outputs_free(h)
        pipe.close()


class _Client:
    """vLLM's engine-core client as ``take`` meets it: its PULL socket bound on an
    ``ipc://`` path under ``tmp_path``, the reader task that ``_ensure_output_queue_task``
    starts (a reader of the queue as it is then), and ``_unlike`` answering with it."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **resources: Any) -> None:
        import asyncio
        import types

        import zmq.asyncio

        self.ctx = zmq.asyncio.Context()
        self.path = f"ipc://{tmp_path}/out"
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.bind(self.path)
        self.first: "asyncio.Queue[Any]" = asyncio.Queue()
        self.resources = types.SimpleNamespace(output_socket=self.sock, output_queue_task=None, **resources)
        self.core = types.SimpleNamespace(outputs_queue=self.first, resources=self.resources, ctx=self.ctx,
                                          decoder=MsgpackDecoder(EngineCoreOutputs), utility_results={},
                                          _ensure_output_queue_task=self._ensure)
        self._ensure()
        monkeypatch.setattr(vllm_outputs, "_unlike", lambda engine: ("", self.core, types.SimpleNamespace(go=None)))

    async def _read(self, queue: Any) -> None:
        while True:
            queue.put_nowait(await self.resources.output_socket.recv_multipart())

    def _ensure(self) -> None:
        import asyncio

        if self.resources.output_queue_task is None:
            self.resources.output_queue_task = asyncio.ensure_future(self._read(self.core.outputs_queue))

    async def vllm_reads_the_path_again(self) -> None:
        """Asserts that vLLM's reader is back on the path, reading into the queue its
        output handler reads now; then closes everything."""
        import asyncio

        assert not self.resources.output_socket.closed
        assert self.resources.output_queue_task is not None and not self.resources.output_queue_task.done()
        push = self.ctx.socket(zmq.PUSH)
        push.connect(self.path)
        await push.send_multipart([b"step"])
        assert await asyncio.wait_for(self.core.outputs_queue.get(), 10) == [b"step"]
        self.resources.output_queue_task.cancel()
        push.close(linger=0)
        self.resources.output_socket.close(linger=0)
        self.ctx.term()


def test_a_take_cancelled_midway_puts_vllms_reader_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``take`` cancelled while vLLM's reader task winds down (its one wait before
    the library listens) leaves vLLM reading its own socket again, into the queue
    its output handler reads now: a message the engine sends then arrives."""
    import asyncio

    async def main() -> None:
        client = _Client(tmp_path, monkeypatch)
        await asyncio.sleep(0)
        take = asyncio.ensure_future(vllm_outputs.EngineOutputs.take(object()))
        await asyncio.sleep(0)  # take waits for vLLM's reader task to end
        take.cancel()
        with pytest.raises(asyncio.CancelledError):
            await take
        assert client.core.outputs_queue is not client.first, "the handler reads the new queue (after the empty message)"
        assert client.first.get_nowait() is not None  # that empty message
        assert client.resources.output_socket is client.sock
        await client.vllm_reads_the_path_again()

    asyncio.run(main())


def test_zeromq_leaves_or_removes_a_closed_sockets_file_as_take_expects(tmp_path: Path) -> None:
    """``take`` binds on the path of vLLM's socket right after closing it where the
    installed ZeroMQ leaves the file of a closed socket (4.3 and later), and waits
    for the file to go where it removes it from its own thread: which one this
    ZeroMQ does."""
    ctx = zmq.Context()
    path = tmp_path / "out"
    sock = ctx.socket(zmq.PULL)
    sock.bind(f"ipc://{path}")
    sock.close(linger=0)
    if vllm_outputs._zmq_removes_closed_files(zmq):
        deadline = time.monotonic() + vllm_outputs._UNLINK_WAIT
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not path.exists()
    else:
        time.sleep(0.2)
        assert path.exists(), "this ZeroMQ removes a closed socket's file: take would bind too early"
        again = ctx.socket(zmq.PULL)
        again.bind(f"ipc://{path}")  # over the file left: as vLLM's socket on a take that fails
        again.close(linger=0)
    ctx.term()


def test_a_take_listens_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``take`` listens on the path of vLLM's socket as soon as it closed it (where
    ZeroMQ leaves the file: no wait for its removal), and is done once the engine
    core's PUSH socket connected again (ZeroMQ retries every 100 ms)."""
    import asyncio

    import vllm.v1.engine.core  # noqa: F401 - what take's first use imports (about 1 s), before the clock starts

    if vllm_outputs._zmq_removes_closed_files(zmq):
        pytest.skip("this ZeroMQ removes a closed socket's file: take waits for it")

    async def main() -> None:
        client = _Client(tmp_path, monkeypatch, engine_dead=False)
        push = client.ctx.socket(zmq.PUSH)  # the engine core's
        push.connect(client.path)
        t0 = time.monotonic()
        reader = await asyncio.wait_for(vllm_outputs.EngineOutputs.take(object()), 10)
        took = time.monotonic() - t0
        assert reader is not None
        assert took < 1.5, f"take took {took:.2f} s: it waited for ZeroMQ to remove the file"
        task = client.resources.output_queue_task
        task.cancel()  # vLLM's shutdown: the library stops reading
        await asyncio.gather(task, return_exceptions=True)
        assert isinstance(client.core.outputs_queue.get_nowait(), EngineDeadError)
        push.close(linger=0)
        client.ctx.term()

    asyncio.run(main())


def test_a_take_ends_at_once_when_the_engine_core_dies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """An engine core that dies while ``take`` waits for it to connect (vLLM's
    monitor marks the engine dead) ends the wait at once, not after its 10 s:
    ``take`` answers None with vLLM's own reader back on the path."""
    import asyncio

    async def main() -> None:
        client = _Client(tmp_path, monkeypatch, engine_dead=False)
        take = asyncio.ensure_future(vllm_outputs.EngineOutputs.take(object()))
        await asyncio.sleep(0.3)  # the library listens (ZeroMQ 4.3 leaves the file: no wait); no engine core connects
        assert not take.done()
        t0 = time.monotonic()
        client.resources.engine_dead = True  # vLLM's monitor thread, on the engine core's death
        assert await asyncio.wait_for(take, 5) is None
        assert time.monotonic() - t0 < 2
        assert "the engine core died before it connected" in caplog.text
        # The output handler learns of the death (vLLM's shutdown may have closed
        # the reader it found), and vLLM's reader reads the path again.
        assert isinstance(client.core.outputs_queue.get_nowait(), EngineDeadError)
        assert client.resources.output_socket is not client.sock
        await client.vllm_reads_the_path_again()

    asyncio.run(main())


# --------------------------------------------------------------------------- the engine core's inputs


def test_the_librarys_messages_are_ones_vllms_engine_core_reads(tmp_path: Path) -> None:
    """Through the library's input socket (a ROUTER), a DEALER made as vLLM's engine
    core makes its own (its routing id, vLLM's socket options) reads each message
    whole: the library's own abort is vLLM's ABORT with the ids its decoder reads
    (short, long and very long ids), and what vLLM's encoder wrote comes through."""
    from vllm.utils.network_utils import make_zmq_socket
    from vllm.v1.engine import EngineCoreRequestType

    h, pipe, _ = _listen(tmp_path)
    path = str(tmp_path / "in")
    identity = (0).to_bytes(2, "little")  # vLLM's engine core's (its rank)
    native().engine_inputs_listen(h, path.encode(), identity, EngineCoreRequestType.ABORT.value)
    ctx = zmq.Context()
    try:
        dealer = make_zmq_socket(ctx, "ipc://" + path, zmq.DEALER, identity=identity, bind=False)
        deadline = time.monotonic() + 10
        while native().engine_inputs_peers(h) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ids = ["a-12345678", "r" * 40 + "-12345678", "x" * 300]
        for i in ids:
            native().engine_inputs_abort(h, i.encode())
        enc = MsgpackEncoder()
        native().engine_inputs_send(h, [identity, EngineCoreRequestType.UTILITY.value, *enc.encode((0, 7, "m", ("x",)))])
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dec = MsgpackDecoder()
        for i in ids:
            type_frame, *data = dealer.recv_multipart()
            assert EngineCoreRequestType(type_frame) == EngineCoreRequestType.ABORT
            assert dec.decode(data) == [i]
        type_frame, *data = dealer.recv_multipart()
        assert EngineCoreRequestType(type_frame) == EngineCoreRequestType.UTILITY
        assert dec.decode(data) == [0, 7, "m", ["x"]]
        assert native().engine_inputs_aborts(h) == 3
        dealer.close(linger=0)
    finally:
        ctx.destroy(linger=0)
        native().engine_outputs_free(h)
        pipe.close()
    assert not Path(path).exists(), "the library's listener went with the reader"


class _ClientWithInputs(_Client):
    """``_Client`` with vLLM's input socket too: a ROUTER bound on an ``ipc://``
    path, the engine core's routing id, and the engine core's DEALER connected."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **resources: Any) -> None:
        import zmq.asyncio

        super().__init__(tmp_path, monkeypatch, **resources)
        self.in_path = f"ipc://{tmp_path}/in"
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(self.in_path)
        self.resources.input_socket = self.router
        self.core.input_socket = self.router
        self.core.core_engine = (0).to_bytes(2, "little")
        self.core.core_engines = [self.core.core_engine]
        self.sync = zmq.Context()
        self.dealer = self.sync.socket(zmq.DEALER)  # the engine core's
        self.dealer.setsockopt(zmq.IDENTITY, self.core.core_engine)
        self.dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        self.dealer.connect(self.in_path)
        self.push = self.ctx.socket(zmq.PUSH)  # the engine core's outputs
        self.push.connect(self.path)
        assert isinstance(self.router, zmq.asyncio.Socket)

    def close(self) -> None:
        self.dealer.close(linger=0)
        self.sync.term()
        self.push.close(linger=0)


def test_a_take_takes_the_input_socket_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``take`` puts the library in the place of vLLM's input socket: vLLM's client's
    sends (its ``_send_input_message``: the engine's id first) reach the engine
    core's DEALER, which connected to the library by itself."""
    import asyncio

    async def main() -> None:
        client = _ClientWithInputs(tmp_path, monkeypatch, engine_dead=False)
        reader = await asyncio.wait_for(vllm_outputs.EngineOutputs.take(object()), 15)
        assert reader is not None
        sock = client.core.input_socket
        assert isinstance(sock, vllm_outputs.InputSocket) and client.resources.input_socket is sock
        assert client.router.closed
        await sock.send_multipart((client.core.core_engine, b"\x00", memoryview(b"add")), copy=False)
        got = await asyncio.get_running_loop().run_in_executor(None, client.dealer.recv_multipart)
        assert got == [b"\x00", b"add"]
        sock.close(linger=0)  # vLLM's shutdown
        with pytest.raises(zmq.ZMQError):
            sock.send_multipart((client.core.core_engine, b"\x00", b"late"))
        task = client.resources.output_queue_task
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert reader.aborts() == 0
        client.close()
        client.ctx.term()

    asyncio.run(main())


def test_a_take_whose_engine_never_connects_to_the_inputs_puts_vllms_sockets_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Where the engine core dies before its DEALER connected to the library's input
    socket, ``take`` answers None with vLLM's own sockets back on both paths: a
    DEALER that connects to vLLM's ROUTER again is heard there."""
    import asyncio

    async def main() -> None:
        client = _ClientWithInputs(tmp_path, monkeypatch, engine_dead=False)
        client.dealer.close(linger=0)  # the engine core's input side never comes back
        take = asyncio.ensure_future(vllm_outputs.EngineOutputs.take(object()))
        deadline = time.monotonic() + 10
        while not client.router.closed:
            assert time.monotonic() < deadline, "take never reached the inputs"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        client.resources.engine_dead = True
        assert await asyncio.wait_for(take, 5) is None
        assert "the engine core died before it connected" in caplog.text
        assert isinstance(client.core.outputs_queue.get_nowait(), EngineDeadError)  # as vLLM's reader tells it
        again = client.core.input_socket
        assert again is client.resources.input_socket and not isinstance(again, vllm_outputs.InputSocket)
        assert again.getsockopt(zmq.TYPE) == zmq.ROUTER
        dealer = client.sync.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, client.core.core_engine)
        dealer.connect(client.in_path)
        dealer.send(b"ready")
        assert await asyncio.wait_for(again.recv_multipart(), 10) == [client.core.core_engine, b"ready"]
        dealer.close(linger=0)
        again.close(linger=0)
        client.dealer = client.sync.socket(zmq.DEALER)
        client.close()
        await client.vllm_reads_the_path_again()

    asyncio.run(main())
