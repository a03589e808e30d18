"""Prometheus remote-write, by hand: a WriteRequest protobuf and a Snappy block, no new dependency.

Remote-write 1.0 (what `prometheus --web.enable-remote-write-receiver`, Thanos Receive, Mimir and
VictoriaMetrics accept): POST a Snappy-compressed (block format) protobuf `prometheus.WriteRequest`
with Content-Type application/x-protobuf, Content-Encoding snappy and
X-Prometheus-Remote-Write-Version 0.1.0. The messages used:

    WriteRequest { repeated TimeSeries timeseries = 1; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   // timestamp in ms

The Snappy block written here holds only literals (valid Snappy that any decoder reads, at the
size of the input plus a few bytes): progress batches are small, and compressing them would
need a native library. Labels go out sorted by name, as the receivers require.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import httpx

Sample = tuple[int, float]  # (timestamp ms, value)
Series = tuple[Mapping[str, str], Sequence[Sample]]


class RemoteWriteError(Exception):
    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status  # None: no answer (connect error, timeout)

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status >= 500 or self.status == 429


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 as protobuf encodes it: two's complement in 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


def encode_write_request(series: Sequence[Series]) -> bytes:
    out = bytearray()
    for labels, samples in series:
        ts = bytearray()
        for name in sorted(labels):
            label = _bytes_field(1, name.encode()) + _bytes_field(2, labels[name].encode())
            ts += _bytes_field(1, label)
        for t_ms, value in samples:
            sample = _field(1, 1) + struct.pack("<d", value) + _field(2, 0) + _varint(int(t_ms))
            ts += _bytes_field(2, sample)
        out += _bytes_field(1, bytes(ts))
    return bytes(out)


def snappy_block_literals(data: bytes) -> bytes:
    """A Snappy block (uncompressed length, then elements) made of literal elements only."""
    out = bytearray(_varint(len(data)))
    pos = 0
    while pos < len(data):
        chunk = data[pos:pos + 65536]
        n = len(chunk) - 1
        if n < 60:
            out.append(n << 2)
        elif n < 1 << 8:
            out += bytes([60 << 2, n])
        else:
            out += bytes([61 << 2]) + n.to_bytes(2, "little")
        out += chunk
        pos += len(chunk)
    return bytes(out)


class RemoteWriter:
    def __init__(self, url: str, timeout_s: float = 5.0, headers: Mapping[str, str] | None = None) -> None:
        self.url = url
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s))
        self._headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                         "X-Prometheus-Remote-Write-Version": "0.1.0", **(headers or {})}

    def write(self, series: Sequence[Series]) -> None:
        """Raises RemoteWriteError unless the receiver answered 2xx (then every sample is stored)."""
        body = snappy_block_literals(encode_write_request(series))
        try:
            r = self._client.post(self.url, content=body, headers=self._headers)
        except httpx.HTTPError as e:
            raise RemoteWriteError(None, f"{self.url}: {type(e).__name__}: {e}") from e
        if r.status_code // 100 != 2:
            raise RemoteWriteError(r.status_code, f"{self.url}: HTTP {r.status_code}: {r.text[:300]}")

    def close(self) -> None:
        self._client.close()
