"""Batches of UDP datagrams read and written with one system call (``recvmmsg``/``sendmmsg``).

A ``Batch`` owns preallocated memory for ``size`` datagrams: the payload slots, one
``sockaddr_in`` per datagram, the ``iovec`` and ``mmsghdr`` arrays the kernel reads. It is
all NumPy arrays over that memory, so the relay's per-batch work (who sent what, where it
goes, header bytes, lengths) is a handful of vector operations, and no Python object is
made per datagram. Linux on a 64-bit machine (the layouts below are its ABI); IPv4.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket

import numpy as np
import numpy.typing as npt

MSG_DONTWAIT = 0x40
# struct mmsghdr on LP64: msghdr (56 bytes) + msg_len (4) + padding (4).
_MMSGHDR_BYTES = 64
# In 8-byte words: msg_name, msg_namelen, msg_iov, msg_iovlen; msg_len is the 15th 4-byte word.
_NAME, _NAMELEN32, _IOV, _IOVLEN, _MSGLEN32 = 0, 2, 2, 3, 14
_SOCKADDR_IN_BYTES = 16

_libc = ctypes.CDLL(None, use_errno=True)
_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int
_sendmmsg = _libc.sendmmsg
_sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
_sendmmsg.restype = ctypes.c_int

U8 = npt.NDArray[np.uint8]
U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]


def sockaddr_key(address: tuple[str, int]) -> int:
    """The first 8 bytes of ``address``'s ``sockaddr_in`` as the relay's tables key it
    (family, port, IPv4 address; read as a little-endian unsigned integer)."""
    packed = (
        socket.AF_INET.to_bytes(2, "little")
        + address[1].to_bytes(2, "big")
        + socket.inet_aton(address[0])
    )
    return int.from_bytes(packed, "little")


def key_address(key: int) -> tuple[str, int]:
    """The address ``sockaddr_key`` made ``key`` from."""
    packed = int(key).to_bytes(8, "little")
    return socket.inet_ntoa(packed[4:8]), int.from_bytes(packed[2:4], "big")


class Batch:
    """Room for ``size`` datagrams of up to ``slot - headroom`` bytes each.

    A received datagram ``i`` lands at ``data[i, headroom:]``, its sender in ``names[i]``;
    ``headroom`` bytes before it are free for a header written in place.
    """

    def __init__(self, size: int, slot: int = 2048, headroom: int = 0) -> None:
        self.size = size
        self.headroom = headroom
        self.data: U8 = np.zeros((size, slot), np.uint8)
        self.names: U8 = np.zeros((size, _SOCKADDR_IN_BYTES), np.uint8)
        # The first 8 bytes of every name (family, port, address) as one integer.
        self.keys: U64 = self.names.view(np.uint64)[:, 0]
        self.iov: U64 = np.zeros((size, 2), np.uint64)
        self.headers: U64 = np.zeros((size, _MMSGHDR_BYTES // 8), np.uint64)
        self._headers32: U32 = self.headers.view(np.uint32)
        self.lengths: U32 = self._headers32[:, _MSGLEN32]
        self.data_addresses: U64 = np.uint64(self.data.ctypes.data) + np.arange(
            size, dtype=np.uint64
        ) * np.uint64(slot)
        self.name_addresses: U64 = np.uint64(self.names.ctypes.data) + np.arange(
            size, dtype=np.uint64
        ) * np.uint64(_SOCKADDR_IN_BYTES)
        self.headers[:, _IOV] = np.uint64(self.iov.ctypes.data) + np.arange(
            size, dtype=np.uint64
        ) * np.uint64(16)
        self.headers[:, _IOVLEN] = 1
        self.slot = slot
        self._address = self.headers.ctypes.data
        # The same memory as Python buffers, for batches too small to be worth NumPy's
        # per-call cost: indexing a memoryview is a fraction of a microsecond.
        self.data_view = self.data.data.cast("B")
        self.names_view = self.names.data.cast("B")
        self.keys_view = self.names.data.cast("B").cast("Q")
        self.headers_view = self.headers.data.cast("B").cast("Q")
        self.headers32_view = self.headers.data.cast("B").cast("I")
        self.iov_view = self.iov.data.cast("B").cast("Q")
        self.base = int(self.data.ctypes.data)

    # ------------------------------------------------------------------ receiving

    def receive(self, fd: int) -> int:
        """Read up to ``size`` waiting datagrams from ``fd`` without blocking; how many."""
        self.headers[:, _NAME] = self.name_addresses
        self._headers32[:, _NAMELEN32] = _SOCKADDR_IN_BYTES
        self.iov[:, 0] = self.data_addresses + np.uint64(self.headroom)
        self.iov[:, 1] = self.slot - self.headroom
        count: int = _recvmmsg(fd, self._address, self.size, MSG_DONTWAIT, None)
        if count < 0:
            code = ctypes.get_errno()
            if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return 0
            raise OSError(code, os.strerror(code))
        return count

    # ------------------------------------------------------------------ sending

    def prepare(self, count: int, names: U64, data: U64, lengths: npt.NDArray[np.integer]) -> None:
        """Describe ``count`` datagrams to send: where each goes (pointers to ``sockaddr_in``),
        where its bytes are, and how many."""
        self.headers[:count, _NAME] = names
        self._headers32[:count, _NAMELEN32] = _SOCKADDR_IN_BYTES
        self.iov[:count, 0] = data
        self.iov[:count, 1] = lengths

    def prepare_one(self, index: int, name: int, data: int, length: int) -> None:
        """``prepare`` for the datagram at ``index`` alone, without NumPy."""
        self.headers_view[index * 8 + _NAME] = name
        self.headers32_view[index * 16 + _NAMELEN32] = _SOCKADDR_IN_BYTES
        self.iov_view[index * 2] = data
        self.iov_view[index * 2 + 1] = length

    def length(self, index: int) -> int:
        """The length of received datagram ``index``, without NumPy."""
        length: int = self.headers32_view[index * 16 + _MSGLEN32]
        return length

    def send(self, fd: int, count: int) -> int:
        """Send the first ``count`` prepared datagrams; how many could not be sent.

        A datagram the kernel refuses (no route, say) is skipped; a full send buffer drops
        the rest of the batch rather than stalling every other flow.
        """
        sent = 0
        failed = 0
        while sent + failed < count:
            start = sent + failed
            done: int = _sendmmsg(
                fd, self._address + start * _MMSGHDR_BYTES, count - start, MSG_DONTWAIT
            )
            if done > 0:
                sent += done
                continue
            code = ctypes.get_errno()
            if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                return count - sent
            failed += 1
        return failed
