"""Silero VAD v5 as a handful of matrix products over the whole batch (numpy, no ONNX Runtime).

ONNX Runtime runs the model's 1-D convolutions one batch row at a time: each row's STFT is a
``[258, 256] x [256, 4]`` product, far too thin for a fast GEMM, so a batch of 64 chunks
costs about 60 µs a row whatever its size. Laid out time-major instead, a batch's four STFT
frames are one ``[4B, 256] x [256, 258]`` product, every encoder convolution one product per
output frame over its ``kernel x channels`` columns, and the LSTM cell one more: OpenBLAS runs
those near its peak, and a row costs under half as much.

The weights are read from the same ``silero_vad.onnx`` file ONNX Runtime loads (its
``Constant`` nodes, one set per sample rate), with a small reader of ONNX's protobuf
encoding. The graph it computes, for either rate (``n`` = 256 at 16 kHz, 128 at 8 kHz):

1. pad each ``[context + chunk]`` window on the right by ``n / 4`` samples, mirrored;
2. STFT: frames of ``n`` samples every ``n / 2``, times the model's basis (real and
   imaginary parts of ``n / 2 + 1`` bins), magnitude; the basis is a DFT under a Hann
   window, so this is a real FFT of the windowed frames;
3. four convolutions of width 3 (strides 1, 2, 2, 1), each followed by ReLU;
4. an LSTM cell (PyTorch's gate order: input, forget, cell, output) on the one remaining
   frame, seeded with the row's state ``[h, c]``;
5. ReLU, a 1x1 convolution to one channel, sigmoid: the speech probability.

``tests/engines/test_silero_gemm.py`` checks it against ONNX Runtime on real speech.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hark.engines.vad.silero import STATE_SIZE

_WEIGHTS = (
    "stft.forward_basis_buffer",
    "encoder.0.reparam_conv.weight",
    "encoder.0.reparam_conv.bias",
    "encoder.1.reparam_conv.weight",
    "encoder.1.reparam_conv.bias",
    "encoder.2.reparam_conv.weight",
    "encoder.2.reparam_conv.bias",
    "encoder.3.reparam_conv.weight",
    "encoder.3.reparam_conv.bias",
    "decoder.rnn.weight_ih",
    "decoder.rnn.weight_hh",
    "decoder.rnn.bias_ih",
    "decoder.rnn.bias_hh",
    "decoder.decoder.2.weight",
    "decoder.decoder.2.bias",
)
# The top-level If picks the 16 kHz graph in its then-branch and the 8 kHz one in its else.
_BRANCH = {16000: "then_branch", 8000: "else_branch"}


class SileroFormatError(ValueError):
    """The ONNX file is not the Silero VAD v5 graph this module knows."""


@dataclass(frozen=True, eq=False)
class _Conv:
    """A width-3 convolution as one product per output frame: ``[rows, 3 * c_in] @ weight``."""

    weight: npt.NDArray[np.float32]  # [3 * c_in, c_out], tap-major
    bias: npt.NDArray[np.float32]
    stride: int

    @classmethod
    def of(
        cls, weight: npt.NDArray[np.float32], bias: npt.NDArray[np.float32], stride: int
    ) -> _Conv:
        c_out, c_in, width = weight.shape
        if width != 3:
            raise SileroFormatError(f"expected width-3 convolutions, got {weight.shape}")
        columns = np.ascontiguousarray(weight.transpose(2, 1, 0).reshape(3 * c_in, c_out))
        return cls(columns, bias.astype(np.float32), stride)

    def __call__(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``x`` is ``[rows, frames, c_in]``; returns ``[rows, frames', c_out]`` after ReLU."""
        rows, frames, channels = x.shape
        out_frames = (frames - 1) // self.stride + 1
        # A row's frames side by side: the three that output frame t sees (stride * t - 1 to
        # stride * t + 1) are then one run of columns, read in place, and the taps that fall
        # on the zero padding past either end are left out with their rows of the weights. One
        # product per output frame beats copying the taps into a padded [frames', 3 * c_in]
        # matrix first: no copy, and a sixth fewer multiplications at 4 frames.
        flat = x.reshape(rows, frames * channels)
        y = np.empty((rows, out_frames, self.weight.shape[1]), dtype=np.float32)
        for t in range(out_frames):
            first = self.stride * t - 1  # the frame under tap 0, -1 for the padding
            start, stop = max(first, 0), min(first + 3, frames)
            taps = self.weight[(start - first) * channels : (stop - first) * channels]
            np.matmul(flat[:, start * channels : stop * channels], taps, out=y[:, t])
        y += self.bias
        np.maximum(y, 0, out=y)
        return y


class SileroGemm:
    """The model at one sample rate: ``run`` takes windows and states, as ONNX Runtime does."""

    def __init__(self, constants: dict[str, npt.NDArray[np.float32]], rate: int) -> None:
        basis = constants["stft.forward_basis_buffer"]  # [2 * bins, 1, n]
        self.rate = rate
        self.frame = basis.shape[2]
        self.hop = self.frame // 2
        self.pad = self.frame // 4
        self.bins = basis.shape[0] // 2
        self._basis = np.ascontiguousarray(basis[:, 0, :].T)  # [n, 2 * bins]
        # Silero's basis is a DFT under a periodic Hann window: then a real FFT of the windowed
        # frames gives the same spectrum at about half the cost of the product.
        self._window = _dft_window(self._basis)
        self._scratch = threading.local()
        self._encoder = [
            _Conv.of(
                constants[f"encoder.{i}.reparam_conv.weight"],
                constants[f"encoder.{i}.reparam_conv.bias"],
                stride,
            )
            for i, stride in enumerate((1, 2, 2, 1))
        ]
        if self._encoder[0].weight.shape[0] != 3 * self.bins:
            raise SileroFormatError("the first convolution does not take the STFT's bins")
        weight_ih = constants["decoder.rnn.weight_ih"]
        weight_hh = constants["decoder.rnn.weight_hh"]
        if weight_ih.shape != (4 * STATE_SIZE, STATE_SIZE) or weight_hh.shape != weight_ih.shape:
            raise SileroFormatError(f"unexpected LSTM weights {weight_ih.shape}")
        # [x, h] @ cell: one product for all four gates, reordered from PyTorch's (input,
        # forget, cell, output) to (input, forget, output, cell) so that the three sigmoid
        # gates are one slice.
        order = np.concatenate(
            [np.arange(k * STATE_SIZE, (k + 1) * STATE_SIZE) for k in (0, 1, 3, 2)]
        )
        cell = np.concatenate((weight_ih, weight_hh), axis=1)[order]
        # Scaled so that the product is the argument of exp in `run`: -x for the sigmoid
        # gates, -2x for the cell gate (tanh(x) = 2 * sigmoid(2x) - 1). Exact: powers of two.
        scale = np.repeat(np.array([-1, -1, -1, -2], dtype=np.float32), STATE_SIZE)
        self._cell = np.ascontiguousarray(cell.T * scale, dtype=np.float32)
        bias = constants["decoder.rnn.bias_ih"] + constants["decoder.rnn.bias_hh"]
        self._cell_bias = (bias[order] * scale).astype(np.float32)
        self._out = constants["decoder.decoder.2.weight"].reshape(STATE_SIZE).astype(np.float32)
        self._out_bias = float(constants["decoder.decoder.2.bias"].reshape(1)[0])

    def _fft_scratch(
        self, frames: int
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.complex128]]:
        """This thread's buffers for ``frames`` windowed frames and their spectra, in double
        precision: numpy's (2.4) single-precision real FFT costs four to six times as much a
        frame once a call has more than about 128 frames (a batch of 32 rows), while the
        double-precision one stays under a microsecond a frame.

        Kept between batches: fresh ones every batch (about 200 KB each at 50 rows) are memory
        that glibc hands back to the system and faults in again, which cost the batcher's
        thread more in the kernel than the FFT saves.
        """
        scratch = self._scratch
        held = getattr(scratch, "windowed", None)
        if held is None or len(held) < frames:
            capacity = max(frames, 2 * len(held) if held is not None else 0)
            scratch.windowed = np.empty((capacity, self.frame), np.float64)
            scratch.spectrum = np.empty((capacity, self.bins), np.complex128)
        return scratch.windowed[:frames], scratch.spectrum[:frames]

    @property
    def window(self) -> int:
        """Samples per row: the context and the chunk (576 at 16 kHz, 288 at 8 kHz)."""
        return self.frame * 2 + self.frame // 4

    def run(
        self, windows: npt.NDArray[np.float32], states: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Probabilities ``[B]`` and next states ``[2, B, 128]`` for ``windows`` ``[B, window]``
        and ``states`` ``[2, B, 128]``. Blocking; safe from any thread (scratch is per thread)."""
        return self.step(self.encode(windows), states)

    def encode(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Steps 1 to 3 for ``windows`` ``[B, window]``: the LSTM's input ``[B, 128]``, which
        depends on no state, so that one call may hold several chunks of one stream."""
        rows = windows.shape[0]
        if windows.shape != (rows, self.window):
            raise ValueError(f"expected windows [B, {self.window}], got {windows.shape}")
        hop, pad = self.hop, self.pad
        # Mirror padding on the right (the last sample is not repeated).
        padded = np.empty((rows, self.window + pad), dtype=np.float32)
        padded[:, : self.window] = windows
        padded[:, self.window :] = windows[:, -2 : -pad - 2 : -1]
        # Frames of `frame` samples every `hop`: pairs of consecutive hop-sized blocks.
        blocks = padded.reshape(rows, -1, hop)
        frames = np.concatenate((blocks[:, :-1], blocks[:, 1:]), axis=2)
        count = frames.shape[1]
        frames = frames.reshape(rows * count, self.frame)
        if self._window is not None:
            windowed, bins = self._fft_scratch(rows * count)
            np.multiply(frames, self._window, out=windowed)
            np.fft.rfft(windowed, axis=1, out=bins)
            magnitude = np.abs(bins).astype(np.float32)
        else:
            spectrum = frames @ self._basis
            real, imag = spectrum[:, : self.bins], spectrum[:, self.bins :]
            magnitude = np.sqrt(real * real + imag * imag)
        magnitude = magnitude.reshape(rows, count, self.bins)
        x = magnitude
        for conv in self._encoder:
            x = conv(x)
        if x.shape[1] != 1:
            raise SileroFormatError(f"the encoder left {x.shape[1]} frames, not 1")
        return x[:, 0]

    def step(
        self, features: npt.NDArray[np.float32], states: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Steps 4 and 5: probabilities ``[B]`` and next states ``[2, B, 128]`` for the encoded
        ``features`` ``[B, 128]`` and ``states`` ``[2, B, 128]``."""
        rows = features.shape[0]
        if states.shape != (2, rows, STATE_SIZE):
            raise ValueError(f"expected states [2, {rows}, {STATE_SIZE}], got {states.shape}")
        h, c = states[0], states[1]
        gates = np.concatenate((features, h), axis=1) @ self._cell
        gates += self._cell_bias
        size = STATE_SIZE
        next_states = np.empty((2, rows, size), dtype=np.float32)
        h_next, c_next = next_states[0], next_states[1]
        # Sigmoid and tanh through exp, which numpy computes in about half the time of tanh.
        # exp overflows to inf for large arguments, and the results are then the right limits
        # (1 / inf = 0): the warning is noise.
        with np.errstate(over="ignore"):
            _reciprocal_one_plus_exp_(gates)
            i, f, o, g = (gates[:, k * size : (k + 1) * size] for k in range(4))
            g *= 2  # the cell gate: tanh(x) = 2 * sigmoid(2x) - 1
            g -= 1
            np.multiply(f, c, out=c_next)
            i *= g
            c_next += i
            # h = o * tanh(c), with tanh(c) = 2 / (1 + exp(-2c)) - 1.
            np.multiply(c_next, -2, out=h_next)
            _reciprocal_one_plus_exp_(h_next)
            h_next *= 2
            h_next -= 1
            h_next *= o
        logits = np.maximum(h_next, 0) @ self._out
        logits += self._out_bias
        return _sigmoid_(logits), next_states


def load(path: str | Path) -> dict[int, SileroGemm]:
    """Both rates' models from the Silero ONNX file at ``path``."""
    constants = read_constants(Path(path).read_bytes())
    models = {}
    for rate, branch in _BRANCH.items():
        prefix = f"If_0_{branch}__Inline_0__"
        try:
            weights = {name: constants[prefix + name] for name in _WEIGHTS}
        except KeyError as exc:
            raise SileroFormatError(f"no constant {exc} in the Silero model") from None
        models[rate] = SileroGemm(weights, rate)
    return models


def _dft_window(basis: npt.NDArray[np.float32]) -> npt.NDArray[np.float32] | None:
    """The periodic Hann window if ``basis`` (``[n, 2 * bins]``: real parts, then imaginary)
    is the DFT of Hann-windowed frames, else None."""
    n = basis.shape[0]
    bins = n // 2 + 1
    if basis.shape[1] != 2 * bins:
        return None
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
    angle = 2 * np.pi * np.outer(np.arange(n), np.arange(bins)) / n
    expected = np.concatenate((np.cos(angle), -np.sin(angle)), axis=1) * window[:, None]
    if np.abs(basis - expected).max() > 1e-5:
        return None
    return window.astype(np.float32)


def _reciprocal_one_plus_exp_(x: npt.NDArray[np.float32]) -> None:
    """``1 / (1 + exp(x))``, in place: the logistic function of ``-x``."""
    np.exp(x, out=x)
    x += 1
    np.reciprocal(x, out=x)


def _sigmoid_(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The logistic function, in place: (1 + tanh(x / 2)) / 2 never overflows."""
    x *= 0.5
    np.tanh(x, out=x)
    x += 1
    x *= 0.5
    return x


# ----------------------------------------------------------------------- ONNX's protobuf

# Field numbers of the few ONNX messages read here (onnx.proto3).
_MODEL_GRAPH = 7
_GRAPH_NODE = 1
_NODE_OUTPUT, _NODE_OP_TYPE, _NODE_ATTRIBUTE = 2, 4, 5
_ATTR_NAME, _ATTR_T, _ATTR_G = 1, 5, 6
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_FLOAT_DATA, _TENSOR_RAW_DATA = 1, 2, 4, 9
_FLOAT = 1


def read_constants(model: bytes) -> dict[str, npt.NDArray[np.float32]]:
    """Every float ``Constant`` node of an ONNX model, subgraphs included, by output name."""
    graphs = _fields(model).get(_MODEL_GRAPH)
    if not graphs:
        raise SileroFormatError("not an ONNX model: no graph")
    found: dict[str, npt.NDArray[np.float32]] = {}
    pending = [graphs[0]]
    while pending:
        graph = pending.pop()
        for node_bytes in _fields(graph).get(_GRAPH_NODE, []):
            node = _fields(node_bytes)
            op_type = bytes(node.get(_NODE_OP_TYPE, [b""])[0])
            for attribute_bytes in node.get(_NODE_ATTRIBUTE, []):
                attribute = _fields(attribute_bytes)
                pending.extend(attribute.get(_ATTR_G, []))
                if op_type == b"Constant" and _ATTR_T in attribute:
                    tensor = _float_tensor(attribute[_ATTR_T][0])
                    if tensor is not None:
                        found[bytes(node[_NODE_OUTPUT][0]).decode()] = tensor
    return found


def _float_tensor(data: memoryview) -> npt.NDArray[np.float32] | None:
    tensor = _fields(data)
    if _varint_value(tensor.get(_TENSOR_DATA_TYPE, [0])[0]) != _FLOAT:
        return None
    dims: list[int] = []
    for value in tensor.get(_TENSOR_DIMS, []):
        if isinstance(value, int):
            dims.append(value)
        else:  # packed
            dims.extend(_varints(value))
    if _TENSOR_RAW_DATA in tensor:
        array = np.frombuffer(tensor[_TENSOR_RAW_DATA][0], dtype="<f4")
    else:
        packed = b"".join(
            bytes(v) for v in tensor.get(_TENSOR_FLOAT_DATA, []) if not isinstance(v, int)
        )
        array = np.frombuffer(packed, dtype="<f4")
    if array.size != int(np.prod(dims, dtype=np.int64)):
        raise SileroFormatError(f"a constant of shape {dims} holds {array.size} values")
    return array.astype(np.float32).reshape(dims)


def _varint_value(value: int | memoryview) -> int:
    if isinstance(value, int):
        return value
    raise SileroFormatError("expected a number, found bytes")


def _fields(data: bytes | memoryview) -> dict[int, list[Any]]:
    """A protobuf message's fields: varints as ints, length-delimited as memoryviews."""
    view = memoryview(data)
    fields: dict[int, list[Any]] = {}
    position, end = 0, len(view)
    while position < end:
        key, position = _varint(view, position)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == 0:
            value, position = _varint(view, position)
        elif wire == 2:
            length, position = _varint(view, position)
            value = view[position : position + length]
            position += length
        elif wire == 5:
            (value,) = struct.unpack_from("<I", view, position)
            position += 4
        elif wire == 1:
            (value,) = struct.unpack_from("<Q", view, position)
            position += 8
        else:
            raise SileroFormatError(f"unsupported protobuf wire type {wire}")
        if position > end:
            raise SileroFormatError("truncated protobuf message")
        fields.setdefault(number, []).append(value)
    return fields


def _varint(view: memoryview, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(view):
            raise SileroFormatError("truncated protobuf varint")
        byte = view[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def _varints(view: memoryview) -> list[int]:
    values, position = [], 0
    while position < len(view):
        value, position = _varint(view, position)
        values.append(value)
    return values
