"""What an upload's audio decoding costs the gateway's CPU, to size `--max-concurrent-decodes`.

Per format: the time of one upload's decode as the handler's calls make it (`decode.probe`
then `decode.decode_file`, here back to back in one thread and without the duration limit),
and the throughput of N uploads decoded by
k threads at once, which shows whether decoding scales with threads (soundfile, PyAV and soxr
release the GIL inside their C code) or serializes. Formats: the HTTP benchmark's clip (11.6 s,
16 kHz mono PCM16 WAV, read by libsndfile) and meeting (37.3 min, the same format), and 30 s of
MP3 (44.1 kHz stereo) and of Opus in WebM (48 kHz, a browser's MediaRecorder format), both
encoded here with PyAV and decoded by FFmpeg then resampled by soxr.

Usage:
    python -m loadtest.bench_upload_decode [--threads 1,2,4,8,16] [--files 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from livemeet.audio import decode
from livemeet.audio.constants import SAMPLE_RATE
from loadtest.workloads import LONG_AUDIO_S, SHORT_AUDIO_S, wav_bytes

LOSSY_S = 30.0  # s of audio in the MP3 and Opus files


def tone(duration_s: float, rate: int, channels: int) -> np.ndarray:
    """[channels, n] float32: two quiet sines plus a little noise (codecs see real content)."""
    t = np.arange(round(duration_s * rate)) / rate
    rng = np.random.default_rng(0)
    mono = 0.2 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1330 * t)
    mono = mono + 0.01 * rng.standard_normal(t.size)
    return np.repeat(mono[None, :].astype(np.float32), channels, axis=0)


def encode_lossy(path: Path, fmt: str, codec: str, rate: int, channels: int) -> None:
    """Write LOSSY_S seconds of `tone` to `path` with PyAV (`fmt` container, `codec`)."""
    audio = tone(LOSSY_S, rate, channels)
    layout = "stereo" if channels == 2 else "mono"
    with av.open(str(path), "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        frame_size = 960 if codec == "libopus" else 1152
        for start in range(0, audio.shape[1], frame_size):
            block = np.ascontiguousarray(audio[:, start : start + frame_size])
            frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=layout)
            frame.sample_rate = rate
            frame.pts = start
            frame.time_base = Fraction(1, rate)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def make_files(directory: Path) -> dict[str, Path]:
    """The benchmark formats, written to `directory`, by name."""
    files = {
        "wav 11.6 s 16 kHz mono": directory / "clip.wav",
        "wav 37.3 min 16 kHz mono": directory / "meeting.wav",
        "mp3 30 s 44.1 kHz stereo": directory / "meeting.mp3",
        "opus/webm 30 s 48 kHz mono": directory / "meeting.webm",
    }
    rate_1 = tone(SHORT_AUDIO_S, SAMPLE_RATE, 1)[0]
    files["wav 11.6 s 16 kHz mono"].write_bytes(wav_bytes(rate_1))
    long_1 = tone(LONG_AUDIO_S, SAMPLE_RATE, 1)[0]
    files["wav 37.3 min 16 kHz mono"].write_bytes(wav_bytes(long_1))
    encode_lossy(files["mp3 30 s 44.1 kHz stereo"], "mp3", "libmp3lame", 44_100, 2)
    encode_lossy(files["opus/webm 30 s 48 kHz mono"], "webm", "libopus", 48_000, 1)
    return files


def handler_decode(path: Path) -> int:
    """What the upload handler runs for one file (probe, then decode); returns the samples."""
    decode.probe(path)
    return int(decode.decode_file(path).size)


def median_ms(fn: Callable[[], object], iters: int) -> float:
    fn()  # warm-up: library init, first-use allocations
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def files_per_s(path: Path, num_threads: int, num_files: int) -> float:
    with ThreadPoolExecutor(num_threads) as pool:
        list(pool.map(handler_decode, [path] * num_threads))  # warm every thread
        start = time.perf_counter()
        list(pool.map(handler_decode, [path] * num_files))
        return num_files / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = os.cpu_count() or 1
    default_threads = ",".join(str(k) for k in (1, 2, 4, 8, 16, 32) if k <= cores) or "1"
    parser.add_argument("--threads", default=default_threads, help="thread counts to time")
    parser.add_argument("--files", type=int, default=32, help="uploads per throughput point")
    parser.add_argument("--iters", type=int, default=20, help="timed single decodes per format")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    threads = [int(k) for k in args.threads.split(",")]
    results: list[dict[str, object]] = []
    print(f"{cores} CPU cores")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in make_files(Path(tmp)).items():
            n = handler_decode(path)
            one_ms = median_ms(lambda path=path: handler_decode(path), args.iters)
            probe_ms = median_ms(lambda path=path: decode.probe(path), args.iters)
            rates = {k: files_per_s(path, k, args.files) for k in threads}
            audio_s = n / SAMPLE_RATE
            print(
                f"{name}: {path.stat().st_size / 1e3:.0f} kB, probe {probe_ms:.2f} ms, "
                f"probe+decode {one_ms:.2f} ms ({audio_s / one_ms * 1e3:.0f}x real time); "
                + ", ".join(f"{k} threads {r:.0f} files/s" for k, r in rates.items())
            )
            results.append(
                {
                    "format": name,
                    "bytes": path.stat().st_size,
                    "audio_s": audio_s,
                    "probe_ms": probe_ms,
                    "probe_decode_ms": one_ms,
                    "files_per_s": {str(k): r for k, r in rates.items()},
                }
            )
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu_count": cores, "results": results}, indent=1))


if __name__ == "__main__":
    main()
