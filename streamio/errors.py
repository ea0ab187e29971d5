"""The one exception tree of streamio.

Every error streamio raises is a :class:`StreamioError` and, where one fits, also the builtin it
refines, so callers can catch either (``except FileNotFoundError`` keeps working)::

    StreamioError
    ├── ConfigError (ValueError)                  an argument or setting given by the caller is invalid
    │   └── ArgumentError (TypeError)                 an unknown keyword, or a deprecated keyword given
    │                                                 together with the one it moved into
    ├── StorageError (OSError)                    bytes could not move to or from storage
    │   ├── ObjectNotFoundError (FileNotFoundError)   missing object or prefix (the bucket exists)
    │   ├── BucketNotFoundError                       the bucket itself does not exist (NOT a
    │   │                                             FileNotFoundError: never "nothing there yet")
    │   ├── StoragePermissionError (PermissionError)  403 / bad credentials: check credentials
    │   ├── TransientStorageError                     5xx / throttling / resets, retries exhausted
    │   │   └── StorageUnreachableError (ConnectionError)  refused / DNS / connect timeout
    │   ├── UnsupportedProtocolError (ValueError)     unknown URL scheme, or its package missing
    │   ├── UnsupportedOperationError (NotImplementedError)  the backend cannot do it (CAS on http)
    │   ├── WriteConflictError (FileExistsError)      a conditional write lost (create-only, CAS)
    │   └── NotRegularFileError                       a local path read as a file is a FIFO, socket,
    │                                                 device or directory: refused, never waited on
    ├── TruncatedBodyError (ConnectionError)      a body ended short: internal, the read resumes
    │                                             (retries exhausted: TransientStorageError)
    ├── BodyStalledError (TimeoutError)           a body missed its deadline (trickled): internal,
    │                                             retried like a timeout (then TransientStorageError)
    ├── CorruptDataError (ValueError)             bytes do not match their recorded size/checksum
    │   └── ObjectTooLargeError                       a document is larger than its kind may be
    ├── DatasetError (ValueError)                 a dataset or its index is unusable
    │   ├── IndexNotFoundError (FileNotFoundError)    no index.json: run `streamio index URL`
    │   ├── IndexFormatError                          unknown version, invalid field
    │   ├── ShardFormatError                          truncated / non-tar shard, unsafe member
    │   ├── MissingMemberError (KeyError)             a sample lacks a member (jpg or png?)
    │   └── SourceError                               `streamio shard` refuses an entry of its source:
    │                                                 a FIFO, device, link leaving it, file over the limit
    ├── PlanError (ValueError)                    impossible topology or resume state
    │   └── StateMismatchError                        state from another dataset/seed/policy
    ├── CacheError (OSError)                      the node-local cache cannot do its job
    │   ├── CacheTooSmallError (ValueError)           limit below what prefetch needs
    │   └── CacheWriteError                           the system refused a cache write (file-size
    │                                                 limit, full disk, read-only, permissions,
    │                                                 directory removed): bypassed or raised
    ├── MissingDependencyError (ImportError)      an optional extra is not installed (the
    │                                             message gives the `pip install` that adds it)
    └── CheckpointError                           a checkpoint cannot be saved or restored
        ├── CheckpointNotFoundError (FileNotFoundError)
        ├── CheckpointFormatError (ValueError)        unknown version, foreign layout
        ├── CheckpointConflictError (FileExistsError) another job writes the same root
        └── SaveTimeoutError (TimeoutError)           a save did not commit within
                                                      ``SaveOptions.save_timeout_s``

Messages are one f-string that names the URL / shard / step at fault and what to do about it.

Why a missing bucket is not a ``FileNotFoundError``: code that treats "not found" as "nothing
there yet" (no checkpoint: start from scratch; no index: build one) must not treat a wrong bucket
name, endpoint or account that way, or the mistake shows only at the first write, hours later.
An object or prefix missing in a bucket that exists stays ``ObjectNotFoundError``.
"""

from __future__ import annotations


class StreamioError(Exception):
    """Base class of every error raised by streamio."""


class ConfigError(StreamioError, ValueError):
    """An argument or setting given by the caller is invalid; the message names it and the valid values."""


class ArgumentError(ConfigError, TypeError):
    """A keyword the callable does not take, or an old (deprecated) keyword given with its new spelling.

    Also a ``TypeError``, what Python raises for a wrong keyword.
    """


class StorageError(StreamioError, OSError):
    """An operation on storage failed; the message names the URL."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object or prefix does not exist (in a bucket that does, where the store has buckets)."""


class BucketNotFoundError(StorageError):
    """The bucket of a URL does not exist (wrong name, endpoint, account or project).

    Deliberately not a ``FileNotFoundError``: see the module docstring.
    """


class StoragePermissionError(StorageError, PermissionError):
    """The store refused access (403, invalid or missing credentials)."""


class TransientStorageError(StorageError):
    """A transient failure (5xx, throttling, reset, truncation) outlasted the retry policy."""


class StorageUnreachableError(TransientStorageError, ConnectionError):
    """The storage endpoint cannot be reached (connection refused, name not resolved, connect
    timeout) through the retry policy; the message names the endpoint."""


class UnsupportedProtocolError(StorageError, ValueError):
    """A URL's protocol is unknown to fsspec, or the package that implements it is not installed."""


class UnsupportedOperationError(StorageError, NotImplementedError):
    """The backend of a URL cannot do what was asked (compare-and-swap on a generic fsspec filesystem)."""


class WriteConflictError(StorageError, FileExistsError):
    """A conditional write failed: the object exists (create-only) or changed (compare-and-swap)."""


class NotRegularFileError(StorageError):
    """A local path read as a file (an object on ``file://``, a source file) is a FIFO, socket,
    device or directory. Refused at once: opening a FIFO for reading waits for a writer for ever,
    and a device may never end."""


class TruncatedBodyError(StreamioError, ConnectionError):
    """A response body ended before the length it announced.

    Transient and internal: the store resumes the read from the last byte received, and maps it
    to :class:`TransientStorageError` once the retry policy is spent. Deliberately not a
    :class:`StorageError`: those are final answers, never retried.
    """


class BodyStalledError(StreamioError, TimeoutError):
    """A response body arrived slower than its deadline allows (see :mod:`streamio.storage.deadline`).

    Transient and internal, like :class:`TruncatedBodyError`: the store retries it, and raises
    :class:`TransientStorageError` naming the stall once the retry policy is spent.
    """


class CorruptDataError(StreamioError, ValueError):
    """Bytes read back do not match the size or checksum recorded for them."""


class ObjectTooLargeError(CorruptDataError):
    """An object read whole (a document: ``index.json``, ``latest.json``, a manifest) is larger
    than the most its kind may be; refused before or while reading, never held whole."""


class DatasetError(StreamioError, ValueError):
    """A dataset or its index cannot be used."""


class IndexNotFoundError(DatasetError, FileNotFoundError):
    """The dataset prefix has no index.json."""


class IndexFormatError(DatasetError):
    """index.json has an unknown version or an invalid field."""


class ShardFormatError(DatasetError):
    """A shard is truncated, not a tar, or holds a member that is unsafe to read."""


class MissingMemberError(DatasetError, KeyError):
    """A sample lacks a member the code asked for (``select``) or its batch's other samples have (collate).

    Also a ``KeyError``, which code that indexed ``sample["jpg"]`` caught before; its message is
    the plain text (``KeyError`` would quote it).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SourceError(DatasetError):
    """A source given to the writer holds what must not be packed: a FIFO, socket or device, a link
    whose target lies outside the source, a file too large for a sample. The CLI exits 2: the fix is
    to change the source (or the option), not the data."""


class PlanError(StreamioError, ValueError):
    """The requested topology or resume state cannot be planned."""


class StateMismatchError(PlanError):
    """A resume state belongs to another dataset, seed or policy."""


class CacheError(StreamioError, OSError):
    """The node-local shard cache cannot do its job."""


class CacheTooSmallError(CacheError, ValueError):
    """The cache limit is below what the prefetch depth needs."""


class CacheWriteError(CacheError):
    """The system refused a write to the cache directory; the message says why and what to do.

    ``CacheConfig(on_error="bypass")`` (the default) reads on without the cache instead of raising it.
    """


class MissingDependencyError(StreamioError, ImportError):
    """An optional extra is not installed (``streamio.ray`` without Ray): the message says what to install."""


class CheckpointError(StreamioError):
    """A checkpoint cannot be saved or restored."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No complete checkpoint exists where one was asked for."""


class CheckpointFormatError(CheckpointError, ValueError):
    """A checkpoint has an unknown format version or was written by another tool."""


class CheckpointConflictError(CheckpointError, FileExistsError):
    """Another job is writing the same checkpoint root."""


class SaveTimeoutError(CheckpointError, TimeoutError):
    """A save did not commit within ``SaveOptions.save_timeout_s``: the message names the ranks and
    the objects they still waited for; the previous checkpoint stays current."""
