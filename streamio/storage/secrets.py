"""What of a :class:`~streamio.storage.store.Store` may leave this process: secrets by default.

A storage option is a **secret unless its key is on a short allow-list** of settings known to
carry no credential (:data:`ALLOWED`: endpoint, region, ``anon``, ``project``, timeouts, ...;
``client_kwargs``, ``config_kwargs`` and ``s3_additional_kwargs`` are judged key by key). Even
an allowed key keeps its value in clear only when the value is plain: a number, or a string with
no URL userinfo in it (``http://user:pass@host`` under ``endpoint_url`` is a secret). ``None`` and
booleans carry nothing and stay clear under any key; ``token`` keeps gcsfs's mode names
(``anon``, ``google_default``, ...) in clear. So a credential under a name nobody listed (an
``Authorization`` header, ``client_kwargs.auth``, an Azure ``connection_string``, a future
option) is protected without anyone having listed it. The price: a setting missing from the
allow-list is also kept back, and a process that did not inherit this one's memory (spawn,
another machine) must get it the same way as credentials.

Where secrets go: :func:`seal` swaps each one for a :class:`SecretRef` (a random id) into this
process's vault; a pickled Store carries the refs. A forked child (the DataLoader default on
Linux) resolves them with :func:`unseal`; any other process gets the ref back and the Store
raises a clear error at first use (:func:`missing` names the options).

URLs: :func:`strip_userinfo` turns ``scheme://user:pass@host/...`` into ``scheme://***@host/...``
for every URL a Store shows (repr, messages, logs); the full URL is itself a vaulted secret.
:func:`scrub` does the same to free text (third-party exception messages quoted in our errors
and log lines) and also blanks every secret string this process holds; :func:`guard_library_logs` applies it
to the log records of botocore, s3fs, gcsfs and fsspec, which print tokens and URLs at DEBUG.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import traceback
import uuid
from collections.abc import Mapping
from typing import Any

#: option keys whose plain values are not credentials; a nested dict is judged key by key there
ALLOWED: dict[str, Any] = {
    **dict.fromkeys(
        (
            # where and how to connect
            "endpoint_url", "region", "region_name", "use_ssl", "anon", "requester_pays", "project", "profile",
            "account_name", "default_location", "access", "consistency", "version_aware",
            # caching, sizes, timeouts and concurrency (fsspec, s3fs, gcsfs)
            "default_block_size", "default_fill_cache", "default_cache_type", "block_size", "cache_regions",
            "use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache", "cache_timeout",
            "max_concurrency", "fixed_upload_size", "timeout", "requests_timeout", "connect_timeout",
            "read_timeout", "auto_mkdir",
        ),
        True,
    ),
    "client_kwargs": dict.fromkeys(("region_name", "endpoint_url", "verify", "use_ssl", "api_version"), True),
    "config_kwargs": dict.fromkeys(
        (
            "signature_version", "connect_timeout", "read_timeout", "max_pool_connections", "retries", "s3",
            "region_name", "response_checksum_validation", "request_checksum_calculation", "parameter_validation",
            "tcp_keepalive",
        ),
        True,
    ),
    "s3_additional_kwargs": dict.fromkeys(("ACL", "RequestPayer", "ServerSideEncryption", "StorageClass"), True),
}
#: gcsfs ``token`` values that name a mode, not a credential
NOT_SECRET_TOKENS = frozenset({"anon", "google_default", "cache", "cloud", "browser"})

_USERINFO = re.compile(r"://([^/\s@'\"<>]*)@")  # see has_userinfo: linear on any text
#: names under which the storage clients print credentials (headers, query parameters, STS XML
#: elements, OAuth JSON fields), then the separator, then the value (see redact_credentials)
_CREDENTIAL_NAMES = (
    "x-amz-security-token", "x-amz-credential", "authorization", "proxy-authorization",
    "x-goog-iam-authorization-token", "secretaccesskey", "sessiontoken", "aws_secret_access_key",
    "aws_session_token", "access_token", "refresh_token", "id_token", "client_secret", "private_key", "password",
)
_CREDENTIAL = re.compile(
    rf"({'|'.join(_CREDENTIAL_NAMES)})"
    r"((?:['\"]?\s*[:=>]\s*(?:b?['\"])?)|(?:['\"]?\s*,\s*b?['\"]))"
    r"(?:[^'\"\n<&,}]+)",
    re.IGNORECASE,
)
#: environment variable names that hold a credential
_SECRET_ENV = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY|API_KEY|SAS_|_KEY$")
_MIN_SECRET = 6  # shorter strings are not blanked out of free text (they would mangle it)

_LOCK = threading.Lock()
_VAULT: dict[str, Any] = {}
_REFS: dict[Any, str] = {}  # fingerprint of a vaulted value -> its ref (one entry per distinct secret)
_STRINGS: set[str] = set()  # what scrub() blanks


class SecretRef:
    """A secret left behind in the sealing process; pickles as its random id only."""

    __slots__ = ("ref",)

    def __init__(self, ref: str) -> None:
        self.ref = ref

    def __reduce__(self) -> tuple[Any, ...]:
        return (SecretRef, (self.ref,))

    def __repr__(self) -> str:
        return "<secret>"


def has_userinfo(text: str) -> bool:
    """Whether ``text`` holds a URL with ``user[:password]@`` in it.

    A userinfo is what follows a ``://`` up to an ``@``, holding no ``/``, whitespace, quotes or
    ``<>``; the scheme before the ``://`` is not looked at (masking a non-URL is harmless). Every
    scan of it is linear in ``len(text)`` whatever the text, and it runs on third-party error
    bodies of any size: a match can start only at a ``://``, and its one character class stops at
    the ``/`` of the next one, so no character is scanned twice. (The pattern before, a scheme
    ``[A-Za-z][A-Za-z0-9+.-]*://`` tried at every letter of a long run, backtracked
    quadratically: 1 MiB of letters took minutes.)
    """
    return _USERINFO.search(text) is not None


def strip_userinfo(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced by ``***``."""
    return _USERINFO.sub("://***@", text)


def redact_credentials(text: str) -> str:
    """``text`` with the value of every credential-carrying header, query parameter, XML element or
    JSON field blanked (``X-Amz-Security-Token: ***``), whatever the credential's source.

    Credentials from the environment, a profile, an instance role or an STS / OAuth exchange are
    never handed to streamio, so :func:`scrub` cannot know their values; the clients' DEBUG logs
    print them under these names (botocore's request dump and canonical request, STS responses,
    OAuth token responses). Linear in ``len(text)``: one alternation of literal names, then one
    character class for the value.
    """
    low = text.lower()
    if not any(name in low for name in _CREDENTIAL_NAMES):  # most text: a few C substring searches
        return text
    return _CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)


def environment_secrets() -> list[str]:
    """The values of this process's environment variables whose names say they hold a credential
    (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``HF_TOKEN``, ``*_PASSWORD``, ...), read now."""
    return [v for k, v in os.environ.items() if len(v) >= _MIN_SECRET and _SECRET_ENV.search(k)]


def scrub(text: str) -> str:
    """``text`` without URL userinfo, credential headers and fields (:func:`redact_credentials`),
    any secret this process holds or any credential in its environment (for messages and logs)."""
    text = redact_credentials(strip_userinfo(text))
    with _LOCK:
        found = [s for s in _STRINGS if s in text]
    found += [s for s in environment_secrets() if s in text]
    for s in sorted(found, key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def leaks(text: str) -> bool:
    """Whether ``text`` shows a URL userinfo or a secret this process holds."""
    return scrub(text) != text


def seal(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with every secret (see the module docstring) replaced by a :class:`SecretRef`."""
    return {k: _seal(k, v, ALLOWED) for k, v in options.items()}


def seal_value(value: Any) -> SecretRef:
    """Put one secret in the vault (the same value always gets the same ref in a process)."""
    if isinstance(value, SecretRef):
        return value
    key = _fingerprint(value)
    with _LOCK:
        ref = _REFS.get(key)
        if ref is None:
            ref = uuid.uuid4().hex
            _VAULT[ref] = value
            _REFS[key] = ref
            _STRINGS.update(s for s in _strings_of(value) if len(s) >= _MIN_SECRET)
        return SecretRef(ref)


def unseal(obj: Any) -> Any:
    """``obj`` with every :class:`SecretRef` this process holds resolved (others stay refs)."""
    if isinstance(obj, Mapping):
        return {k: unseal(v) for k, v in obj.items()}
    if isinstance(obj, SecretRef):
        with _LOCK:
            return _VAULT.get(obj.ref, obj)
    return obj


def missing(obj: Any, prefix: str = "") -> list[str]:
    """Dotted names of the options in ``obj`` that are still unresolved refs."""
    out: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if isinstance(v, SecretRef):
                out.append(f"{prefix}{k}")
            else:
                out.extend(missing(v, f"{prefix}{k}."))
    return out


def _seal(key: Any, value: Any, allowed: Mapping[str, Any]) -> Any:
    if value is None or isinstance(value, (bool, SecretRef)):
        return value
    rule = allowed.get(key) if isinstance(key, str) else None
    if isinstance(rule, Mapping) and isinstance(value, Mapping):
        return {k: _seal(k, v, rule) for k, v in value.items()}
    if rule is True and _plain(value):
        return value
    if key == "token" and isinstance(value, str) and value in NOT_SECRET_TOKENS:
        return value
    return seal_value(value)


def _plain(value: Any) -> bool:
    """A value that cannot hide a credential: numbers, strings without userinfo, containers of them."""
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return not has_userinfo(value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return False


def _fingerprint(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return (type(value), repr(value))
    return (type(value), value)


def _strings_of(value: Any, depth: int = 0) -> set[str]:
    """The strings inside a secret, and the pieces of them that could be quoted alone: the
    token of ``Bearer <token>``, ``AccountKey=<key>`` of a connection string, the password of a
    URL's userinfo."""
    out: set[str] = set()
    if depth > 8:
        return out
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        out.add(value)
        out.update(p for p in re.split(r"[\s;,=&]+", value) if len(p) >= 8)
        for match in _USERINFO.finditer(value):
            out.update(p for p in match.group(1).split(":") if p)
    elif isinstance(value, Mapping):
        for v in value.values():
            out |= _strings_of(v, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):  # tuples include (user, password) and BasicAuth
        for v in value:
            out |= _strings_of(v, depth + 1)
    return out  # other objects (a session, a credentials provider) are vaulted but not searched for


class _ScrubFilter(logging.Filter):
    """Rewrites a record whose text would show a secret (see :func:`guard_library_logs`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        clean = scrub(text)
        if clean != text:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            # botocore logs failed requests with their traceback, whose messages quote the URL
            trace = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            clean = scrub(trace)
            if clean != trace:
                record.exc_text = clean  # what logging.Formatter prints instead of formatting exc_info
        return True


#: the storage stack's loggers, some seen printing secrets at DEBUG (measured: botocore.endpoint
#: dumps headers with the session token and key id, botocore.regions the endpoint URL with its
#: userinfo, fsspec's HTTP filesystem every URL with its userinfo)
LIBRARY_LOGGERS = ("botocore", "aiobotocore", "s3fs", "gcsfs", "fsspec", "urllib3", "aiohttp", "google")
_KNOWN = (
    "botocore.endpoint", "botocore.regions", "botocore.auth", "botocore.httpsession", "botocore.parsers",
    "botocore.hooks", "botocore.credentials", "aiobotocore.endpoint", "aiobotocore.httpsession", "s3fs",
    "gcsfs", "gcsfs.credentials", "fsspec", "fsspec.http", "urllib3.connectionpool",
)
_FILTER = _ScrubFilter()
_GUARDED = -1  # how many loggers existed at the last sweep


def guard_handlers(logger: logging.Logger | None = None) -> None:
    """Scrub every record that reaches the handlers of ``logger`` (default: the root logger's),
    whichever logger made it: what a program that configures its own logging (the ``streamio``
    command, the trainer) calls once after ``logging.basicConfig``. Idempotent."""
    for handler in (logger or logging.getLogger()).handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)


def guard_library_logs() -> None:
    """Scrub secrets out of the storage libraries' own log records (idempotent, cheap).

    A logger's filters see only the records logged on that logger itself, so every logger under
    :data:`LIBRARY_LOGGERS` that exists now gets the filter (plus the ones known to leak, created
    if need be); the Store calls this again once its filesystem exists, when the libraries'
    modules are imported. Costs nothing while those loggers are off (below DEBUG).
    """
    global _GUARDED
    loggers = logging.root.manager.loggerDict
    count = len(loggers)
    if count == _GUARDED:  # no logger was made since the last sweep
        return
    names = [n for n in list(loggers) if n.split(".", 1)[0] in LIBRARY_LOGGERS]
    for name in (*_KNOWN, *names):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    _GUARDED = count  # loggers made during the sweep are swept next time
