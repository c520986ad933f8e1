#!/usr/bin/env python3
"""Build script and in-tree PEP 517 / PEP 660 build backend for dynamo-ctx.

The core of dynamo-ctx is a Go library compiled with ``go build
-buildmode=c-shared`` into a single shared object that doubles as the CPython
extension module ``dynamo_ctx._native`` (stable ABI, Py_LIMITED_API 3.9).

Script usage (from anywhere; paths are relative to the repository root)::

    python build.py                 # build python/dynamo_ctx/_native.abi3.so if stale
    python build.py --force         # always rebuild
    python build.py --print-lib     # build if stale, then print the library path
    python build.py --wheel dist    # build a wheel into dist/
    python build.py --sdist dist    # build an sdist into dist/

Backend usage (pyproject.toml)::

    [build-system]
    requires = []
    build-backend = "build"
    backend-path = ["."]

Only the standard library is used, and the module runs on Python >= 3.9.
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import importlib.machinery
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent
PACKAGE = "dynamo_ctx"
PACKAGE_DIR = Path("python") / PACKAGE
GO_PACKAGE = "./go/native"
EXT_SUFFIX = ".abi3.so"
LIB_NAME = "_native" + EXT_SUFFIX
GO_HEADER_NAME = "_native.abi3.h"  # what `go build -o _native.abi3.so` writes
HEADER_RELPATH = Path("include") / "dynamo_ctx.h"  # where the header ends up
ABI_TAG = "cp39-abi3"
FALLBACK_GO = Path("/usr/local/go/bin/go")
GENERATOR = "dynamo-ctx build.py"

# Never shipped in wheels / sdists.
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".venv", "venv"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_BINARY_SUFFIXES = (".so", ".dylib", ".dll", ".pyd", ".test")


class BuildError(RuntimeError):
    """A build failure with a message meant for humans."""


def _log(msg: str) -> None:
    print(f"build.py: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Native library
# ---------------------------------------------------------------------------


def _resolve(path: Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else ROOT / path


def library_path(out_dir: Path = PACKAGE_DIR) -> Path:
    """Path of the shared library / extension module inside ``out_dir``."""
    return _resolve(out_dir) / LIB_NAME


def _iter_files(top: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            yield Path(dirpath) / name


def _go_inputs() -> List[Path]:
    inputs = [ROOT / "go.mod", ROOT / "go.sum"]
    inputs = [p for p in inputs if p.is_file()]
    go_dir = ROOT / "go"
    if go_dir.is_dir():
        inputs.extend(p for p in _iter_files(go_dir) if p.is_file())
    return inputs


def _is_up_to_date(lib: Path, header: Path) -> bool:
    if not lib.is_file() or not header.is_file():
        return False
    lib_mtime = lib.stat().st_mtime_ns
    return all(p.stat().st_mtime_ns < lib_mtime for p in _go_inputs())


def _required_go_version() -> str:
    try:
        m = re.search(r"^go\s+(\S+)", (ROOT / "go.mod").read_text("utf-8"), re.M)
    except OSError:
        return ""
    return m.group(1) if m else ""


def find_go() -> str:
    """Locate the ``go`` executable or raise BuildError."""
    go = shutil.which("go")
    if go:
        return go
    if FALLBACK_GO.is_file() and os.access(FALLBACK_GO, os.X_OK):
        return str(FALLBACK_GO)
    want = _required_go_version()
    raise BuildError(
        "Go toolchain not found: 'go' is not on PATH and "
        f"{FALLBACK_GO} does not exist. dynamo-ctx needs Go"
        f"{' >= ' + want if want else ''} (with cgo and a C compiler) to build "
        "its native library; install it from https://go.dev/dl/ and make sure "
        "'go' is on PATH."
    )


def python_include_dir() -> Path:
    """Directory holding Python.h for the running interpreter, or BuildError."""
    inc = Path(sysconfig.get_paths()["include"])
    if not (inc / "Python.h").is_file():
        ver = "%d.%d" % sys.version_info[:2]
        raise BuildError(
            f"Python development headers not found: {inc / 'Python.h'} does not "
            f"exist. Install the headers for Python {ver} (e.g. "
            f"'apt install python{ver}-dev' on Debian/Ubuntu or "
            f"'dnf install python{ver}-devel' on Fedora) and retry."
        )
    return inc


def _check_extension_suffix() -> None:
    if EXT_SUFFIX not in importlib.machinery.EXTENSION_SUFFIXES:
        raise BuildError(
            f"this interpreter ({sys.implementation.name} {sys.version.split()[0]}, "
            f"{sysconfig.get_platform()}) cannot load stable-ABI extension modules "
            f"ending in {EXT_SUFFIX!r} (supported suffixes: "
            f"{importlib.machinery.EXTENSION_SUFFIXES}); dynamo-ctx needs a "
            "regular (non free-threaded) CPython >= 3.9 on a Unix-like platform."
        )


def _join_flags(existing: Optional[str], *extra: str) -> str:
    parts = [existing.strip()] if existing and existing.strip() else []
    parts.extend(extra)
    return " ".join(parts)


def build_library(out_dir: Path = PACKAGE_DIR, force: bool = False) -> Path:
    """Compile the Go core into ``<out_dir>/_native.abi3.so``.

    Also moves the cgo-generated header to ``<out_dir>/include/dynamo_ctx.h``.
    The build is skipped when the library (and header) are newer than every
    file under go/ plus go.mod/go.sum, unless ``force`` is true.  Returns the
    absolute path of the library.
    """
    _check_extension_suffix()
    out = _resolve(out_dir)
    lib = out / LIB_NAME
    header = out / HEADER_RELPATH
    if not force and _is_up_to_date(lib, header):
        _log(f"{_display(lib)} is up to date")
        return lib

    go = find_go()
    include = python_include_dir()
    out.mkdir(parents=True, exist_ok=True)

    env = dict(os.environ)
    env["CGO_ENABLED"] = "1"
    env["CGO_CFLAGS"] = _join_flags(env.get("CGO_CFLAGS"), f"-I{include}", "-O2")
    if sys.platform == "darwin":
        unresolved = "-Wl,-undefined,dynamic_lookup"
    else:
        unresolved = "-Wl,--unresolved-symbols=ignore-all"
    # Python symbols are left undefined; the interpreter provides them at import.
    env["CGO_LDFLAGS"] = _join_flags(env.get("CGO_LDFLAGS"), unresolved)

    cmd = [go, "build", "-buildmode=c-shared", "-trimpath", "-o", _display(lib), GO_PACKAGE]
    _log("CGO_CFLAGS=%r CGO_LDFLAGS=%r" % (env["CGO_CFLAGS"], env["CGO_LDFLAGS"]))
    _log("running: " + " ".join(cmd))
    try:
        # stdout goes to stderr so that `--print-lib` output stays clean.
        proc = subprocess.run(cmd, cwd=str(ROOT), env=env, stdout=sys.stderr)
    except OSError as exc:
        raise BuildError(f"could not run {go!r}: {exc}") from exc
    if proc.returncode != 0:
        raise BuildError(f"go build failed with exit status {proc.returncode} (command: {' '.join(cmd)})")

    generated = out / GO_HEADER_NAME
    if generated.is_file():
        header.parent.mkdir(parents=True, exist_ok=True)
        os.replace(generated, header)
    elif not header.is_file():
        raise BuildError(f"go build did not produce the header {generated}")
    if not lib.is_file():
        raise BuildError(f"go build did not produce {lib}")
    # Keep lib strictly newer than the header move for the mtime check.
    os.utime(lib)
    _log(f"built {_display(lib)} and {_display(header)}")
    return lib


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------
# pyproject.toml
# ---------------------------------------------------------------------------


class TomlError(ValueError):
    pass


class _MiniToml:
    """A small TOML reader for Python < 3.11 (no tomllib).

    Supports what a pyproject.toml uses: tables, arrays of tables, dotted and
    quoted keys, basic/literal (multi-line) strings, integers, floats,
    booleans, arrays and inline tables. Date/time values are returned as
    strings.
    """

    _BARE = re.compile(r"[A-Za-z0-9_-]+")
    _ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\", "e": "\x1b"}

    def __init__(self, text: str) -> None:
        self.s = text.replace("\r\n", "\n")
        self.i = 0

    # -- helpers ---------------------------------------------------------
    def _err(self, msg: str) -> TomlError:
        line = self.s.count("\n", 0, self.i) + 1
        return TomlError(f"pyproject.toml line {line}: {msg}")

    def _peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def _ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def _comment(self) -> None:
        if self._peek() == "#":
            end = self.s.find("\n", self.i)
            self.i = len(self.s) if end < 0 else end

    def _ws_nl(self) -> None:
        while True:
            self._ws()
            self._comment()
            if self._peek() == "\n":
                self.i += 1
            else:
                return

    def _eol(self) -> None:
        self._ws()
        self._comment()
        if self.i < len(self.s):
            if self._peek() != "\n":
                raise self._err(f"expected end of line, found {self._peek()!r}")
            self.i += 1

    def _expect(self, tok: str) -> None:
        if not self.s.startswith(tok, self.i):
            raise self._err(f"expected {tok!r}")
        self.i += len(tok)

    # -- grammar ---------------------------------------------------------
    def parse(self) -> Dict[str, Any]:
        root: Dict[str, Any] = {}
        current = root
        while True:
            self._ws_nl()
            if self.i >= len(self.s):
                return root
            if self._peek(2) == "[[":
                self.i += 2
                keys = self._key()
                self._expect("]]")
                parent = self._walk(root, keys[:-1])
                arr = parent.setdefault(keys[-1], [])
                if not isinstance(arr, list):
                    raise self._err(f"{'.'.join(keys)} is not an array of tables")
                current = {}
                arr.append(current)
            elif self._peek() == "[":
                self.i += 1
                keys = self._key()
                self._expect("]")
                current = self._walk(root, keys)
            else:
                self._keyval(current)
            self._eol()

    def _walk(self, table: Dict[str, Any], keys: List[str]) -> Dict[str, Any]:
        for key in keys:
            table = table.setdefault(key, {})
            if isinstance(table, list):
                table = table[-1]
            if not isinstance(table, dict):
                raise self._err(f"key {key!r} is not a table")
        return table

    def _keyval(self, table: Dict[str, Any]) -> None:
        keys = self._key()
        self._ws()
        self._expect("=")
        self._ws()
        value = self._value()
        target = self._walk(table, keys[:-1])
        if keys[-1] in target:
            raise self._err(f"duplicate key {'.'.join(keys)!r}")
        target[keys[-1]] = value

    def _key(self) -> List[str]:
        keys = []
        while True:
            self._ws()
            c = self._peek()
            if c == '"':
                keys.append(self._basic_string())
            elif c == "'":
                keys.append(self._literal_string())
            else:
                m = self._BARE.match(self.s, self.i)
                if not m:
                    raise self._err("invalid key")
                keys.append(m.group())
                self.i = m.end()
            self._ws()
            if self._peek() != ".":
                return keys
            self.i += 1

    def _value(self) -> Any:
        c = self._peek()
        if self._peek(3) == '"""':
            return self._ml_string('"""', escapes=True)
        if self._peek(3) == "'''":
            return self._ml_string("'''", escapes=False)
        if c == '"':
            return self._basic_string()
        if c == "'":
            return self._literal_string()
        if c == "[":
            return self._array()
        if c == "{":
            return self._inline_table()
        m = re.compile(r"[^\s,\]}#]+(?:[ T][0-9:.+\-Z]+)?").match(self.s, self.i)
        if not m:
            raise self._err("missing value")
        tok = m.group()
        self.i = m.end()
        if tok == "true":
            return True
        if tok == "false":
            return False
        clean = tok.replace("_", "")
        try:
            if re.fullmatch(r"[+-]?0[xob][0-9a-fA-F]+", clean):
                sign = -1 if clean[0] == "-" else 1
                return sign * int(clean.lstrip("+-"), 0)
            if re.fullmatch(r"[+-]?[0-9]+", clean):
                return int(clean)
            if re.fullmatch(r"[+-]?(inf|nan|[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?)", clean):
                return float(clean)
        except ValueError:
            pass
        if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}.*|[0-9]{2}:[0-9]{2}:[0-9]{2}.*", tok):
            return tok
        raise self._err(f"unsupported value {tok!r}")

    def _array(self) -> List[Any]:
        self._expect("[")
        items = []
        while True:
            self._ws_nl()
            if self._peek() == "]":
                self.i += 1
                return items
            items.append(self._value())
            self._ws_nl()
            if self._peek() == ",":
                self.i += 1
            elif self._peek() != "]":
                raise self._err("expected ',' or ']' in array")

    def _inline_table(self) -> Dict[str, Any]:
        self._expect("{")
        table: Dict[str, Any] = {}
        self._ws()
        if self._peek() == "}":
            self.i += 1
            return table
        while True:
            self._keyval(table)
            self._ws()
            if self._peek() == ",":
                self.i += 1
                self._ws()
            elif self._peek() == "}":
                self.i += 1
                return table
            else:
                raise self._err("expected ',' or '}' in inline table")

    def _literal_string(self) -> str:
        self._expect("'")
        end = self.s.find("'", self.i)
        if end < 0 or "\n" in self.s[self.i : end]:
            raise self._err("unterminated string")
        out = self.s[self.i : end]
        self.i = end + 1
        return out

    def _basic_string(self) -> str:
        self._expect('"')
        out = []
        while True:
            if self.i >= len(self.s) or self._peek() == "\n":
                raise self._err("unterminated string")
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\":
                out.append(self._escape())
            else:
                out.append(c)
                self.i += 1

    def _escape(self) -> str:
        c = self.s[self.i + 1 : self.i + 2]
        if c in self._ESCAPES:
            self.i += 2
            return self._ESCAPES[c]
        if c in ("u", "U", "x"):
            n = {"u": 4, "U": 8, "x": 2}[c]
            digits = self.s[self.i + 2 : self.i + 2 + n]
            if not re.fullmatch(r"[0-9a-fA-F]{%d}" % n, digits):
                raise self._err("invalid unicode escape")
            self.i += 2 + n
            return chr(int(digits, 16))
        raise self._err(f"invalid escape \\{c}")

    def _ml_string(self, delim: str, escapes: bool) -> str:
        self.i += 3
        if self._peek() == "\n":
            self.i += 1
        out = []
        while True:
            if self.i >= len(self.s):
                raise self._err("unterminated multi-line string")
            if self.s.startswith(delim, self.i):
                # Up to two extra quotes right before the closing delimiter belong to the string.
                extra = 0
                while extra < 2 and self.s.startswith(delim[0], self.i + 3 + extra):
                    extra += 1
                out.append(delim[0] * extra)
                self.i += 3 + extra
                return "".join(out)
            c = self.s[self.i]
            if escapes and c == "\\":
                m = re.compile(r"\\[ \t]*\n[ \t\n]*").match(self.s, self.i)
                if m:  # line-ending backslash: trim the newline and leading whitespace
                    self.i = m.end()
                else:
                    out.append(self._escape())
            else:
                out.append(c)
                self.i += 1


def parse_toml(text: str) -> Dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:  # Python 3.9 / 3.10
        return _MiniToml(text).parse()
    return tomllib.loads(text)


def load_pyproject(root: Path = ROOT) -> Dict[str, Any]:
    path = root / "pyproject.toml"
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise BuildError(f"cannot read {path}: {exc}") from exc
    return parse_toml(text)


# ---------------------------------------------------------------------------
# Core metadata
# ---------------------------------------------------------------------------


def _normalize_dist(name: str) -> str:
    """Distribution name as used in wheel/sdist file names (dynamo-ctx -> dynamo_ctx)."""
    return re.sub(r"[-_.]+", "_", name).lower()


class Project:
    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        data = load_pyproject(root)
        project = data.get("project")
        if not isinstance(project, dict):
            raise BuildError("pyproject.toml has no [project] table")
        self.table = project
        for key in ("name", "version"):
            if not isinstance(project.get(key), str) or not project[key].strip():
                raise BuildError(f"pyproject.toml: [project] {key} must be a non-empty string")
        if project.get("dynamic"):
            raise BuildError(f"pyproject.toml: dynamic metadata is not supported by build.py ({project['dynamic']})")
        self.name: str = project["name"].strip()
        self.version: str = project["version"].strip()
        self.dist = _normalize_dist(self.name)

    @property
    def dist_info(self) -> str:
        return f"{self.dist}-{self.version}.dist-info"

    @property
    def sdist_base(self) -> str:
        return f"{self.dist}-{self.version}"

    def _readme(self) -> Tuple[Optional[str], Optional[str], Optional[Path]]:
        readme = self.table.get("readme")
        if readme is None:
            return None, None, None
        content_type = None
        path = None
        if isinstance(readme, str):
            path = self.root / readme
        elif isinstance(readme, dict):
            content_type = readme.get("content-type")
            if "file" in readme:
                path = self.root / readme["file"]
            elif "text" in readme:
                return readme["text"], content_type or "text/plain", None
        if path is None:
            raise BuildError(f"pyproject.toml: unsupported readme value {readme!r}")
        if content_type is None:
            content_type = {".md": "text/markdown", ".rst": "text/x-rst"}.get(path.suffix.lower(), "text/plain")
        try:
            return path.read_text("utf-8"), content_type, path
        except OSError:
            _log(f"warning: readme {_display(path)} not found; building without a long description")
            return None, None, None

    def readme_path(self) -> Optional[Path]:
        readme = self.table.get("readme")
        if isinstance(readme, str):
            return self.root / readme
        if isinstance(readme, dict) and "file" in readme:
            return self.root / readme["file"]
        return None

    def metadata(self) -> str:
        """Core metadata (METADATA / PKG-INFO), version 2.1."""
        p = self.table
        lines: List[Tuple[str, str]] = [
            ("Metadata-Version", "2.1"),
            ("Name", self.name),
            ("Version", self.version),
        ]
        if p.get("description"):
            lines.append(("Summary", " ".join(str(p["description"]).split())))
        lic = p.get("license")
        if isinstance(lic, str):
            lines.append(("License", lic))
        elif isinstance(lic, dict):
            if "text" in lic:
                lines.append(("License", " ".join(str(lic["text"]).split())))
            elif "file" in lic:
                try:
                    first = (self.root / lic["file"]).read_text("utf-8").strip().splitlines()[0]
                    lines.append(("License", first.strip()))
                except (OSError, IndexError):
                    pass
        for who, field in (("authors", "Author"), ("maintainers", "Maintainer")):
            names, emails = [], []
            for person in p.get(who, []) or []:
                if person.get("email"):
                    emails.append(f"{person['name']} <{person['email']}>" if person.get("name") else person["email"])
                elif person.get("name"):
                    names.append(person["name"])
            if names:
                lines.append((field, ", ".join(names)))
            if emails:
                lines.append((field + "-email", ", ".join(emails)))
        if p.get("keywords"):
            lines.append(("Keywords", ",".join(p["keywords"])))
        for classifier in p.get("classifiers", []) or []:
            lines.append(("Classifier", classifier))
        for label, url in (p.get("urls") or {}).items():
            lines.append(("Project-URL", f"{label}, {url}"))
        if p.get("requires-python"):
            lines.append(("Requires-Python", str(p["requires-python"]).strip()))
        for req in p.get("dependencies", []) or []:
            lines.append(("Requires-Dist", req.strip()))
        for extra, reqs in (p.get("optional-dependencies") or {}).items():
            extra_name = re.sub(r"[-_.]+", "-", extra).lower()
            lines.append(("Provides-Extra", extra_name))
            for req in reqs:
                lines.append(("Requires-Dist", _with_extra_marker(req, extra_name)))
        body, content_type, _ = self._readme()
        if content_type:
            lines.append(("Description-Content-Type", content_type))
        text = "".join(f"{k}: {v}\n" for k, v in lines)
        if body:
            text += "\n" + body
            if not body.endswith("\n"):
                text += "\n"
        return text

    def entry_points(self) -> str:
        p = self.table
        groups: Dict[str, Dict[str, str]] = {}
        if p.get("scripts"):
            groups["console_scripts"] = p["scripts"]
        if p.get("gui-scripts"):
            groups["gui_scripts"] = p["gui-scripts"]
        for group, entries in (p.get("entry-points") or {}).items():
            groups[group] = entries
        out = []
        for group, entries in groups.items():
            out.append(f"[{group}]")
            out.extend(f"{k} = {v}" for k, v in entries.items())
            out.append("")
        return "\n".join(out)


def _with_extra_marker(req: str, extra: str) -> str:
    req = req.strip()
    if ";" in req:
        spec, marker = req.split(";", 1)
        return f'{spec.strip()}; ({marker.strip()}) and extra == "{extra}"'
    return f'{req}; extra == "{extra}"'


def platform_tag() -> str:
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def wheel_tag() -> str:
    return f"{ABI_TAG}-{platform_tag()}"


def _wheel_file(project: Project) -> str:
    return (
        f"Wheel-Version: 1.0\n"
        f"Generator: {GENERATOR}\n"
        f"Root-Is-Purelib: false\n"
        f"Tag: {wheel_tag()}\n"
    )


def _dist_info_files(project: Project) -> List[Tuple[str, bytes]]:
    files = [
        ("METADATA", project.metadata().encode("utf-8")),
        ("WHEEL", _wheel_file(project).encode("utf-8")),
        ("top_level.txt", f"{PACKAGE}\n".encode("utf-8")),
    ]
    entry_points = project.entry_points()
    if entry_points:
        files.append(("entry_points.txt", entry_points.encode("utf-8")))
    return files


# ---------------------------------------------------------------------------
# Archives
# ---------------------------------------------------------------------------


def _source_date_epoch() -> Optional[int]:
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value:
        try:
            return int(value)
        except ValueError:
            _log(f"warning: ignoring invalid SOURCE_DATE_EPOCH={value!r}")
    return None


def _zip_date(mtime: float) -> Tuple[int, int, int, int, int, int]:
    epoch = _source_date_epoch()
    t = time.gmtime(epoch if epoch is not None else mtime)
    return max(t[:6], (1980, 1, 1, 0, 0, 0))  # zip cannot represent earlier dates


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


class _WheelWriter:
    def __init__(self, path: Path, dist_info: str) -> None:
        self.path = path
        self.dist_info = dist_info
        self.tmp = path.with_name(path.name + ".tmp")
        self.zf = zipfile.ZipFile(self.tmp, "w", compression=zipfile.ZIP_DEFLATED)
        self.records: List[Tuple[str, str, str]] = []

    def add_bytes(self, arcname: str, data: bytes, mode: int = 0o644, mtime: Optional[float] = None) -> None:
        info = zipfile.ZipInfo(arcname, date_time=_zip_date(time.time() if mtime is None else mtime))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = ((mode & 0o777) | stat.S_IFREG) << 16
        info.create_system = 3  # Unix, so that permissions are honoured
        self.zf.writestr(info, data)
        self.records.append((arcname, _record_hash(data), str(len(data))))

    def add_file(self, arcname: str, path: Path) -> None:
        st = path.stat()
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        self.add_bytes(arcname, path.read_bytes(), mode=mode, mtime=st.st_mtime)

    def close(self) -> None:
        record_name = f"{self.dist_info}/RECORD"
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in self.records:
            writer.writerow(row)
        writer.writerow((record_name, "", ""))
        info = zipfile.ZipInfo(record_name, date_time=_zip_date(time.time()))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (0o644 | stat.S_IFREG) << 16
        info.create_system = 3
        self.zf.writestr(info, buf.getvalue().encode("utf-8"))
        self.zf.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.zf.close()
        try:
            self.tmp.unlink()
        except OSError:
            pass


def _package_files(pkg_dir: Path) -> Iterator[Tuple[str, Path]]:
    """(arcname, path) for every file of the Python package that goes in a wheel."""
    for path in _iter_files(pkg_dir):
        rel = path.relative_to(pkg_dir)
        name = path.name
        if name.endswith(_SKIP_SUFFIXES) or name in (GO_HEADER_NAME, ".DS_Store"):
            continue
        if rel.parent == Path(".") and name.startswith("_native.") and name.endswith(".so") and name != LIB_NAME:
            # A stale non-abi3 build would shadow _native.abi3.so at import time.
            _log(f"warning: not packaging stray extension {_display(path)}")
            continue
        yield (Path(PACKAGE) / rel).as_posix(), path


def _write_wheel(wheel_directory: str, project: Project, payload: Iterable[Tuple[str, Any]]) -> str:
    out_dir = Path(wheel_directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    filename = f"{project.dist}-{project.version}-{wheel_tag()}.whl"
    writer = _WheelWriter(out_dir / filename, project.dist_info)
    try:
        for arcname, item in payload:
            if isinstance(item, Path):
                writer.add_file(arcname, item)
            else:
                writer.add_bytes(arcname, item)
        for name, data in _dist_info_files(project):
            writer.add_bytes(f"{project.dist_info}/{name}", data)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    _log(f"wrote {out_dir / filename}")
    return filename


# ---------------------------------------------------------------------------
# PEP 517 / PEP 660 hooks
# ---------------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    project = Project()
    target = Path(metadata_directory) / project.dist_info
    target.mkdir(parents=True, exist_ok=True)
    for name, data in _dist_info_files(project):
        (target / name).write_bytes(data)
    return project.dist_info


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def _force(config_settings: Optional[Dict[str, Any]]) -> bool:
    value = (config_settings or {}).get("force")
    return str(value).lower() in ("1", "true", "yes", "on") if value is not None else False


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    project = Project()
    pkg_dir = ROOT / PACKAGE_DIR
    build_library(PACKAGE_DIR, force=_force(config_settings))
    return _write_wheel(wheel_directory, project, _package_files(pkg_dir))


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    project = Project()
    build_library(PACKAGE_DIR, force=_force(config_settings))
    pth = (str(ROOT / "python") + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, project, [(f"{PACKAGE}_editable.pth", pth)])


def _sdist_excluded(rel: Path) -> bool:
    parts = rel.parts
    if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in parts[:-1]):
        return True
    if any(part.startswith(".") for part in parts[:-1]):
        return True
    name = parts[-1]
    if name.endswith(_SKIP_SUFFIXES + _BINARY_SUFFIXES) or name == ".DS_Store":
        return True
    # Build artefacts of build_library().
    generated = {PACKAGE_DIR / LIB_NAME, PACKAGE_DIR / GO_HEADER_NAME, PACKAGE_DIR / HEADER_RELPATH}
    return rel in generated


def sdist_files(root: Path = ROOT, project: Optional[Project] = None) -> List[Path]:
    """Repository-relative paths of the files that go into the sdist."""
    project = project or Project(root)
    wanted: List[Path] = []
    for required in ("pyproject.toml", "build.py", "go.mod"):
        if not (root / required).is_file():
            raise BuildError(f"cannot build sdist: {required} is missing")
    singles = ["build.py", "pyproject.toml", "go.mod", "go.sum", "README.md", "Makefile"]
    readme = project.readme_path()
    if readme is not None:
        singles.append(_display(readme))
    singles.extend(sorted(p.name for p in root.glob("LICENSE*")) + sorted(p.name for p in root.glob("NOTICE*")))
    for name in singles:
        if (root / name).is_file() and Path(name) not in wanted:
            wanted.append(Path(name))
    for tree in ("go", "python", "docs"):
        if (root / tree).is_dir():
            for path in _iter_files(root / tree):
                rel = path.relative_to(root)
                if path.is_file() and not _sdist_excluded(rel):
                    wanted.append(rel)
    return wanted


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    project = Project()
    base = project.sdist_base
    filename = f"{base}.tar.gz"
    out_dir = Path(sdist_directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / filename
    tmp = target.with_name(filename + ".tmp")
    epoch = _source_date_epoch()
    now = int(time.time())

    def add(tar: tarfile.TarFile, arcname: str, data: bytes, mode: int, mtime: float) -> None:
        info = tarfile.TarInfo(f"{base}/{arcname}")
        info.size = len(data)
        info.mode = mode
        info.mtime = int(epoch if epoch is not None else mtime)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(data))

    try:
        with open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=epoch if epoch is not None else now) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for rel in sdist_files(ROOT, project):
                        path = ROOT / rel
                        st = path.stat()
                        mode = 0o755 if st.st_mode & 0o111 else 0o644
                        add(tar, rel.as_posix(), path.read_bytes(), mode, st.st_mtime)
                    add(tar, "PKG-INFO", project.metadata().encode("utf-8"), 0o644, now)
        os.replace(tmp, target)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _log(f"wrote {target}")
    return filename


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="build.py",
        description="Build the dynamo-ctx native library (Go, c-shared, CPython stable ABI).",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the library is up to date")
    parser.add_argument("--print-lib", action="store_true", help="print the path of the built library on stdout")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=PACKAGE_DIR,
        help="output directory, relative to the repository root (default: %(default)s)",
    )
    parser.add_argument("--wheel", metavar="DIR", help="also build a wheel into DIR")
    parser.add_argument("--sdist", metavar="DIR", help="also build an sdist into DIR")
    args = parser.parse_args(argv)

    try:
        lib = build_library(args.out_dir, force=args.force)
        if args.wheel:
            build_wheel(args.wheel)
        if args.sdist:
            build_sdist(args.sdist)
    except BuildError as exc:
        print(f"build.py: error: {exc}", file=sys.stderr)
        return 1
    if args.print_lib:
        print(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
