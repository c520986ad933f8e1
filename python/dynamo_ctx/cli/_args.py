"""The commands' arguments (worker, frontend, demo): argparse with one-line
errors (_errors.py), flags whose default is an environment variable read
here with the flag's own type (``add_flag``), the flags every command
shares, and the value types, which state each range once: a value the
library takes is checked by the library (``timeout_seconds``), and a
setting the library parses is handed on as text (``add_library_flag``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple, TypeVar

from .._lib import native
from ._errors import fail, native_reason

_N = TypeVar("_N", int, float)

#: Environment variables read by every command (Dynamo's names).
ENV_LOG = "DYN_LOG"
ENV_LOGGING_JSONL = "DYN_LOGGING_JSONL"

#: The event loops a command can run on (--event-loop; env ENV_EVENT_LOOP).
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
ENV_EVENT_LOOP = "DYNAMO_CTX_EVENT_LOOP"

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_LEVEL = "info"  # without --log-level or $DYN_LOG
LOG_FORMATS = ("text", "json")

#: The words that make DYN_LOGGING_JSONL (read only here) true, Dynamo's for
#: its variables. The library's one switch, DYNAMO_CTX_EMBED_NATS, is read by
#: go/natsbus/natsbus.go (envEmbed) alone, which takes 1, true and yes.
_TRUE = ("1", "true", "yes", "on")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors and plain-text help that shows defaults."""

    def __init__(self, prog: str, description: str, epilog: Optional[str] = None) -> None:
        super().__init__(prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        self._env_vars: List[str] = []

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message}; see {self.prog} --help", 2)

    def add(
        self,
        flag: str,
        *,
        help: str,
        default: Any = None,
        type: Optional[Callable[[str], Any]] = None,
        choices: Optional[Sequence[str]] = None,
        env: Optional[str] = None,
    ) -> None:
        """Add ``flag`` (see ``add_flag``)."""
        add_flag(self, flag, help=help, default=default, type=type, choices=choices, env=env)

    def add_library(self, flag: str, *, env: str, help: str) -> None:
        """Add ``flag`` (see ``add_library_flag``)."""
        add_library_flag(self, flag, env=env, help=help)

    def add_logging(self) -> None:
        """--log-level and --log-format, shared by every command."""
        add_logging(self)

    def add_event_loop(self) -> None:
        """--event-loop, shared by the commands that serve (worker, frontend)."""
        add_event_loop(self)


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` (any argparse parser, e.g. vLLM's) report bad arguments
    as ``ArgumentParser`` does: one line, exit status 2."""

    def error(message: str) -> NoReturn:
        fail(parser.prog, f"{message}; see {parser.prog} --help", 2)

    parser.error = error  # type: ignore[method-assign]


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    default: Any = None,
    type: Optional[Callable[[str], Any]] = None,
    choices: Optional[Sequence[str]] = None,
    env: Optional[str] = None,
) -> None:
    """Add ``flag`` to ``parser``; its default is ``$env`` when that is set
    (validated as the flag's value would be), and the help text says both."""
    conv = type or str
    if choices is not None:
        conv = _choice(choices, conv)
    default = env_default(parser, env, conv, default)
    notes = []
    if env is not None:
        notes.append(f"env {env}")
    if default is not None:
        notes.append(f"default: {default}")
    if notes:
        help = f"{help} ({'; '.join(notes)})"
    parser.add_argument(flag, type=conv, default=default, help=help, metavar=_metavar(flag, choices))


def env_default(parser: argparse.ArgumentParser, env: Optional[str], conv: Callable[[str], Any], default: Any) -> Any:
    """``$env`` parsed by ``conv`` when it is set, else ``default``: the one
    reading of a command's variable (a value ``conv`` refuses is a usage
    error naming the variable)."""
    if env is None or os.environ.get(env, "") == "":
        return default
    try:
        return conv(os.environ[env])
    except (argparse.ArgumentTypeError, ValueError) as e:
        parser.error(f"{env}={os.environ[env]!r}: {e}")


class _HelpWhenShown(argparse.Action):
    """A flag kept as given, whose help is made when the help is shown
    (``help_of()``): for help that names the library's values, which
    loading the library at parse time would cost the worker its order (it
    loads its engine, which may fork, before the library)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help_of: Callable[[], str], **kwargs: Any) -> None:
        self._help_of = help_of
        super().__init__(option_strings, dest, **kwargs)

    @property
    def help(self) -> str:
        return self._help_of()

    @help.setter
    def help(self, value: Optional[str]) -> None:
        pass  # made by help_of

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Optional[str] = None
    ) -> None:
        setattr(namespace, self.dest, values)


def add_nats_url(parser: argparse.ArgumentParser) -> None:
    """--nats-url, handed to the runtime as given: without it the library
    applies its rule ($NATS_SERVER, else its default address), which the
    help names from the library."""

    def help_of() -> str:
        lib = native()
        return f"NATS address (default: ${lib.NATS_ENV}, else {lib.DEFAULT_NATS_URL})"

    parser.add_argument("--nats-url", action=_HelpWhenShown, help_of=help_of, metavar="NATS_URL")


def add_library_flag(parser: argparse.ArgumentParser, flag: str, *, env: str, help: str) -> None:
    """Add ``flag``, a setting that the library parses (its one parser): the
    flag's text is kept as given, unparsed and without a default, for the
    command to hand on in its settings with where it came from (the
    frontend's ``library_settings``: the flag, else ``$env``). The help text
    says ``env``, as ``add_flag``'s does."""
    parser.add_argument(flag, default=None, help=f"{help} (env {env})", metavar=_metavar(flag, None))


def level_of(parser: argparse.ArgumentParser, given: Optional[str]) -> str:
    """The level a command logs at when its --log-level is not add_logging's
    (the worker's, under vLLM's engine arguments, is vLLM's): ``given``, else
    $DYN_LOG, else LOG_LEVEL, as add_logging's flag would have it."""
    if given:
        try:
            return log_spec(given)
        except argparse.ArgumentTypeError as e:
            parser.error(f"--log-level: {e}")
    level: str = env_default(parser, ENV_LOG, log_spec, LOG_LEVEL)
    return level


def add_logging(parser: argparse.ArgumentParser) -> None:
    """--log-level and --log-format, shared by every command."""
    add_flag(parser, "--log-level", type=log_spec, default=LOG_LEVEL, env=ENV_LOG,
             help="lowest level logged: " + ", ".join(LOG_LEVELS) + "; then optionally ,LOGGER=LEVEL pairs (as DYN_LOG)")
    add_flag(
        parser,
        "--log-format",
        type=log_format,
        default=log_format_default(),
        help="text, or json for one JSON object per line (also env DYN_LOGGING_JSONL=1)",
    )


#: The drain timeout's variable and default (seconds), as Kubernetes gives a pod 30 s.
ENV_DRAIN_TIMEOUT = "DYNAMO_CTX_DRAIN_TIMEOUT"
DRAIN_TIMEOUT = 30.0


def add_drain_timeout(parser: argparse.ArgumentParser, help: str, type: Optional[Callable[[str], float]] = None) -> None:
    """--drain-timeout, shared by the commands that serve (worker, frontend);
    ``type`` (default ``non_negative_float``) is the value's type: the
    frontend's, which the library takes, is ``timeout_seconds``."""
    add_flag(
        parser, "--drain-timeout", type=type or non_negative_float, default=DRAIN_TIMEOUT, env=ENV_DRAIN_TIMEOUT, help=help
    )


def add_event_loop(parser: argparse.ArgumentParser) -> None:
    """--event-loop, shared by the commands that serve (worker, frontend)."""
    add_flag(
        parser,
        "--event-loop", choices=EVENT_LOOPS, default="auto", env=ENV_EVENT_LOOP,
        help="the event loop: uvloop (as Dynamo's workers run; less CPU per token), asyncio's own, "
        "or auto: uvloop when it is installed",
    )


def _metavar(flag: str, choices: Optional[Sequence[str]]) -> str:
    if choices is not None:
        return "{" + ",".join(choices) + "}"
    return flag.lstrip("-").replace("-", "_").upper()


def _choice(choices: Sequence[str], conv: Callable[[str], Any]) -> Callable[[str], Any]:
    def check(text: str) -> Any:
        value = conv(text)
        if value not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return value

    return check


# ---------------------------------------------------------------- value types


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return x


def _checked(name: str, parse: Callable[[str], _N], ok: Callable[[_N], bool], why: str, doc: str) -> Callable[[str], _N]:
    """An argparse value type: text parsed by parse, refused unless ok. why
    is the refusal, formatted with the parsed value and the text given."""

    def check(text: str) -> _N:
        value = parse(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(why.format(value=value, text=text))
        return value

    check.__name__ = check.__qualname__ = name
    check.__doc__ = doc
    return check


port = _checked("port", _int, lambda n: 0 <= n <= 65535, "{value} is not a port (0 to 65535)", "A TCP port, 0 (any free port) to 65535.")
non_negative_int = _checked("non_negative_int", _int, lambda n: n >= 0, "{value} is negative (0 or more)", "A whole number, 0 or more.")
positive_int = _checked("positive_int", _int, lambda n: n > 0, "{value} is not positive (1 or more)", "A whole number, 1 or more.")
positive_float = _checked("positive_float", _float, lambda x: x > 0, "{text} is not positive", "A finite number above 0.")
non_negative_float = _checked("non_negative_float", _float, lambda x: x >= 0, "{text} is negative", "A finite number, 0 or more.")


def timeout_seconds(text: str) -> float:
    """A timeout in seconds as the library takes one: a finite number that
    the library's one timeout rule accepts (``_native.timeout_check``: 0 or
    more, below ``_native.MAX_TIMEOUT_SECONDS``), refused with its message.
    It loads the library: for the commands that may load it while they read
    their arguments (the frontend; not the worker, which loads its engine,
    which may fork, first)."""
    value = _float(text)
    try:
        native().timeout_check(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(native_reason(e)) from None
    return value


def _one_level(text: str, whole: str) -> str:
    level = text.strip().lower()
    if level == "warn":
        level = "warning"
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{whole!r} is not a log level ({', '.join(LOG_LEVELS)})")
    return level


def log_levels(text: str) -> Tuple[str, Dict[str, str]]:
    """A level and per-logger levels, in Dynamo's DYN_LOG form: a logging level
    name, any case, then optionally ``,logger=level`` pairs ("info,
    dynamo_ctx.backends.vllm=debug"); a logger's level applies to its
    children too."""
    bare = [p for p in text.split(",") if p.strip() and "=" not in p]
    if len(bare) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level ({', '.join(LOG_LEVELS)})")
    targets: Dict[str, str] = {}
    for pair in (p for p in text.split(",") if "=" in p):
        name, _, level = pair.partition("=")
        if not name.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is not a log level: {pair!r} names no logger")
        targets[name.strip()] = _one_level(level, text)
    return _one_level(bare[0], text), targets


def log_level(text: str) -> str:
    """The bare level of a log level setting (``log_levels``)."""
    return log_levels(text)[0]


def log_spec(text: str) -> str:
    """A log level setting (``log_levels``), checked and written as
    ``level[,logger=level...]``: what --log-level and $DYN_LOG hold."""
    level, targets = log_levels(text)
    return ",".join([level] + [f"{name}={lvl}" for name, lvl in targets.items()])


def log_format(text: str) -> str:
    fmt = text.strip().lower()
    if fmt in ("jsonl", "json-lines"):
        fmt = "json"
    if fmt not in LOG_FORMATS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log format ({', '.join(LOG_FORMATS)})")
    return fmt


def log_format_default() -> str:
    """``json`` when $DYN_LOGGING_JSONL is true, else ``text``."""
    value = os.environ.get(ENV_LOGGING_JSONL, "").strip().lower()
    return "json" if value in _TRUE else "text"


def engine_available(name: str) -> bool:
    """Whether the Python package ``name`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
