"""The engine core's outputs read by the library, in the worker's place.

vLLM's ``AsyncLLM`` reads its engine core's outputs with pyzmq: at every step its
I/O thread wakes, then the event loop's, and the worker's Python takes each
request's new tokens apart and hands them to the library again. For the plain
tokens of a decode, which is most of a stream, none of that is needed: the library
can read the engine's stream itself (a ZeroMQ PULL socket: go/zmtp) and send each
routed request's tokens to its caller at once (go/engineout), the way it sends any
item. The worker still gets every message, later and in batches, and keeps vLLM's
bookkeeping of each as before (statistics, finishes, everything not plain).

``EngineOutputs.take(engine)`` takes over the output socket of ``engine`` (vLLM's
``AsyncLLM`` with one engine core on this machine), before any request:

- it closes vLLM's PULL socket and listens on its path in the library; the engine
  core's PUSH socket connects again by itself (ZeroMQ reconnects);
- the library's messages reach the loop through a pipe; each is what
  vLLM's own reader (``AsyncMPClient``'s ``process_outputs_socket``) would have
  received, and is handled as it handles it (an engine's death, utility results,
  the queue its output handler reads), with the outputs the library delivered
  marked (their ``new_token_ids`` a ``Delivered`` list, or ``DeliveredExtra``
  where the output has events or prefill statistics);
- ``vllm_lean.LeanOutputs`` keeps those outputs' bookkeeping without handing their
  tokens over again.

A request is routed (``reserve`` before the engine has it, ``activate`` once it is
one the short way serves: ``LeanOutputs.route``) to the library's request it is
served for. Neither is a call into the library where posting works: both are
posted (posted.go), as the worker's items are, and run before the library reads the
engine's next message, so the worker's loop makes no call into the library per step
or request.

``take`` takes the engine core's input socket too (vLLM's ROUTER, where its engine
core's DEALER connects), in the same way: what vLLM's client sends the engine goes
through the library (``InputSocket``, posted), and once a request's route is armed
the library aborts the request in the engine itself the moment its context stops,
from the thread that learns of it (the Kill frame's reader): the worker's event
loop and ZeroMQ's I/O thread are off a cancellation's way to the engine. The
handler still aborts the request through vLLM when it learns of the stop (its
output processor's bookkeeping); the engine takes a second abort of a request as
it takes the first (vLLM's scheduler drops a request once). The loop learns of a
kill of such a request 5 ms after the library's abort (dc_context_watch), so that
its work on the kill leaves the CPUs to the engine core reading the abort.

Where anything differs from what this was written against, nothing is taken and
every output goes vLLM's way (logged at INFO with the reason); where only vLLM's
input socket or its use of it differs, the outputs are taken and the inputs left to
vLLM. Where the taking fails on the way (the engine core does not connect to either
socket), vLLM's own sockets are put back on both paths.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import logging
import os
import struct
import time
from typing import Any, List, Optional, Tuple

from .vllm_lean import _UNSET, Delivered, DeliveredExtra, LeanOutputs

logger = logging.getLogger("dynamo_ctx.backends.vllm")

#: The most a message whose outputs the library delivered waits before the worker
#: gets it (with those after it): the worker's loop wakes once for several engine
#: steps. vLLM's statistics lag by as much (its gauges, its token counters); a
#: message the worker must act on (a request's first or last output, anything not
#: plain) goes at once.
WINDOW = 0.025

#: How long ``take`` waits for ZeroMQ to remove its socket file after closing it
#: (where it does: ``_zmq_removes_closed_files``), and for the engine core to
#: connect to the library's.
_UNLINK_WAIT = 2.0
_CONNECT_WAIT = 10.0


def _zmq_removes_closed_files(zmq: Any) -> bool:
    """Whether this ZeroMQ may remove a bound ``ipc://`` path's file when its socket
    closes. Old ones did, from their own thread, after ``close`` returned: a bind on
    the path before that had its new file removed. Since 4.2.3 ZeroMQ leaves the file
    (a bind removes a stale one first); this answers yes below 4.3, the side that
    only waits for nothing. The contract tests check it of the ZeroMQ installed."""
    return tuple(zmq.zmq_version_info()) < (4, 3)


def _engine_dead(resources: Any) -> bool:
    """Whether vLLM has marked its engine core dead (its engine-core client's
    ``resources.engine_dead``, set by its monitor or by this module's reader)."""
    return bool(getattr(resources, "engine_dead", False))


#: EngineCoreOutput's fields (vllm_lean's) that may be set on an output whose
#: tokens the library delivers and whose bookkeeping vLLM's own way then does
#: (a request's first output carries its prefill statistics, and its events when
#: vLLM logs statistics).
_EXTRA = ("events", "prefill_stats")
#: Fields read by the worker only, whatever they hold.
_ANY = ("trace_headers", "num_nans_in_logits")
#: EngineCoreOutputs's fields that the worker must see at once when set.
_AT_ONCE = ("utility_output", "finished_requests", "wave_complete", "start_wave")
#: And those it reads when it reads the message.
_MESSAGE_ANY = ("engine_index", "scheduler_stats", "timestamp", "weight_version")


def layouts(output_type: type, outputs_type: type) -> Tuple[str, str]:
    """go/engineout's layouts of vLLM's ``EngineCoreOutputs`` and ``EngineCoreOutput``;
    ValueError for a field this module does not know."""
    message = _layout(outputs_type, "EngineCoreOutputs", ((("outputs",), "o"), (_AT_ONCE, "f"), (_MESSAGE_ANY, "a")))
    output = _layout(output_type, "EngineCoreOutput", ((("request_id",), "i"), (("new_token_ids",), "t"), (_EXTRA, "x"),
                                                       (_ANY, "a"), (_UNSET, "n")))
    return message, output


def _layout(struct: type, name: str, letters: Tuple[Tuple[Tuple[str, ...], str], ...]) -> str:
    """A letter per field of ``struct`` (vLLM's ``name``): that of the first group
    of ``letters`` that names it; ValueError for a field none names."""
    layout = ""
    for field in getattr(struct, "__struct_fields__", ()):
        letter = next((letter for fields, letter in letters if field in fields), None)
        if letter is None:
            raise ValueError(f"{name} has a field {field!r} the library's reader does not know")
        layout += letter
    return layout


class EngineOutputs:
    """The library's reader of one engine core's outputs (see the module's docstring)."""

    def __init__(self, lib: Any, handle: int, fd: int, core: Any, lean: LeanOutputs, suffix: int) -> None:
        self._lib = lib
        self._handle = handle
        # The read end of the pipe the library writes every message to (non-blocking).
        self._pipe = io.FileIO(fd, "rb")
        self._buf = bytearray()
        self._chunk = bytearray(_RECV)  # read into, again and again (a fresh large buffer per read costs an mmap)
        self._view = memoryview(self._chunk)
        self._lean = lean
        self._suffix = suffix
        self._input: Optional[InputSocket] = None  # where the library sends the engine its inputs
        self._aborts = 0
        self._closed = False
        self._sent = 0
        self._queue: "asyncio.Queue[Any]" = core.outputs_queue
        self._decode = core.decoder.decode
        self._resources = core.resources
        self._utility_results = core.utility_results
        from vllm.v1.engine import EEP_NOTIFICATION_CALL_ID, FT_STATUS_CALL_ID  # type: ignore[import-not-found]
        from vllm.v1.engine.core import EngineCoreProc  # type: ignore[import-not-found]
        from vllm.v1.engine.core_client import _process_utility_output  # type: ignore[import-not-found]
        from vllm.v1.engine.exceptions import EngineDeadError  # type: ignore[import-not-found]

        self._dead_message = EngineCoreProc.ENGINE_CORE_DEAD
        self._dead_error = EngineDeadError
        self._process_utility = _process_utility_output
        self._unhandled_calls = (EEP_NOTIFICATION_CALL_ID, FT_STATUS_CALL_ID)

    @classmethod
    async def take(cls, engine: Any, window: float = WINDOW) -> Optional["EngineOutputs"]:
        """Take ``engine``'s output stream, and its input socket where vLLM's client is
        the one this was written against (see the module's docstring); None, with
        nothing changed, where this vLLM is not the one it was written against,
        and None, with vLLM's own reader back on the same path, where the library
        could not listen there or the engine core did not connect to it (also
        when cancelled: then CancelledError, vLLM's reader back), and then with
        vLLM's input socket back too. An error in putting vLLM's reader back is
        raised: the engine would have none."""
        try:
            why, core, lean = _unlike(engine)
        except Exception as e:  # noqa: BLE001 - whatever the check meets: vLLM's way
            why, core, lean = repr(e), None, None
        if why:
            logger.info("vLLM reads its engine core's outputs itself: %s", why)
            return None
        assert core is not None and lean is not None
        try:
            # Everything that may fail before anything changes.
            from vllm.utils.network_utils import make_zmq_socket  # type: ignore[import-not-found]
            from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs  # type: ignore[import-not-found]
            import zmq  # type: ignore[import-not-found]

            from .. import _lib

            message, output = layouts(EngineCoreOutput, EngineCoreOutputs)
            lib, suffix = _lib.native(), _suffix()
            resources = core.resources
            sock = resources.output_socket
            path = sock.getsockopt(zmq.LAST_ENDPOINT).decode()[len("ipc://"):]
            empty = EngineCoreOutputs()
            removes = _zmq_removes_closed_files(zmq)
            try:
                in_why, inputs = _inputs_unlike(core), None
                if not in_why:
                    inputs = _Inputs.of(core)
            except Exception as e:  # noqa: BLE001 - as any difference: vLLM's input socket stays
                in_why, inputs = repr(e), None
            from vllm.v1.engine.exceptions import EngineDeadError  # type: ignore[import-not-found]
        except Exception as e:  # noqa: BLE001 - as any difference: vLLM's way
            logger.info("vLLM reads its engine core's outputs itself: %r", e)
            return None
        if _engine_dead(resources):
            logger.info("vLLM reads its engine core's outputs itself: its engine core is dead")
            return None
        # The output handler reads a new queue: vLLM's reader, cancelled, puts its
        # EngineDeadError into the old one, after an empty message that moves the
        # handler (waiting on the old one now) to the new.
        old = core.outputs_queue
        core.outputs_queue = asyncio.Queue()
        old.put_nowait(empty)
        task = resources.output_queue_task
        handle: Optional[int] = None
        self: Optional[EngineOutputs] = None
        loop = asyncio.get_running_loop()
        in_closed = False  # vLLM's input socket is closed (the library's or none listens there)
        try:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            sock.close(linger=0)
            await _unlinked(path, removes)
            handle, fd = lib.engine_outputs_listen(path.encode(), message.encode(), output.encode(), suffix, window)
            self = cls(lib, handle, fd, core, lean, suffix)
            # The engine core's PUSH socket connects again by itself (ZeroMQ
            # retries every 100 ms): until it did, nothing is served. An engine
            # core that died meanwhile (vLLM's monitor says so) never will.
            await _connected(lambda: lib.engine_outputs_peers(handle), resources, path)
            if inputs is not None:
                in_sock = inputs.socket
                in_sock.close(linger=0)
                in_closed = True
                await _unlinked(inputs.path, removes)
                lib.engine_inputs_listen(handle, inputs.path.encode(), inputs.identity, inputs.abort_type)
                # As the outputs': the engine core's DEALER connects again by itself.
                await _connected(lambda: lib.engine_inputs_peers(handle), resources, inputs.path)
                self._input = InputSocket(lib, handle, loop.create_future())
                core.input_socket = resources.input_socket = self._input
        except BaseException as e:
            # vLLM's own reader again, on the same path (its socket where it is
            # still open: cancelled before it closed), reading the new queue,
            # to which the output handler moved: the engine connects to it.
            if self is not None:
                self._free()
            elif handle is not None:
                lib.engine_outputs_free(handle)
            try:
                if in_closed:
                    # vLLM's own input socket again, made as vLLM makes it (no
                    # handover: take refuses elastic expert parallelism); its
                    # engine core connects to it again. The library's listener,
                    # freed with the reader, removed its file.
                    assert inputs is not None
                    if removes:
                        _unlinked_blocking(inputs.path)  # as below for the outputs' file
                    core.input_socket = resources.input_socket = make_zmq_socket(
                        core.ctx, "ipc://" + inputs.path, zmq.ROUTER, bind=True)
            finally:
                # The outputs' way back, whatever befell the inputs'.
                if sock.closed:
                    if handle is None and removes:
                        # Cancelled while ZeroMQ removes its socket's file (from its
                        # own thread): a bind before that would have the new file
                        # removed. Rare (a cancelled start), short, so waited here.
                        _unlinked_blocking(path)
                    resources.output_socket = make_zmq_socket(core.ctx, "ipc://" + path, zmq.PULL)
                resources.output_queue_task = None
                core._ensure_output_queue_task()
                if _engine_dead(resources):
                    # Dead meanwhile: vLLM's shutdown may have closed the reader it
                    # found (the one this replaced), so its output handler learns it
                    # here, as vLLM's reader would have told it.
                    core.outputs_queue.put_nowait(EngineDeadError())
            if not isinstance(e, Exception):
                raise
            logger.warning("vLLM reads its engine core's outputs itself: the library could not: %r", e)
            return None
        loop.add_reader(self._pipe.fileno(), self._read)
        # vLLM's shutdown cancels this task (its finalizer, also when the engine
        # core dies): then, as its own reader, the handler gets EngineDeadError.
        resources.output_queue_task = loop.create_task(self._hold(), name="EngineCoreOutputQueueTask")
        lean.go = self
        logger.info("The library reads the engine core's outputs (at %s) and sends plain tokens itself", path)
        if inputs is not None:
            logger.info("The library sends the engine core its inputs (at %s) and aborts a stopped request itself",
                        inputs.path)
        else:
            logger.info("vLLM sends its engine core's inputs itself: %s", in_why)
        return self

    async def _hold(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self._queue.put_nowait(self._dead_error())
        finally:
            self.close()

    def close(self) -> None:
        """Stop reading (the engine's shutdown does)."""
        if self._closed:
            return
        self._lean.go = None
        try:
            asyncio.get_running_loop().remove_reader(self._pipe.fileno())
        except RuntimeError:
            pass  # no loop: nothing watches the socket
        self._free()

    def _free(self) -> None:
        if self._closed:
            return
        self._sent = self.sent()
        self._aborts = self.aborts()
        self._closed = True
        if self._input is not None:
            self._input.closed = True  # the library's listener goes with the reader
        self._lib.engine_outputs_free(self._handle)
        self._pipe.close()

    def sent(self) -> int:
        """The tokens the library sent itself so far (a counter: its last value once closed)."""
        return self._sent if self._closed else int(self._lib.engine_outputs_sent(self._handle))

    # A request's route, posted (no call into the library: posted.go).

    def reserve(self, engine_id: str) -> None:
        """Watch ``engine_id`` (the id given to ``add_request``) before the engine has it."""
        self._lib.engine_outputs_post(_RESERVE, self._handle, engine_id.encode(), 0)

    def activate(self, engine_id: str, vllm_id: str, request: int) -> bool:
        """Have the library send ``engine_id``'s plain tokens to ``request`` (the
        library's served request) from now on, unless one of its outputs went by
        already (then they all stay the worker's: the outputs' flags say which
        way each went). False, and the route dropped, where vLLM's id for the
        request (``vllm_id``) is not ``engine_id`` and the suffix the library
        strips."""
        if self._closed:
            return False
        if len(vllm_id) != len(engine_id) + self._suffix or not vllm_id.startswith(engine_id):
            self.drop(engine_id)
            return False
        # vLLM's id: the library routes by it less the suffix, and aborts it.
        self._lib.engine_outputs_post(_ACTIVATE, self._handle, vllm_id.encode(), request)
        return True

    def aborts(self) -> int:
        """The aborts the library sent the engine itself (0 where vLLM sends its
        inputs; a counter: its last value once closed)."""
        if self._closed:
            return self._aborts
        return 0 if self._input is None else int(self._lib.engine_inputs_aborts(self._handle))

    def drop(self, engine_id: str) -> None:
        """Forget ``engine_id``'s route."""
        if not self._closed:
            self._lib.engine_outputs_post(_DROP, self._handle, engine_id.encode(), 0)

    def _read(self) -> None:
        """The loop's reader: vLLM's ``process_outputs_socket``, for what the library forwards."""
        queue = self._queue
        try:
            while not self._closed:
                try:
                    n = self._pipe.readinto(self._chunk)
                except InterruptedError:
                    return
                if n is None:  # nothing more now
                    return
                if not n:
                    raise RuntimeError("the library's engine-output reader stopped")
                self._buf += self._view[:n]
                for frames, flags in parse(self._buf):
                    self._handle_message(frames, flags, queue)
        except Exception as e:  # noqa: BLE001 - as vLLM's reader: the output handler raises it
            queue.put_nowait(e)
            self.close()

    def _handle_message(self, frames: List[bytes], flags: bytes, queue: "asyncio.Queue[Any]") -> None:
        if len(frames) == 1 and frames[0] == self._dead_message:
            self._resources.engine_dead = True
            raise self._dead_error()
        outputs = self._decode(frames)
        if outputs.utility_output:
            if outputs.utility_output.call_id in self._unhandled_calls:
                logger.warning("vLLM's engine core sent a notification the library's reader does not handle: %r",
                               outputs.utility_output)
            else:
                self._process_utility(outputs.utility_output, self._utility_results)
            return
        if flags:
            for out, flag in zip(outputs.outputs, flags):
                if flag:
                    out.new_token_ids = (Delivered if flag == 1 else DeliveredExtra)(out.new_token_ids)
        if outputs.outputs or outputs.scheduler_stats:
            queue.put_nowait(outputs)


async def _unlinked(path: str, removes: bool) -> None:
    """Remove a closed ZeroMQ socket's file at ``path``, after ZeroMQ did where it
    does so itself (``removes``: then from its own thread, and listening on the
    path before that would have the new file removed)."""
    if removes:
        deadline = time.monotonic() + _UNLINK_WAIT
        while os.path.exists(path) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    if os.path.exists(path):
        os.unlink(path)


def _unlinked_blocking(path: str) -> None:
    """``_unlinked`` where ZeroMQ removes the file, waited for without the loop:
    for the clean-up after a cancellation, which may not await."""
    deadline = time.monotonic() + _UNLINK_WAIT
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    if os.path.exists(path):
        os.unlink(path)


async def _connected(peers: Any, resources: Any, path: str) -> None:
    """Wait until the engine core connected to the library's socket at ``path``
    (``peers()`` above 0): ZeroMQ reconnects every 100 ms. An engine core that
    died meanwhile (vLLM's monitor says so) never will."""
    deadline = time.monotonic() + _CONNECT_WAIT
    while peers() == 0:
        if _engine_dead(resources):
            raise RuntimeError(f"the engine core died before it connected to {path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine core did not connect to {path} in {_CONNECT_WAIT:g} s")
        await asyncio.sleep(0.01)


#: What vLLM's engine-core client does with its input socket, that the library's
#: stand-in (``InputSocket``) takes the place of: every message goes through one
#: call, a ROUTER socket's send, the engine's routing id first; an abort is the
#: ABORT type and the ids (the library makes it itself: dc_engine_inputs_listen).
_SENDER_STEPS = ("return self.input_socket.send_multipart((engine,) + message, copy=False)",)
_ABORT_STEPS = ("await self._send_input(EngineCoreRequestType.ABORT, request_ids)",)


class _Inputs:
    """vLLM's input socket as ``take`` finds it: the socket, its path, the engine
    core's routing id and the type frame of an abort."""

    def __init__(self, socket: Any, path: str, identity: bytes, abort_type: bytes) -> None:
        self.socket, self.path, self.identity, self.abort_type = socket, path, identity, abort_type

    @classmethod
    def of(cls, core: Any) -> "_Inputs":
        import zmq  # type: ignore[import-not-found]
        from vllm.v1.engine import EngineCoreRequestType  # type: ignore[import-not-found]

        sock = core.input_socket
        path = sock.getsockopt(zmq.LAST_ENDPOINT).decode()[len("ipc://"):]
        return cls(sock, path, bytes(core.core_engine), bytes(EngineCoreRequestType.ABORT.value))


def _inputs_unlike(core: Any) -> str:
    """How ``core``'s input socket differs from what the library's stand-in was
    written against ("" where it does not)."""
    import zmq  # type: ignore[import-not-found]
    import zmq.asyncio  # type: ignore[import-not-found]
    from vllm.v1.engine.core_client import AsyncMPClient  # type: ignore[import-not-found]

    found = getattr(core, "input_socket", None)
    if not isinstance(found, zmq.asyncio.Socket) or found is not getattr(core.resources, "input_socket", None):
        return "its input socket differs"
    sock: Any = found
    if sock.getsockopt(zmq.TYPE) != zmq.ROUTER:
        return "its input socket is not a ROUTER"
    if not sock.getsockopt(zmq.LAST_ENDPOINT).decode().startswith("ipc://"):
        return "its input socket is not a local (ipc://) one"
    engines = list(getattr(core, "core_engines", ()))
    if len(engines) != 1 or engines[0] != getattr(core, "core_engine", None) or not isinstance(engines[0], bytes):
        return "it has more than one engine core"
    for method, steps in ((AsyncMPClient._send_input_message, _SENDER_STEPS),
                          (AsyncMPClient.abort_requests_async, _ABORT_STEPS)):
        source = inspect.getsource(method)
        missing = [step for step in steps if step not in source]
        if missing:
            return f"its {method.__name__} no longer does {missing}"
    return ""


class InputSocket:
    """The library's stand-in for vLLM's input socket: what vLLM's engine-core
    client sends goes through the library (posted: no call into it), in order
    with the aborts the library sends itself. A send never waits (the
    library queues what the engine's socket does not take yet), so each
    returns the same finished future."""

    def __init__(self, lib: Any, handle: int, done: "asyncio.Future[None]") -> None:
        self._lib = lib
        self._handle = handle
        done.set_result(None)
        self._done = done
        self.closed = False

    def send_multipart(self, msg: Any, copy: bool = True, track: bool = False, **kwargs: Any) -> "asyncio.Future[None]":
        """pyzmq's ``send_multipart``: the first frame names the engine core."""
        if self.closed:
            import zmq  # type: ignore[import-not-found]

            raise zmq.ZMQError(zmq.ENOTSOCK)
        self._lib.engine_inputs_send(self._handle, [f if type(f) is bytes else bytes(f) for f in msg])
        return self._done

    def close(self, linger: Optional[int] = None) -> None:
        """As vLLM's shutdown closes its sockets: nothing more is sent (the
        library's listener goes with the reader)."""
        self.closed = True


#: engine_outputs_post's kinds (posted.go).
_RESERVE, _ACTIVATE, _DROP = 4, 5, 6
#: The most read from the library's socket at once.
_RECV = 1 << 18


def parse(buf: bytearray) -> List[Tuple[List[bytes], bytes]]:
    """The whole messages at the start of ``buf`` (the library's form:
    dc_engine_outputs_listen), taken out of it: (frames, flags) each."""
    out = []
    at = 0
    end = len(buf)
    while end - at >= 4:
        (size,) = _U32.unpack_from(buf, at)
        if end - at - 4 < size:
            break
        pos, stop = at + 4, at + 4 + size
        (count,) = _U32.unpack_from(buf, pos)
        pos += 4
        frames = []
        for _ in range(count):
            (n,) = _U32.unpack_from(buf, pos)
            frames.append(bytes(buf[pos + 4:pos + 4 + n]))
            pos += 4 + n
        (nflags,) = _U32.unpack_from(buf, pos)
        flags = bytes(buf[pos + 4:pos + 4 + nflags])
        if pos + 4 + nflags != stop:
            raise RuntimeError("the library's engine-output reader sent a malformed message")
        out.append((frames, flags))
        at = stop
    del buf[:at]
    return out


_U32 = struct.Struct("<I")


def _suffix() -> int:
    """How many characters vLLM adds to a request's id (``InputProcessor.assign_request_id``)."""
    import vllm.envs as envs  # type: ignore[import-not-found]

    return 0 if envs.VLLM_DISABLE_REQUEST_ID_RANDOMIZATION else 9


#: The steps of vLLM's ``process_outputs_socket`` that ``_read`` repeats.
_READER_STEPS = (
    "frames = await output_socket.recv_multipart(copy=False)",
    "resources.validate_alive(frames)",
    "outputs: EngineCoreOutputs = decoder.decode(frames)",
    "_process_utility_output(",
    "if outputs.outputs or outputs.scheduler_stats:",
    "outputs_queue.put_nowait(outputs)",
    "outputs_queue.put_nowait(EngineDeadError())",
)


def _unlike(engine: Any) -> Tuple[str, Any, Optional[LeanOutputs]]:
    """How ``engine`` differs from what ``take`` was written against ("" where it
    does not), its engine-core client and its short way."""
    from vllm.v1.engine.async_llm import AsyncLLM  # type: ignore[import-not-found]
    from vllm.v1.engine.core_client import AsyncMPClient  # type: ignore[import-not-found]
    from vllm.v1.engine.input_processor import InputProcessor  # type: ignore[import-not-found]
    import zmq  # type: ignore[import-not-found]
    import zmq.asyncio  # type: ignore[import-not-found]

    if not isinstance(engine, AsyncLLM):
        return "not vLLM's AsyncLLM", None, None
    lean = LeanOutputs.of(engine)
    if lean is None:
        return "its output processor is not the one the short way knows", None, None
    core = engine.engine_core
    if type(core) is not AsyncMPClient:
        return f"its engine-core client is a {type(core).__name__} (one engine core in processes of its own is)", None, None
    parallel = engine.vllm_config.parallel_config
    if getattr(parallel, "enable_elastic_ep", False) or getattr(parallel, "enable_fault_tolerance", False):
        return "elastic expert parallelism or fault tolerance is on", None, None
    resources = getattr(core, "resources", None)
    sock = getattr(resources, "output_socket", None)
    if not isinstance(sock, zmq.asyncio.Socket) or not isinstance(getattr(core, "outputs_queue", None), asyncio.Queue):
        return "its output socket or queue differs", None, None
    if not sock.getsockopt(zmq.LAST_ENDPOINT).decode().startswith("ipc://"):
        return "its output socket is not a local (ipc://) one", None, None
    source = inspect.getsource(AsyncMPClient._ensure_output_queue_task)
    missing = [step for step in _READER_STEPS if step not in source]
    if missing:
        return f"its output reader no longer does {missing}", None, None
    if "{random_uuid():.8}" not in inspect.getsource(InputProcessor.assign_request_id):
        return "it names requests otherwise", None, None
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs  # type: ignore[import-not-found]

    layouts(EngineCoreOutput, EngineCoreOutputs)  # ValueError for a field not known
    if engine.output_handler is None:
        return "its output handler is not running", None, None
    return "", core, lean
