"""Large sample arrays across the gateway -> engine process boundary, through shared memory.

A 37-minute upload is 35.8 M float32 samples (143 MB). Pickled into `AppendAudio` it took
~0.46 s to reach the backend on a CPU box, ~0.3 s of it with the worker inside `inbox.get()`,
stepping no session. Through a block it takes ~0.1 s, ~40 ms of it the worker's read.

The gateway (livemeet/gateway/engine_client.py) writes an array of at least
SHARED_AUDIO_MIN_BYTES into a POSIX shared-memory object and sends `AppendSharedAudio` (its
name, the number of samples, the dtype) in the array's place among the session's commands, so
the session's order holds; the worker reads the samples out. Smaller arrays (typical live
frames) still travel inside `AppendAudio`, and a worker thread (`in_process=True`) is sent
arrays directly.

Blocks are files in SHM_DIR, the tmpfs where Linux keeps POSIX shared memory (shm_overview(7)),
written and read with write()/read() rather than through `multiprocessing.shared_memory`'s
mapping: (1) space is reserved first with posix_fallocate, so a /dev/shm too small for the block
(Docker's default is 64 MB) raises ENOSPC, and the client falls back to the pipe; writing
through a mapping past the free space kills the process with SIGBUS instead; (2) write() fills
fresh tmpfs pages ~2x faster than page faults through a mapping (~55 vs ~100 ms for 143 MB);
(3) the worker never attaches, so it never registers the block with a resource tracker (below).
Where SHM_DIR does not exist (not Linux), everything goes through the pipe.

Ownership: the gateway owns every block from creation to unlink, and only the gateway unlinks.
- `SharedAudioBlock(samples)` (gateway, a thread of the default executor) creates the block and
  writes it. The client records it by name (`EngineClient._blocks`) before putting the command
  on the queue; if the append is cancelled while the block is being written, the block is
  released as soon as it exists.
- The worker borrows it: `read_shared_audio` copies the samples out (worker.py), then posts
  `SharedAudioConsumed(name)` whatever becomes of the command (an unknown session or audio
  after end is refused only after the samples were read).
- The client pops the block from its table and unlinks it (`SharedAudioBlock.release`) on the
  first of: `SharedAudioConsumed`; the send failing (the session closed while the block was
  written, `EngineUnavailable`, a closed queue); the worker process found gone (crashed,
  killed, or exited at `Shutdown` with commands still unread); `close()`, once the worker has
  been joined. A block is never unlinked while its worker may still open it, and a
  `SharedAudioConsumed` that arrives after another path released its block finds nothing.

Resource tracker: the gateway registers each block with multiprocessing's resource tracker as
a "shared_memory" resource and unregisters it on unlink, so if the gateway process dies the
tracker unlinks what is left (with a "leaked shared_memory" warning). `SharedMemory` would
instead register a block in every process that attaches to it (Python 3.11; CPython issue
82300; `track=False` arrives in 3.13). The engine child shares the gateway's tracker (spawn
hands it over), so its registration would be a duplicate in the same set, and the usual 3.11
workaround, unregistering after attaching, would drop the gateway's registration and make the
gateway's unlink print a KeyError in the tracker. Reading the file never registers anything:
one register and one unregister per block, both in the gateway.
"""

from __future__ import annotations

import os
import secrets
from multiprocessing import resource_tracker
from typing import Any

import numpy as np
import numpy.typing as npt

SHM_DIR = "/dev/shm"  # Linux's tmpfs of POSIX shared-memory objects (glibc's shm_open uses it)
BLOCK_PREFIX = "livemeet_"  # every block's name starts with it
_TRACKER_TYPE = "shared_memory"  # the tracker's cleanup for it is shm_unlink("/" + name)


def shared_audio_supported() -> bool:
    """True where blocks can be made (Linux); elsewhere audio goes through the pipe."""
    return os.path.isdir(SHM_DIR)


class SharedAudioBlock:
    """Gateway side: a shared-memory block holding a copy of `samples` ([n] 1-D, n > 0);
    `release()` unlinks it and is called exactly once (module docstring). Raises OSError
    (ENOSPC: SHM_DIR is too small) with nothing left behind. The copy runs without the GIL."""

    def __init__(self, samples: npt.NDArray[Any]) -> None:
        assert samples.ndim == 1 and samples.size > 0, samples.shape
        self.name = BLOCK_PREFIX + secrets.token_hex(8)
        self.num_samples = samples.size
        self.dtype = samples.dtype.str  # e.g. "<f4"
        self._released = False
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            resource_tracker.register("/" + self.name, _TRACKER_TYPE)
        except BaseException:
            os.close(fd)
            os.unlink(self._path)
            raise
        try:
            os.posix_fallocate(fd, 0, samples.nbytes)  # ENOSPC now, never a short write
            data = np.ascontiguousarray(samples).data.cast("B")
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)
        except BaseException:
            self.release()
            raise
        finally:
            os.close(fd)

    @property
    def _path(self) -> str:
        return os.path.join(SHM_DIR, self.name)

    def release(self) -> None:
        """Unlink the block (its memory goes once no reader has it open). A block someone
        else removed (a /dev/shm cleaner) counts as released: the client's bulk release at
        close() must not stop at it."""
        assert not self._released, f"shared audio block {self.name} released twice"
        self._released = True
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        finally:  # even if someone else removed it: the tracker must not unlink it again
            resource_tracker.unregister("/" + self.name, _TRACKER_TYPE)


def read_shared_audio(name: str, num_samples: int, dtype: str) -> npt.NDArray[Any]:
    """Worker side: a private copy of the `num_samples` samples of `dtype` in block `name`.
    Leaves the block for its owner to unlink. Raises FileNotFoundError if it is gone,
    ValueError if it holds fewer bytes."""
    out = np.empty(num_samples, np.dtype(dtype))
    data = out.data.cast("B")
    done = 0
    with open(os.path.join(SHM_DIR, name), "rb", buffering=0) as f:
        while done < len(data):
            n = f.readinto(data[done:])
            if not n:
                raise ValueError(f"shared audio block {name}: {done} of {len(data)} bytes")
            done += n
    return out
