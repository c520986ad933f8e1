"""The library's reader of an engine core's output stream (dc_engine_outputs_*,
go/engineout over go/zmtp), without vLLM: a PUSH peer written here by hand (ZMTP
3.1, NULL mechanism) sends it messages; every message reaches the host whole and in
order through its fd; bad peers and bad input end their own connection only, and
cost no memory they only claim. backends/vllm_outputs.py's layouts of vLLM's structs
are checked here against stand-ins; vLLM's own are in vllm_contract."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import resource
import select
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from dynamo_ctx._lib import native
from dynamo_ctx.backends import vllm_outputs
from dynamo_ctx.serving import pushes_items
from harness import HANG
from helpers import ServedEndpoint, collect, run

# vLLM 0.32's layouts (go/engineout/testdata/vllm-0.32.0.json).
MESSAGE, OUTPUT = "aoaaffffa", "itnnnnnxnnaxnannnn"


def greeting() -> bytes:
    return b"\xff" + bytes(8) + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)


def command(body: bytes) -> bytes:
    return bytes([0x04, len(body)]) + body


def ready(socket_type: bytes) -> bytes:
    return command(b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", len(socket_type)) + socket_type)


def frames(*parts: bytes) -> bytes:
    out = b""
    for i, p in enumerate(parts):
        more = 1 if i < len(parts) - 1 else 0
        out += bytes([more, len(p)]) + p if len(p) < 256 else bytes([more | 2]) + struct.pack(">Q", len(p)) + p
    return out


def mp_str(s: str) -> bytes:
    b = s.encode()
    return bytes([0xA0 | len(b)]) + b


def message(*outs: Tuple[str, List[int]], finish: int = -1) -> bytes:
    """An EngineCoreOutputs of plain outputs (the last with finish_reason ``finish``
    where it is 0 or more), in MessagePack, every field written as vLLM's encoder
    writes them."""
    body = b"\x99\x00" + bytes([0x90 | len(outs)])
    for i, (rid, ids) in enumerate(outs):
        reason = bytes([finish]) if finish >= 0 and i == len(outs) - 1 else b"\xc0"
        body += b"\xdc\x00\x12" + mp_str(rid) + bytes([0x90 | len(ids)]) + bytes(ids) + b"\xc0" * 3 + reason
        body += b"\xc0" * 7 + b"\x00" + b"\xc0" * 4
    return body + b"\xc0\xcb" + struct.pack(">d", 1.0) + b"\xc0" * 5


class Reader:
    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.h, fd = native().engine_outputs_listen(self.path.encode(), MESSAGE.encode(), OUTPUT.encode(), 9, 0.0)
        self.pipe = io.FileIO(fd, "rb")  # the pipe's read end, non-blocking
        self.buf = bytearray()

    def take(self, n: int, timeout: float = 10.0) -> List[Any]:
        got: List[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            if not select.select([self.pipe], [], [], 0.2)[0]:
                continue
            data = self.pipe.read(1 << 20)
            if data is None:
                continue
            assert data, "the library closed the pipe"
            self.buf += data
            got += vllm_outputs.parse(self.buf)
        return got

    def close(self) -> None:
        native().engine_outputs_free(self.h)
        assert select.select([self.pipe], [], [], 5.0)[0], "the library closed its end"
        assert self.pipe.read(10) == b"", "the library closed its end"
        self.pipe.close()

    def push(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.path)
        s.sendall(greeting() + ready(b"PUSH"))
        peer = b""
        while len(peer) < 64 + len(ready(b"PULL")):
            chunk = s.recv(4096)
            assert chunk, "the reader closed the connection"
            peer += chunk
        assert peer[:1] == b"\xff" and peer[9:10] == b"\x7f" and peer[64:] == ready(b"PULL")
        return s


@pytest.fixture
def reader(tmp_path: Path) -> Any:
    r = Reader(tmp_path / "out")
    yield r
    r.close()


def test_messages_reach_the_host_whole_and_in_order(reader: Reader) -> None:
    s = reader.push()
    big = os.urandom(100_000)
    sent = [[message(("a-12345678", [i]))] for i in range(50)] + [[message(), big], [b"ENGINE_CORE_DEAD"]]
    for m in sent:
        s.sendall(frames(*m))
    got = reader.take(len(sent))
    assert [f for f, _ in got] == sent
    assert [flags for _, flags in got] == [b"\0"] * 50 + [b"", b""]  # nothing routed: nothing delivered
    assert native().engine_outputs_sent(reader.h) == 0
    s.close()


def test_the_hosts_end_is_a_pipe_that_reads_never_wake_the_library(reader: Reader) -> None:
    """The host reads its messages from a pipe's read end, non-blocking: a socket
    pair would signal the library's end writable (an edge in its poller) at every
    read of the host's, waking a thread of the library's for nothing; a pipe wakes
    its writer only when a read made room in a full pipe."""
    fd = reader.pipe.fileno()
    assert stat.S_ISFIFO(os.fstat(fd).st_mode)
    assert not os.get_blocking(fd)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC


def test_a_route_needs_a_request_of_the_library(reader: Reader) -> None:
    native().engine_outputs_reserve(reader.h, b"a")
    with pytest.raises(ValueError, match="dc_engine_outputs_activate"):
        native().engine_outputs_activate(reader.h, b"a", 12345)
    native().engine_outputs_drop(reader.h, b"a")
    native().engine_outputs_drop(reader.h, b"never reserved")
    # Posted, the same: a request handle that is not one drops the route, a
    # reader's that is not one drops the message; nothing raises, also where
    # more wait than may be posted ahead and the post becomes the call.
    for _ in range(8):
        for kind in (4, 5, 6):
            native().engine_outputs_post(kind, reader.h, b"b", 12345)
            native().engine_outputs_post(kind, 12345, b"b", 0)
    s = reader.push()
    s.sendall(frames(message(("b-12345678", [1]))))
    assert [flags for _, flags in reader.take(1)] == [b"\0"]
    s.close()


@pytest.mark.parametrize("bad", [
    b"GET / HTTP/1.1\r\n\r\n" + bytes(64),
    greeting()[:10] + bytes([2, 0]) + greeting()[12:],  # ZMTP 2
    greeting() + ready(b"DEALER"),
    greeting() + ready(b"PUSH") + bytes([0x02]) + struct.pack(">Q", 1 << 40),  # a frame that claims a TiB
    greeting() + ready(b"PUSH") + bytes([0x80, 0]),
], ids=["http", "zmtp2", "dealer", "huge-claim", "bad-flags"])
def test_bad_peers_end_their_own_connection_only(reader: Reader, bad: bytes) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(reader.path)
    s.sendall(bad)
    s.settimeout(10)
    try:
        while s.recv(4096):
            pass  # the reader's greeting, then its close
    except ConnectionResetError:
        pass
    s.close()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: nothing claimed was allocated
    good = reader.push()
    good.sendall(frames(message(("b-12345678", [7]))))
    assert len(reader.take(1)) == 1, "the reader still serves"
    good.close()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    lib = native()
    with pytest.raises(ValueError, match="layout"):
        lib.engine_outputs_listen(str(tmp_path / "x").encode(), b"aaa", OUTPUT.encode(), 9, 0.0)
    with pytest.raises(ValueError, match="window"):
        lib.engine_outputs_listen(str(tmp_path / "y").encode(), MESSAGE.encode(), OUTPUT.encode(), 9, 5.0)
    with pytest.raises(ValueError):
        lib.engine_outputs_listen(str(tmp_path / "z").encode(), MESSAGE.encode(), OUTPUT.encode(), -1, 0.0)
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(OSError, match="address already in use"):
        lib.engine_outputs_listen(str(taken).encode(), MESSAGE.encode(), OUTPUT.encode(), 9, 0.0)
    with pytest.raises(ValueError, match="dc_engine_outputs_reserve"):
        lib.engine_outputs_reserve(12345, b"a")
    with pytest.raises(ValueError, match="kind"):
        lib.engine_outputs_post(7, 12345, b"a", 0)
    with pytest.raises(ValueError, match="dc_engine_outputs_free"):
        lib.engine_outputs_free(12345)


def test_layouts_of_vllms_structs() -> None:
    class Output:
        __struct_fields__ = ("request_id", "new_token_ids", "new_logprobs", "events", "prefill_stats", "trace_headers",
                             "num_nans_in_logits", "finish_reason")

    class Outputs:
        __struct_fields__ = ("engine_index", "outputs", "scheduler_stats", "utility_output", "weight_version")

    assert vllm_outputs.layouts(Output, Outputs) == ("aoafa", "itnxxaan")

    class Newer(Output):
        __struct_fields__ = Output.__struct_fields__ + ("something_new",)

    with pytest.raises(ValueError, match="something_new"):
        vllm_outputs.layouts(Newer, Outputs)


class RoutedHandler:
    """A served handler that routes its request to the library's reader (as
    backends/vllm.py does for vLLM's engine): the library sends the plain tokens
    the test's engine peer sends; the handler reads the reader's socket and
    sends the last output itself, by its item sink."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.routed = asyncio.Event()

    def route(self) -> Any:
        """Route the served request (engine id "eng", "eng-12345678" as the engine
        knows it) to the library's reader, as backends/vllm.py posts it: reserve,
        then activate; its item sink."""
        from dynamo_ctx.serving import item_sink

        sink = item_sink()
        assert sink is not None
        native().engine_outputs_post(4, self.reader.h, b"eng", 0)
        native().engine_outputs_post(5, self.reader.h, b"eng-12345678", sink.request)  # type: ignore[attr-defined]
        self.routed.set()
        return sink

    @pushes_items
    async def generate(self, request: Any, context: Any) -> Any:
        sink = self.route()
        lib, h = native(), self.reader.h
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        pipe = self.reader.pipe

        def readable() -> None:
            self.reader.buf += pipe.read(1 << 20) or b""
            for _frames, flags in vllm_outputs.parse(self.reader.buf):
                if flags == b"\0" and not done.done():  # the last output: the handler's
                    sink({"token_ids": [99], "finish_reason": "length"})
                    done.set_result(None)

        loop.add_reader(pipe.fileno(), readable)
        try:
            await done
        finally:
            loop.remove_reader(pipe.fileno())
            lib.engine_outputs_post(6, h, b"eng", 0)
        return
        yield  # an async generator, as a handler is


def test_the_library_sends_routed_tokens_before_the_handlers_last(reader: Reader, nats_url: str) -> None:
    """Tokens the library delivers reach the caller in the engine's order, and
    before the item the handler sends after them (the last output, which the
    library leaves to it); the library counts what it sent."""
    handler = RoutedHandler(reader)
    peer = reader.push()

    async def main() -> List[Any]:
        async with ServedEndpoint(nats_url, handler.generate) as ep:
            stream = await ep.client.generate({}, annotated=False)
            await asyncio.wait_for(handler.routed.wait(), HANG)
            for i in range(1, 60):
                peer.sendall(frames(message(("eng-12345678", [i]))))
            peer.sendall(frames(message(("eng-12345678", [100]), finish=1)))
            return await collect(stream)

    items = run(main())
    assert items == [{"token_ids": [i]} for i in range(1, 60)] + [{"token_ids": [99], "finish_reason": "length"}]
    assert native().engine_outputs_sent(reader.h) == 59
    peer.close()


class StoppedHandler(RoutedHandler):
    """A served handler whose request is routed to the library's reader until its
    caller stops it; then it asks the test's engine peer for one more step and
    reads how the library flagged that step's outputs."""

    def __init__(self, reader: Reader) -> None:
        super().__init__(reader)
        self.stopped = asyncio.Event()
        self.flags: List[bytes] = []

    @pushes_items
    async def generate(self, request: Any, context: Any) -> Any:
        self.route()
        lib, h = native(), self.reader.h
        try:
            await asyncio.wait_for(context.stopped(), HANG)
            self.stopped.set()
            got = await asyncio.get_running_loop().run_in_executor(None, self.reader.take, 1)
            self.flags = [flags for _, flags in got]
        finally:
            lib.engine_outputs_post(6, h, b"eng", 0)
        return
        yield  # an async generator, as a handler is


def test_a_stopped_requests_outputs_are_left_to_its_handler(reader: Reader, nats_url: str) -> None:
    """Once the caller stopped the request, the library sends none of its tokens
    and flags its outputs 0 (the handler's: it books them as its own way books a
    stopped request's), counting none as sent; the other requests' outputs of
    the same message are not held up."""
    handler = StoppedHandler(reader)
    peer = reader.push()

    async def main() -> List[Any]:
        async with ServedEndpoint(nats_url, handler.generate) as ep:
            ctx, stream = await ep.open()
            await asyncio.wait_for(handler.routed.wait(), HANG)
            peer.sendall(frames(message(("eng-12345678", [1]))))
            first = await asyncio.wait_for(stream.__anext__(), HANG)
            await asyncio.get_running_loop().run_in_executor(None, reader.take, 1)  # that step's message
            ctx.stop_generating()
            await asyncio.wait_for(handler.stopped.wait(), HANG)
            peer.sendall(frames(message(("eng-12345678", [2]), ("other-12345678", [3]))))
            rest = await collect(stream)
            return [first] + rest

    items = run(main())
    assert items == [{"token_ids": [1]}], "nothing after the stop"
    assert handler.flags == [b"\0\0"]
    assert native().engine_outputs_sent(reader.h) == 1
    peer.close()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root, to connect as another user")
def test_only_the_sockets_user_may_connect() -> None:
    """The socket's file is its user's only, and a process of another user that
    connects anyway (here: with the mode opened up, as a permissive umask would
    leave it for a moment) is closed at once, greeted with nothing."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp()
    os.chmod(folder, 0o755)  # others may reach the socket's file
    reader = Reader(Path(folder) / "out")
    try:
        assert os.stat(reader.path).st_mode & 0o777 == 0o600
        os.chmod(reader.path, 0o666)
        pid = os.fork()
        if pid == 0:  # the child: as nobody, connect and see what comes back
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(10)
                s.connect(reader.path)
                s.sendall(greeting() + ready(b"PUSH"))
                code = 0 if s.recv(4096) == b"" else 2
            except (ConnectionResetError, BrokenPipeError):
                code = 0
            except BaseException:
                code = 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "closed without a greeting"
        reader.push().close()  # the socket's own user still connects
    finally:
        reader.close()
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- the engine's inputs

ENGINE = b"\x00\x00"  # vLLM's engine core's routing id (its rank, 2 bytes)
ABORT = b"\x01"  # vLLM's EngineCoreRequestType.ABORT


def ready_with_identity(socket_type: bytes, identity: bytes) -> bytes:
    body = b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    body += bytes([8]) + b"Identity" + struct.pack(">I", len(identity)) + identity
    return command(body)


class Dealer:
    """The engine core's DEALER socket, by hand: it greets the library's input
    socket (a ROUTER) with its identity and reads the messages sent to it."""

    def __init__(self, path: str, identity: bytes = ENGINE) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)
        self.s.sendall(greeting() + ready_with_identity(b"DEALER", identity))
        self.buf = b""
        self._need(64)
        assert self.buf[:1] == b"\xff" and self.buf[9:10] == b"\x7f"
        self.buf = self.buf[64:]
        flags, body = self._frame()
        assert flags & 4 and b"ROUTER" in body, "the library greets as a ROUTER"

    def _need(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = self.s.recv(1 << 20)
            assert chunk, "the library closed the connection"
            self.buf += chunk

    def _frame(self) -> Tuple[int, bytes]:
        self._need(2)
        flags = self.buf[0]
        if flags & 2:
            self._need(9)
            (n,) = struct.unpack(">Q", self.buf[1:9])
            head = 9
        else:
            n, head = self.buf[1], 2
        self._need(head + n)
        body, self.buf = self.buf[head:head + n], self.buf[head + n:]
        return flags, body

    def recv(self) -> List[bytes]:
        msg = []
        while True:
            flags, body = self._frame()
            msg.append(body)
            if not flags & 1:
                return msg

    def close(self) -> None:
        self.s.close()


@pytest.fixture
def inputs(reader: Reader, tmp_path: Path) -> Any:
    """The reader, holding the engine's input socket too, and the engine's DEALER connected to it."""
    path = str(tmp_path / "in")
    native().engine_inputs_listen(reader.h, path.encode(), ENGINE, ABORT)
    assert os.stat(path).st_mode & 0o777 == 0o600
    dealer = Dealer(path)
    deadline = time.monotonic() + HANG
    while native().engine_inputs_peers(reader.h) == 0:
        assert time.monotonic() < deadline, "the engine's DEALER never counted"
        time.sleep(0.005)
    yield dealer
    dealer.close()


def abort_body(request_id: bytes) -> bytes:
    return b"\x91" + (bytes([0xA0 | len(request_id)]) if len(request_id) < 32 else bytes([0xD9, len(request_id)])) + request_id


def test_the_engines_inputs_go_through_the_library_in_order(reader: Reader, inputs: Dealer) -> None:
    """What the host sends (posted, or by the call where the post socket refuses a
    message this large) reaches the engine whole and in order with the library's
    own aborts; a message to another identity is dropped, as a ROUTER drops it."""
    lib = native()
    big = os.urandom(300_000)  # over what a posted message may hold: sent by the call
    lib.engine_inputs_send(reader.h, [ENGINE, b"\x00", b"first"])
    lib.engine_inputs_send(reader.h, [b"someone else", b"\x00", b"dropped"])
    lib.engine_inputs_send(reader.h, [ENGINE, b"\x00", big, b""])
    lib.engine_inputs_abort(reader.h, b"req-1-12345678")
    long_id = b"r" * 40
    lib.engine_inputs_send(reader.h, (ENGINE, b"\x03", b"last"))
    lib.engine_inputs_abort(reader.h, long_id)
    assert inputs.recv() == [b"\x00", b"first"]
    assert inputs.recv() == [b"\x00", big, b""]
    assert inputs.recv() == [ABORT, abort_body(b"req-1-12345678")]
    assert inputs.recv() == [b"\x03", b"last"]
    assert inputs.recv() == [ABORT, abort_body(long_id)]
    assert lib.engine_inputs_aborts(reader.h) == 2


def test_bad_input_arguments_are_refused(reader: Reader, tmp_path: Path) -> None:
    lib = native()
    lib.engine_inputs_send(reader.h, [ENGINE, b"\x00"])  # no inputs taken yet: posted, dropped (as for a reader freed)
    with pytest.raises(ValueError, match="dc_engine_inputs_abort"):
        lib.engine_inputs_abort(reader.h, b"x")  # the call says so
    with pytest.raises(ValueError, match="dc_engine_inputs_peers"):
        lib.engine_inputs_peers(reader.h)
    with pytest.raises(ValueError, match="identity"):
        lib.engine_inputs_listen(reader.h, str(tmp_path / "a").encode(), b"", ABORT)
    with pytest.raises(ValueError, match="dc_engine_inputs_listen"):
        lib.engine_inputs_listen(12345, str(tmp_path / "b").encode(), ENGINE, ABORT)
    lib.engine_inputs_listen(reader.h, str(tmp_path / "c").encode(), ENGINE, ABORT)
    with pytest.raises(ValueError, match="already"):
        lib.engine_inputs_listen(reader.h, str(tmp_path / "d").encode(), ENGINE, ABORT)
    with pytest.raises(ValueError, match="2 to 4096"):
        lib.engine_inputs_send(reader.h, [ENGINE])
    with pytest.raises(TypeError, match="bytes"):
        lib.engine_inputs_send(reader.h, [ENGINE, "not bytes"])  # type: ignore[list-item]
    assert not os.path.exists(tmp_path / "d")


class AbortedHandler(RoutedHandler):
    """A served handler whose request is routed (and so armed) until its caller
    kills it (the dispatcher then cancels it)."""

    def __init__(self, reader: Reader) -> None:
        super().__init__(reader)
        self.ended = asyncio.Event()

    @pushes_items
    async def generate(self, request: Any, context: Any) -> Any:
        self.route()
        try:
            await asyncio.wait_for(context.killed(), HANG)
        finally:  # the kill's wake-up: this, or the dispatcher's cancellation
            self.woke()
            native().engine_outputs_post(6, self.reader.h, b"eng", 0)
            self.ended.set()
        return
        yield  # an async generator, as a handler is

    def woke(self) -> None:
        """Called as the handler learns of the kill."""


def test_a_killed_routed_request_is_aborted_in_the_engine_by_the_library(reader: Reader, inputs: Dealer,
                                                                         nats_url: str) -> None:
    """The caller's kill (here in process) reaches the engine as an abort of the
    request's engine id, sent by the library as the kill stops the context, once;
    a request whose route was dropped is not aborted on a later stop."""
    handler = AbortedHandler(reader)

    async def main() -> List[bytes]:
        async with ServedEndpoint(nats_url, handler.generate) as ep:
            ctx, stream = await ep.open()
            await asyncio.wait_for(handler.routed.wait(), HANG)
            # The activation is posted: a send after it (a call, which runs what
            # was posted first) is in place once it returns.
            native().engine_inputs_send(reader.h, [ENGINE, b"\x00", b"mark"])
            assert await asyncio.get_running_loop().run_in_executor(None, inputs.recv) == [b"\x00", b"mark"]
            ctx.kill()
            got = await asyncio.get_running_loop().run_in_executor(None, inputs.recv)
            await asyncio.wait_for(handler.ended.wait(), HANG)
            assert await collect(stream) == []  # killed: it ends with nothing sent
            # The route dropped: a mark sent now is the next the engine reads.
            native().engine_inputs_send(reader.h, [ENGINE, b"\x00", b"after"])
            assert await asyncio.get_running_loop().run_in_executor(None, inputs.recv) == [b"\x00", b"after"]
            return got

    assert run(main()) == [ABORT, abort_body(b"eng-12345678")]
    assert native().engine_inputs_aborts(reader.h) == 1


class HandedOffHandler(AbortedHandler):
    """AbortedHandler that notes when, and with what at the engine, it learned of the kill."""

    def __init__(self, reader: Reader, engine: Dealer) -> None:
        super().__init__(reader)
        self.engine = engine
        self.learned = 0.0
        self.abort_at_engine = False

    def woke(self) -> None:
        self.learned = time.monotonic()
        self.abort_at_engine = bool(select.select([self.engine.s], [], [], 0)[0])


def test_a_killed_routed_requests_handler_learns_of_it_after_the_engine(reader: Reader, inputs: Dealer,
                                                                        nats_url: str) -> None:
    """A caller's kill, through the worker's reader of its Kill frame (the caller
    is another runtime), aborts the routed request in the engine at once, and
    reaches its handler a hand-off (5 ms) later (docs/design.md, "Aborts from the
    library"): the handler's work on the kill does not take the CPU the engine
    needs to read the abort."""
    from dynamo_ctx import Context, DistributedRuntime

    handler = HandedOffHandler(reader, inputs)

    async def main() -> float:
        async with ServedEndpoint(nats_url, handler.generate) as ep:
            caller = DistributedRuntime(nats_url=nats_url)
            try:
                client = await caller.endpoint(ep.path).client()
                await client.wait_for_instances()
                ctx = Context()
                stream = await client.generate({}, annotated=False, context=ctx)
                await asyncio.wait_for(handler.routed.wait(), HANG)
                native().engine_inputs_send(reader.h, [ENGINE, b"\x00", b"mark"])
                assert await asyncio.get_running_loop().run_in_executor(None, inputs.recv) == [b"\x00", b"mark"]
                killed = time.monotonic()
                ctx.kill()
                await asyncio.wait_for(handler.ended.wait(), HANG)
                assert await collect(stream) == []
                assert await asyncio.get_running_loop().run_in_executor(None, inputs.recv) == [ABORT, abort_body(b"eng-12345678")]
                return handler.learned - killed
            finally:
                caller.shutdown()

    after = run(main())
    assert handler.abort_at_engine  # sent before the handler learned of the kill
    assert after >= 0.005  # the hand-off: the Kill frame's reader aborted, the handler waited
