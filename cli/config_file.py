"""RabbitMQ's ``rabbitmq.conf``, as ``shoal serve --config FILE`` reads it.

Theory of operation
-------------------
The file is cuttlefish's sysctl-like format: one ``key = value`` per line, dotted keys, unquoted
values, ``#`` starts a comment (anywhere on a line, as cuttlefish reads it: a value cannot hold
``#``), blank lines are skipped. A key given twice takes its last value, as in RabbitMQ.

Each key Shoal knows maps onto one of ``shoal serve``'s parameters (named as click names them:
``heartbeat``, ``memory_high_watermark``, ...) and is given a typed value here; a key Shoal does
not know, or a value it cannot take, raises :class:`ConfigFileError` naming the file, the line and
the key. No click here: the command line turns :func:`read` 's settings into its parameters'
defaults, so that options given on the command line still win (``cli.main``).

Keys for features that other parts of Shoal grow (the management and Prometheus listeners, TLS,
definitions at start) map onto an option only if ``shoal serve`` has it: the caller passes the
names of the parameters it has.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

# RabbitMQ's information units (rabbit_resource_monitor_misc:parse_information_unit, as its
# rabbitmq.conf takes them for disk_free_limit, vm_memory_high_watermark.absolute and
# max_message_size): kB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB and the bare letters
# k, M, G, T are powers of 1024; no unit is bytes. Case does not matter.
_UNITS = {"": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"([0-9]+)([a-z]*)")
SIZE_HELP = "bytes, or a number with kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB, k, M, G, T"
# cuttlefish's own bytesize datatype (frame_max): KB, MB, GB are powers of 1024, upper case only.
_BYTESIZE = re.compile(r"([0-9]+)(KB|MB|GB)?")
_BYTESIZE_UNITS = {None: 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}

_LINE = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*=\s*(.*?)\s*")
# RabbitMQ's log levels (log.console.level) onto Shoal's --log-level: notice lies between info
# and warning and Python has no level for it, so it shows a little more; Shoal logs to stderr
# only, so `none` is as quiet as it gets.
_LOG_LEVELS = {"debug": "debug", "info": "info", "notice": "info", "warning": "warning",
               "error": "error", "critical": "critical", "alert": "critical",
               "emergency": "critical", "none": "critical"}
# Keys of features other engineers add to `shoal serve`: the parameter names each may map onto.
_PENDING = {
    "management.tcp.port": ("management_port",),
    "management.tcp.ip": ("management_host", "management_ip"),
    "management.ssl.port": ("management_tls_port",),
    "management.ssl.certfile": ("management_tls_cert",),
    "management.ssl.keyfile": ("management_tls_key",),
    "management.ssl.cacertfile": ("management_tls_ca",),
    "prometheus.tcp.port": ("prometheus_port",),
    "prometheus.tcp.ip": ("prometheus_host", "prometheus_ip"),
    "load_definitions": ("load_definitions", "definitions"),
}
NOT_YET = "not supported by this Shoal yet"


def parse_size(text: str) -> int:
    """A size in RabbitMQ's information units: 50MB is 50,000,000 bytes, 50MiB and 50M 52,428,800.

    Raises ValueError for anything else (a fraction, a sign, an unknown unit)."""
    match = _SIZE.fullmatch(str(text).strip().lower().replace(" ", ""))
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"expected {SIZE_HELP}")
    return int(match.group(1)) * _UNITS[match.group(2)]


class ConfigFileError(ValueError):
    """A line of the file Shoal cannot take: ``FILE:LINE: key: reason``."""

    def __init__(self, path: str, line: int, key: str, reason: str) -> None:
        super().__init__(f"{path}:{line}: {key}: {reason}")
        self.path, self.line, self.key, self.reason = path, line, key, reason


@dataclass(frozen=True)
class Setting:
    """One ``shoal serve`` parameter as the file sets it, and the line that set it."""

    option: str  # the parameter's name, as click has it (``memory_high_watermark``)
    value: object
    key: str
    line: int


class _Invalid(ValueError):
    """A value a key cannot take; the reason, which :func:`parse` places at its line."""


def parse(text: str, path: str, options: Collection[str]) -> dict[str, Setting]:
    """The settings of a whole file, by parameter name. ``options``: the parameters `shoal serve`
    has (the keys of features it lacks are refused)."""
    reader = _Reader(path, options)
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.partition("#")[0]
        if line.strip():
            reader.line(number, line)
    return reader.finish()


def read(path: str, options: Collection[str]) -> dict[str, Setting]:
    """:func:`parse` of the file at ``path`` (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return parse(f.read(), path, options)


class _Reader:
    """Applies one line at a time; the users and the loopback users are settled at the end,
    when every key that shapes them has been seen."""

    def __init__(self, path: str, options: Collection[str]) -> None:
        self.path = path
        self.options = options
        self.settings: dict[str, Setting] = {}
        self.listener: dict[str, tuple[str, int]] = {}  # "tcp"/"ssl" -> (key, line) of the one
        self.default_user: dict[str, tuple[str, int]] = {}  # key -> (value, line)
        self.default_permissions: dict[str, tuple[str, int]] = {}  # configure/write/read -> ...
        self.loopback: dict[str, tuple[bool, int]] = {}  # name -> (restricted, line)
        self.loopback_none: int = 0  # line of `loopback_users = none`
        self.console_off: int = 0  # line of `log.console = false`
        self.ssl_host: tuple[str, str, int] | None = None  # listeners.ssl's address, key, line

    def line(self, number: int, line: str) -> None:
        match = _LINE.fullmatch(line)
        if match is None:
            key = line.strip().partition("=")[0].strip() or "?"
            raise ConfigFileError(self.path, number, key, "expected KEY = VALUE")
        key, value = match.groups()
        if not value:
            raise ConfigFileError(self.path, number, key, "no value after '='")
        try:
            self._apply(key, value, number)
        except _Invalid as exc:
            raise ConfigFileError(self.path, number, key, str(exc)) from None

    def set(self, option: str, value: object, key: str, line: int) -> None:
        self.settings[option] = Setting(option, value, key, line)

    def _apply(self, key: str, value: str, line: int) -> None:
        rule = _RULES.get(key)
        if rule is not None:
            rule(self, key, value, line)
        elif key.startswith(("listeners.tcp.", "listeners.ssl.")):
            self._listener(key, value, line)
        elif key.startswith("loopback_users."):
            self._loopback_user(key, value, line)
        elif key in _SSL_OPTIONS:
            option, convert = _SSL_OPTIONS[key]
            self.set(option, convert(value), key, line)
        elif key in _PENDING or key.startswith("ssl_options."):
            self._pending(key, value, line)
        elif key.startswith("log.file."):
            raise _Invalid(_LOG_FILE)
        else:
            raise _Invalid("unknown key (Shoal takes the keys docs/configuration.md lists)")

    def _listener(self, key: str, value: str, line: int) -> None:
        kind = key.split(".")[1]
        if kind in self.listener:
            first, first_line = self.listener[kind]
            raise _Invalid(f"a second {kind} listener: Shoal has one, given by {first} "
                           f"(line {first_line})")
        self.listener[kind] = (key, line)
        host, port = _host_port(value)
        if kind == "ssl":  # --tls-port, on --host's address (Shoal binds both on one address)
            if host is not None:
                self.ssl_host = (host, key, line)
            self.set("tls_port", port, key, line)
            return
        if host is not None:
            self.set("host", host, key, line)
        self.set("port", port, key, line)

    def _loopback_user(self, key: str, value: str, line: int) -> None:
        name = key.removeprefix("loopback_users.")
        if "," in name:
            raise _Invalid("a user name with ',' cannot be passed on to --loopback-users")
        self.loopback[name] = (_boolean(value), line)

    def _pending(self, key: str, value: str, line: int) -> None:
        for option in _pending_options(key):
            if option in self.options:
                self.set(option, value, key, line)
                return
        raise _Invalid(NOT_YET)

    def finish(self) -> dict[str, Setting]:
        if self.default_user:
            name, line = self.default_user.get("default_user", ("guest", 0))
            password, pass_line = self.default_user.get("default_pass", ("guest", 0))
            key = "default_user" if line >= pass_line else "default_pass"
            self.set("users", {name: password}, key, max(line, pass_line))
        if self.default_permissions:  # rabbit.schema: each of the three defaults to .*
            given = self.default_permissions
            line = max(line for _, line in given.values())
            self.set("default_permissions", tuple(given.get(kind, (".*", 0))[0] for kind in
                                                  ("configure", "write", "read")),
                     "default_permissions", line)
        if self.loopback_none:
            self.set("loopback_users", frozenset(), "loopback_users", self.loopback_none)
        elif self.loopback:
            # rabbit.schema: once loopback_users.NAME keys are given, the list is exactly the
            # names set to true (guest included only if it is one of them).
            names = frozenset(name for name, (on, _) in self.loopback.items() if on)
            line = max(line for _, line in self.loopback.values())
            self.set("loopback_users", names, "loopback_users", line)
        if self.ssl_host is not None:
            host, key, line = self.ssl_host
            tcp = self.settings.get("host")
            if tcp is None:
                self.set("host", host, key, line)
            elif tcp.value != host:
                raise ConfigFileError(self.path, line, key, (
                    f"{host} is not {tcp.value} ({tcp.key}, line {tcp.line}): Shoal binds its "
                    "TLS listener on the AMQP listener's address"))
        if self.console_off:  # log.console = false outranks any log.console.level
            self.set("log_level", "critical", "log.console", self.console_off)
        return self.settings


_LOG_FILE = "Shoal logs to stderr only (log.console): redirect it; log.file = false is accepted"


def _pending_options(key: str) -> tuple[str, ...]:
    if key.startswith("ssl_options."):
        rest = key.removeprefix("ssl_options.").replace(".", "_")
        return (f"ssl_{rest}", f"tls_{rest}")
    if key.startswith("listeners.ssl."):
        return ("ssl_port", "tls_port")
    return _PENDING[key]


def _host_port(value: str) -> tuple[str | None, int]:
    """listeners.tcp.NAME: a port, IPV4:PORT, or [IPV6]:PORT / IPV6:PORT (cuttlefish's ip)."""
    if value.isdigit():
        return None, _port(value)
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise _Invalid(f"expected PORT, or ADDRESS:PORT; got {value!r}")
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        raise _Invalid(f"{host!r} is not an IP address") from None
    if address.version != 4:
        raise _Invalid(f"{host} is IPv6: Shoal listens on IPv4 only")
    return str(address), _port(port)


def _port(text: str) -> int:
    port = int(text)
    if port > 65535:
        raise _Invalid(f"port {port} is over 65535")
    return port


def _boolean(value: str) -> bool:
    if value not in ("true", "false"):
        raise _Invalid(f"expected true or false; got {value!r}")
    return value == "true"


def _integer(value: str) -> int:
    if not value.isdigit():
        raise _Invalid(f"expected a whole number; got {value!r}")
    return int(value)


def _fraction(value: str) -> float:
    try:
        fraction = float(value)
    except ValueError:
        raise _Invalid(f"expected a fraction such as 0.4; got {value!r}") from None
    if not 0 < fraction <= 1:
        raise _Invalid(f"expected a fraction above 0 and at most 1; got {value}")
    return fraction


def _ratio(value: str) -> float:
    try:
        ratio = float(value)
    except ValueError:
        raise _Invalid(f"expected a fraction such as 0.5; got {value!r}") from None
    if not 0 <= ratio <= 1:  # RabbitMQ takes more than 1 (never pages); --memory-paging-ratio not
        raise _Invalid(f"expected 0 to 1; got {value}")
    return ratio


def _size(value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise _Invalid(f"{exc}; got {value!r}") from None


_Rule = Callable[[_Reader, str, str, int], None]


def _to(option: str, convert: Callable[[str], object]) -> _Rule:
    """A key that sets ``option`` to ``convert(value)``."""
    def rule(reader: _Reader, key: str, value: str, line: int) -> None:
        reader.set(option, convert(value), key, line)
    return rule


def _refuse(reason: str) -> _Rule:
    def rule(reader: _Reader, key: str, value: str, line: int) -> None:
        raise _Invalid(reason)
    return rule


def _absolute_watermark(value: str) -> int:
    size = _size(value)
    if size == 0:  # RabbitMQ: 0 blocks every publisher; Shoal's option reads 0 as its default
        raise _Invalid("0 would block every publisher; leave the key out for Shoal's default")
    return size


def _channel_max(value: str) -> int:
    # RabbitMQ's channel_max 0 is "no limit": AMQP 0-9-1's most, 65535 (§4.2.3: a 16-bit id).
    return _integer(value) or 65535


def _frame_max(value: str) -> int:
    match = _BYTESIZE.fullmatch(value)
    if match is None:
        raise _Invalid(f"expected bytes, or a number with KB, MB, GB (powers of 1024); got {value!r}")
    return int(match.group(1)) * _BYTESIZE_UNITS[match.group(2)]


def _log_level(value: str) -> str:
    if value not in _LOG_LEVELS:
        raise _Invalid(f"expected one of {', '.join(_LOG_LEVELS)}; got {value!r}")
    return _LOG_LEVELS[value]


def _default_user(reader: _Reader, key: str, value: str, line: int) -> None:
    if key == "default_user" and ":" in value:
        raise _Invalid("a user name cannot hold ':' (Shoal's users are NAME:PASSWORD)")
    reader.default_user[key] = (value, line)


def _default_permissions(reader: _Reader, key: str, value: str, line: int) -> None:
    reader.default_permissions[key.removeprefix("default_permissions.")] = (value, line)


def _loopback_users(reader: _Reader, key: str, value: str, line: int) -> None:
    if value != "none":
        raise _Invalid(f"expected none (or loopback_users.NAME = true|false); got {value!r}")
    reader.loopback_none = line


def _log_console(reader: _Reader, key: str, value: str, line: int) -> None:
    reader.console_off = 0 if _boolean(value) else line


def _log_file(reader: _Reader, key: str, value: str, line: int) -> None:
    if value != "false":
        raise _Invalid(_LOG_FILE)


def _verify(value: str) -> bool:
    if value not in ("verify_peer", "verify_none"):
        raise _Invalid(f"expected verify_peer or verify_none; got {value!r}")
    return value == "verify_peer"


# RabbitMQ's ssl_options that `shoal serve --tls-*` takes (the others are refused: NOT_YET).
_SSL_OPTIONS: dict[str, tuple[str, Callable[[str], object]]] = {
    "ssl_options.certfile": ("tls_cert", str),
    "ssl_options.keyfile": ("tls_key", str),
    "ssl_options.cacertfile": ("tls_ca", str),
    "ssl_options.verify": ("tls_verify_peer", _verify),
    "ssl_options.fail_if_no_peer_cert": ("tls_fail_if_no_peer_cert", _boolean),
}


_RULES: dict[str, _Rule] = {
    "listeners.tcp": _refuse("Shoal always has its one AMQP listener (listeners.tcp.default)"),
    "default_user": _default_user,
    "default_pass": _default_user,
    # The vhost a new data directory starts with, in the place of "/" (rabbit.schema).
    "default_vhost": _to("default_vhost", str),
    "default_permissions.configure": _default_permissions,
    "default_permissions.write": _default_permissions,
    "default_permissions.read": _default_permissions,
    "loopback_users": _loopback_users,
    "vm_memory_high_watermark.absolute": _to("memory_high_watermark", _absolute_watermark),
    # Of what: RabbitMQ's is of the machine's memory; Shoal's high watermark is per worker arena,
    # so the fraction is of --arena-mb (the option resolves it once --arena-mb is known).
    "vm_memory_high_watermark.relative": _to("memory_high_watermark", _fraction),
    "vm_memory_high_watermark_paging_ratio": _to("memory_paging_ratio", _ratio),
    "disk_free_limit.absolute": _to("disk_free_limit", _size),
    "disk_free_limit.relative": _refuse("not supported: Shoal's disk alarm takes an absolute "
                                        "size (disk_free_limit.absolute)"),
    "heartbeat": _to("heartbeat", _integer),
    "frame_max": _to("frame_max", _frame_max),
    "channel_max": _to("channel_max", _channel_max),
    "max_message_size": _to("max_message_size", _size),
    "log.console": _log_console,
    "log.console.level": _to("log_level", _log_level),
    "log.file": _log_file,
}
