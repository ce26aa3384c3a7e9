"""The wire format between the trusted parent and the candidate's child process.

Tensors cross as raw bytes in one `.bin` file (a probes job's outputs: in one sealed memfd, `SharedOutputs`) plus
a JSON manifest (dtype, shape, offset, byte count per tensor); other values as tagged JSON. Nothing is ever
unpickled. The parent reads what the child wrote with `read_tensors(..., strict)`: a whitelist of dtypes, shapes of
at most 8 non-negative dims, byte counts equal to numel × element size, every range inside the file, and a cap on
sizes, so a garbage or hostile manifest is a clean `ProtocolError`.
"""

from __future__ import annotations

import fcntl
import json
import math
import mmap
import os
import socket
import time
import weakref
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

#: the most a child may send back (bytes of tensor data, and of JSON)
MAX_DATA_BYTES = 16 << 30
MAX_JSON_BYTES = 64 << 20
MAX_DIMS = 8


class ProtocolError(Exception):
    """The child's reply is malformed: the candidate fails with this message."""


#: every tensor's bytes start at a multiple of this in a .bin file, so the reader can view them in place
ALIGN = 64


class TensorWriter:
    """Appends tensors to one binary file; `ref(t)` returns the index to put in JSON.

    The same tensor object referenced again (a weight shared by many probes) is written once and
    gets the same index: what crosses the boundary is each distinct tensor's bytes, once. Every
    entry starts at a multiple of ALIGN bytes. `tensors[i]` is the object entry i was written from (`keep`; else
    the writer holds none of them, and a tensor is known again only while it lives: the timing child's writer, which
    lives through every cell, kept each cell's sent outputs on the device until its last).
    `nbytes` is the file's size so far; `write_s` the seconds spent copying tensors to the CPU and writing them
    (what sending costs, apart from computing them: the phase tables report it).
    """

    def __init__(self, path: Path | None, fd: int | None = None, keep: bool = True):
        self.path, self.fd, self.keep = path, fd, keep
        # a path: a file of its own; fd: an open file (a memfd, `SharedOutputs`) it writes to and leaves open
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) if path is not None else fd
        self.entries: list[dict] = []
        self.tensors: list[torch.Tensor] = []
        # id -> (index, None where the tensor is kept, else a weak reference that says whether it is still the same)
        self._by_id: dict[int, tuple[int, Any]] = {}
        self._offset = 0
        self.write_s = 0.0

    @property
    def nbytes(self) -> int:
        return self._offset

    def ref(self, t: torch.Tensor) -> int:
        known = self._by_id.get(id(t))
        if known is not None and (known[1] is None or known[1]() is t):
            return known[0]
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"dtype {t.dtype} cannot cross the process boundary")
        t0 = time.monotonic()
        self._offset += -self._offset % ALIGN
        nbytes = t.numel() * t.element_size()
        # the file grows to the entry's end, an empty one's too (its offset must lie inside the file): the gap reads
        # as zeros
        os.ftruncate(self._fd, self._offset + nbytes)
        if nbytes:
            self._put(t.detach(), self._offset, nbytes)
        self.entries.append({"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "offset": self._offset,
                             "nbytes": nbytes})
        self._offset += nbytes
        if self.keep:  # kept alive with the index, so id(t) cannot be reused by another tensor while this writer lives
            self.tensors.append(t)
            self._by_id[id(t)] = (len(self.entries) - 1, None)
        else:  # an id reused by a later tensor finds this reference dead
            self._by_id[id(t)] = (len(self.entries) - 1, weakref.ref(t))
        self.write_s += time.monotonic() - t0
        return len(self.entries) - 1

    def _put(self, t: torch.Tensor, start: int, nbytes: int) -> None:
        """t's bytes at `start`. A CPU tensor's are written from where they are; a device's are copied once, straight
        into the file's pages, mapped for this copy alone, instead of to fresh CPU memory and then into the file (the
        H200: linear's 3 GB of probe outputs sent in 1.0 s instead of 1.15)."""
        if t.device.type != "cpu":
            self._mapped(t, start, nbytes)
            return
        # bytes of the element type, whatever it is (bf16 has no numpy dtype), written without a copy; a write moves
        # at most ~2 GiB at a time
        data, done = memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()), 0
        while done < nbytes:
            done += os.pwrite(self._fd, data[done:], start + done)

    def _mapped(self, t: torch.Tensor, start: int, nbytes: int) -> None:
        """t's bytes copied into the file's pages at `start` (the file already that long), mapped for this copy."""
        base = start - start % mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(self._fd, start + nbytes - base, offset=base)
        try:
            if nbytes >= POPULATE_MIN_BYTES:
                _populate(mm)
            torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=start - base).view(t.dtype).view(
                t.shape).copy_(t)
        finally:
            try:
                mm.close()  # no writable mapping outlives the copy (a shared reply is sealed against writes)
            except BufferError:  # a failed copy's traceback still holds the view: the mapping goes with it
                pass

    def close(self) -> list[dict]:
        t0 = time.monotonic()
        if self.path is not None:
            os.close(self._fd)
        self.write_s += time.monotonic() - t0
        self._by_id.clear()
        return self.entries


#: a device tensor of at least this many bytes is copied into pages faulted in beforehand (`_populate`)
POPULATE_MIN_BYTES = 8 << 20
#: Linux's MADV_POPULATE_WRITE (5.14; Python names it from 3.13 only)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def _populate(mm: mmap.mmap) -> None:
    """The mapping's pages faulted in, writable, in one call, before the copy from the device writes them: the copy
    otherwise takes a page fault every 4 KiB. An H100: linear's 3 GB of outputs sent in 2.6 s before, 1.25 s after
    (results/eval_rate_h100_s36_before.md, eval_rate_h100_s36_linear.md; 1 GiB alone: 0.65x the plain copy,
    results/reply_copy_h100_s36.json). An older kernel refuses the advice, and the copy faults them in as before."""
    try:
        mm.madvise(MADV_POPULATE_WRITE)
    except (OSError, ValueError, AttributeError):
        pass


#: every seal a shared reply must carry: its bytes can no longer change, nor its size
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
#: the first bytes of the one message a child sends on its reply socket, with the memfd
SHARED_TAG = b"tik-outputs"


class SharedOutputs:
    """The child's side of a reply through shared memory: its outputs go into a memfd (anonymous shared memory), which
    is sealed once written (no write, shrink or grow, by anyone, ever again: the kernel's guarantee) and handed to the
    parent over the unix socket the parent listens on in the child's read-only job directory (`receive_shared`). The
    parent maps the sealed bytes instead of reading a copy of a file the live child could still change.

    `open` connects first and returns None where that cannot be done (no socket offered, no memfd here): the caller
    then writes its file as before."""

    def __init__(self, sock: socket.socket, fd: int):
        self.sock, self.fd = sock, fd
        self.writer = TensorWriter(None, fd=fd)

    @classmethod
    def open(cls, socket_path: str | None) -> SharedOutputs | None:
        if not socket_path:
            return None
        sock = dfd = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dfd = os.open(os.path.dirname(socket_path), os.O_RDONLY | os.O_DIRECTORY)
            sock.connect(f"/proc/self/fd/{dfd}/{os.path.basename(socket_path)}")  # a short name, as in listen_shared
            fd = os.memfd_create("tik-outputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (OSError, AttributeError):
            if sock is not None:
                sock.close()
            return None
        finally:
            if dfd is not None:
                os.close(dfd)
        return cls(sock, fd)

    def abandon(self) -> None:
        self.sock.close()
        os.close(self.fd)

    def send(self) -> list[dict]:
        """Close the writer, seal the memfd, hand it over; the manifest."""
        entries = self.writer.close()
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)
        socket.send_fds(self.sock, [SHARED_TAG], [self.fd])
        self.sock.close()
        os.close(self.fd)  # the parent's copy of the descriptor keeps the memory
        return entries


def listen_shared(directory: Path) -> socket.socket | None:
    """A socket `directory/reply.sock` for a child's shared reply (None where it cannot be made). Bound through
    /proc/self/fd, so a deep scratch path does not hit the 108-byte limit of a socket's name; writable by anyone (a
    jailed child runs as another uid), in a directory the child cannot change."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        srv.bind(f"/proc/self/fd/{dfd}/reply.sock")
        os.chmod(directory / "reply.sock", 0o777)
        srv.listen(4)
    except OSError:
        srv.close()
        return None
    finally:
        os.close(dfd)
    srv.setblocking(False)
    return srv


def receive_shared(srv: socket.socket, timeout: float = 5.0) -> Any:
    """The sealed memfd a child handed over on `srv` (`SharedOutputs`), mapped copy-on-write: a buffer of bytes that
    no process can change any more. The first connection only; anything but one fd, tagged, of shared memory carrying
    every seal in SEALS (a file, an unsealed memfd, one still growable) is a ProtocolError."""
    try:
        conn, _ = srv.accept()
    except (BlockingIOError, OSError):
        raise ProtocolError("the child handed over no outputs") from None
    fds: list[int] = []
    try:
        conn.settimeout(timeout)
        try:
            msg, fds, _, _ = socket.recv_fds(conn, len(SHARED_TAG), 4)
        except OSError as e:
            raise ProtocolError(f"the child's outputs could not be received ({type(e).__name__})") from None
        if msg != SHARED_TAG or len(fds) != 1:
            raise ProtocolError("the child's outputs came as something other than one memfd")
        try:
            seals = fcntl.fcntl(fds[0], fcntl.F_GET_SEALS)
        except OSError:
            raise ProtocolError("the child's outputs are not in shared memory") from None
        if seals & SEALS != SEALS:
            raise ProtocolError("the child's outputs are not sealed")
        size = os.fstat(fds[0]).st_size
        if size > MAX_DATA_BYTES:
            raise ProtocolError(f"tensor data of {size} bytes exceeds the limit")
        return mmap.mmap(fds[0], size, access=mmap.ACCESS_COPY) if size else bytearray(0)
    finally:
        conn.close()
        for fd in fds:
            os.close(fd)


def read_tensors(bin_path: Path, entries: Any, mapped: bool = False) -> list[torch.Tensor]:
    """Rebuild tensors from a manifest, validating every field (the manifest may be hostile).

    The file is read once; each tensor whose offset suits its element size is a view of that one
    buffer (no further copy), any other is copied out. Entries may overlap (a hostile manifest):
    the views then share bytes, which no reader here writes to.

    `mapped`: the buffer is a private (copy-on-write) mapping of the file instead of a copy, for a reader whose
    file nobody changes while it is read (the child's inputs, which it cannot write). The parent reads what a
    live child wrote as a copy: a mapping would show whatever the child writes there after the checks."""
    if not isinstance(entries, list):
        raise ProtocolError("tensor manifest is not a list")
    size = bin_path.stat().st_size if bin_path.exists() else 0
    if size > MAX_DATA_BYTES:
        raise ProtocolError(f"tensor data of {size} bytes exceeds the limit")
    data: Any = bytearray(0)
    if size and mapped:
        with open(bin_path, "rb") as f:
            data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    elif size:
        data = bytearray(size)
        with open(bin_path, "rb") as f:
            if f.readinto(data) != size:
                raise ProtocolError("tensor data changed while being read")
    return tensors_from(data, entries)


def tensors_from(data: Any, entries: Any) -> list[torch.Tensor]:
    """`read_tensors` on bytes already in hand (a writable buffer: a bytearray, a copy-on-write mapping)."""
    if not isinstance(entries, list):
        raise ProtocolError("tensor manifest is not a list")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "offset", "nbytes"}:
            raise ProtocolError(f"tensor {i}: malformed manifest entry")
        dtype = DTYPES.get(e["dtype"]) if isinstance(e["dtype"], str) else None
        if dtype is None:
            raise ProtocolError(f"tensor {i}: dtype {str(e['dtype'])[:40]!r} not allowed")
        shape, off, nb = e["shape"], e["offset"], e["nbytes"]
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(type(d) is int and 0 <= d < 2**40 for d in shape)):
            raise ProtocolError(f"tensor {i}: bad shape")
        if type(off) is not int or type(nb) is not int or off < 0 or nb < 0 or off + nb > len(data):
            raise ProtocolError(f"tensor {i}: byte range outside the data file")
        elem = 1 if dtype == torch.bool else torch.empty((), dtype=dtype).element_size()
        if nb != math.prod(shape) * elem:
            raise ProtocolError(f"tensor {i}: {nb} bytes for shape {shape} of {e['dtype']}")
        if not nb:
            t = torch.empty(shape, dtype=torch.uint8 if dtype == torch.bool else dtype)
        elif off % elem == 0:
            t = torch.frombuffer(data, dtype=torch.uint8 if dtype == torch.bool else dtype, count=nb // elem,
                                 offset=off).reshape(shape)
        else:
            t = torch.frombuffer(bytearray(memoryview(data)[off:off + nb]),
                                 dtype=torch.uint8 if dtype == torch.bool else dtype).reshape(shape)
        if dtype == torch.bool:
            if bool((t > 1).any()):
                raise ProtocolError(f"tensor {i}: bool bytes other than 0/1")
            t = t.to(torch.bool)
        out.append(t)
    return out


def encode(v: Any, w: TensorWriter) -> Any:
    """A probe argument as tagged JSON (tensors by reference into the binary file)."""
    if isinstance(v, torch.Tensor):
        return {"t": w.ref(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"v": v}
    if isinstance(v, torch.dtype):
        return {"dtype": DTYPE_NAMES[v]}
    if isinstance(v, tuple):
        return {"tuple": [encode(x, w) for x in v]}
    if isinstance(v, list):
        return {"list": [encode(x, w) for x in v]}
    if isinstance(v, dict):
        return {"dict": {str(k): encode(x, w) for k, x in v.items()}}
    raise TypeError(f"cannot send a {type(v).__name__} to the child")


def decode(v: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of `encode` (run in the child on what the parent wrote)."""
    (tag, x), = v.items()
    if tag == "t":
        return tensors[x]
    if tag == "v":
        return x
    if tag == "dtype":
        return DTYPES[x]
    if tag == "tuple":
        return tuple(decode(y, tensors) for y in x)
    if tag == "list":
        return [decode(y, tensors) for y in x]
    if tag == "dict":
        return {k: decode(y, tensors) for k, y in x.items()}
    raise ValueError(f"unknown tag {tag}")


def write_json(path: Path, doc: Any) -> None:
    """Write atomically: a reader never sees half a document."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    if not path.exists():
        raise ProtocolError("the child wrote no result")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ProtocolError("the child's result is too large")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"the child's result is not JSON ({type(e).__name__})") from None


def tensor_index(x: Any, n: int, what: str) -> int:
    if type(x) is not int or not 0 <= x < n:
        raise ProtocolError(f"{what}: bad tensor reference")
    return x


def index_list(x: Any, n: int, what: str) -> list[int]:
    if not isinstance(x, list) or len(x) > 4096:
        raise ProtocolError(f"{what}: not a list of tensor references")
    return [tensor_index(i, n, what) for i in x]
