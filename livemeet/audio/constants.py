"""Audio and model-timing constants, each with its unit and where it comes from.

Sources: MODEL.md sections 0, 1 and 5.3 (the MOSS-TD processor and Whisper feature extractor);
DESIGN.md sections 1 and 5.
"""

from __future__ import annotations

SAMPLE_RATE = 16_000  # Hz; the model's only input rate (mono float32 in [-1, 1])
N_FFT = 400  # samples per STFT frame (25 ms)
HOP_LENGTH = 160  # samples between STFT frames (10 ms)
N_MELS = 80  # mel filters (Slaney scale and area normalisation, 0-8000 Hz)
WINDOW_S = 30  # s per encoder window
WINDOW_SAMPLES = WINDOW_S * SAMPLE_RATE  # 480_000 samples per encoder window
N_FRAMES = WINDOW_SAMPLES // HOP_LENGTH  # 3_000 mel frames per window (the 3,001st is dropped)
ENCODER_FRAMES = N_FRAMES // 2  # 1_500 encoder frames per window (20 ms each, conv stride 2)
MERGE_SIZE = 4  # encoder frames merged into one audio token
SAMPLES_PER_TOKEN = HOP_LENGTH * 2 * MERGE_SIZE  # 1_280 samples = 80 ms per audio token
TOKENS_PER_WINDOW = WINDOW_SAMPLES // SAMPLES_PER_TOKEN  # 375 audio tokens per full window
AUDIO_TOKENS_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_TOKEN  # 12.5 tokens/s
# windows live sessions may hold in the encoder cache, all together: a session's full windows
# stay cached until it ends, so each is encoded once (DESIGN 5.1). 2,048 windows = 100
# sessions x 10 minutes (DESIGN 10's live target), ~1.5 GB of bf16 embeddings at real size
# (375 x 1,024 per window), ~2 % of those sessions' KV
ENCODER_MAX_HELD_WINDOWS = 2_048
# windows of samples a micro-batch may send through the encoder's reused pinned buffers
# (livemeet/engine/encoder_runner.py, PinnedSamples): live hops' partial windows fit; larger
# batches (long uploads) are pinned per batch. 8 windows: 15 MB per buffer, two buffers
PINNED_SAMPLES_MAX_WINDOWS = 8
# s between time markers: the shipped processor_config.json says 5 (the class default 2 is wrong)
TIME_MARKER_EVERY_S = 5
MEL_FLOOR_DB = 8.0  # log10 units below the window's maximum that the mel floor sits
MEL_FMIN_HZ = 0.0  # Hz; lowest edge of the mel filterbank (Whisper feature extractor)
MEL_FMAX_HZ = 8_000.0  # Hz; highest edge of the mel filterbank (Whisper feature extractor)
LOG_MEL_MIN = 1e-10  # mel power clamp before log10 (Whisper feature extractor)

MAX_AUDIO_S = 5_400  # s; longest audio accepted in one request (90 min, DESIGN section 1)
MAX_UPLOAD_BYTES = 1 << 30  # bytes; largest upload body accepted (1 GiB)
MAX_FRAME_BYTES = 1 << 20  # bytes; largest live WebSocket message accepted (~32 s of 16 kHz PCM16)
# bytes; an upload's file part is held in memory up to this size and spilled to disk beyond
# (8 MiB: a 4-minute 16 kHz PCM16 WAV, an hour of 16 kbit/s Opus)
UPLOAD_MEMORY_BYTES = 8 << 20
# bytes of upload files held in memory at once, all requests together (received, waiting for
# a decode slot, decoding); past it new bytes are spilled (32 uploads of 8 MiB, 700 short clips)
UPLOAD_MEMORY_TOTAL_BYTES = 256 << 20
# bytes of spill files all uploads may hold at once (being received, waiting, decoding); past
# it an upload gets queue_full: a gzip body is counted inflated, so 3 requests of ~1 MB on the
# wire once made 3 GB of spill (a trial). 16 uploads of the 1-GiB maximum.
UPLOAD_SPILL_TOTAL_BYTES = 16 << 30
# seconds of decoded audio past which the decode thread hands the C heap's free pages back to
# the OS (livemeet/gateway/heap.py): three 30-minute MP3 decodes on one thread left ~157 MB
# resident; a short clip leaves little, and trimming after each of hundreds a second would
# only take the arenas' locks. A failed decode trims whatever its length (failures are rare,
# a trim with nothing to release costs ~5 us, and one that failed late held a long decode)
HEAP_TRIM_AFTER_AUDIO_S = 300.0
# finished transcripts kept in memory for GET /v1/transcriptions/{id} and the live transcript
# resources (older ones are read back from their files): at most this many, and at most
# TRANSCRIPT_CACHE_SEGMENTS segments among them. A segment held ~400 B (the soak trial), so a
# 90-minute meeting's ~1,300 segments ~0.5 MB: by count alone 1,024 of them held ~0.5 GB
TRANSCRIPT_CACHE_ENTRIES = 1_024
TRANSCRIPT_CACHE_SEGMENTS = 65_536  # ~26 MB at ~400 B a segment
LIVE_HOP_S = 1.0  # s of new audio between live re-decodes (DESIGN section 5)
# Speech ends move live hops (livemeet/session/vad.py; the figures behind these are there):
VAD_FRAME_S = 0.03  # s per classified frame (webrtcvad takes 10, 20 or 30 ms)
VAD_MODE = 2  # webrtcvad aggressiveness, 0-3
SILERO_WINDOW_SAMPLES = 512  # samples per Silero VAD window (32 ms; its 16-kHz model's only size)
SILERO_CONTEXT_SAMPLES = 64  # samples of the previous window the model reads before each window
# Silero speech probability from which a window is speech: on the AMI excerpts 0.3 found more
# pause ends than faster-whisper's 0.5 (6 vs 5 of 7) and missed less speech (loadtest/vad_study.py)
VAD_SILERO_THRESHOLD = 0.3
# below the threshold by this much a window ends speech (between the two: as the window before),
# Silero's own hysteresis (faster-whisper's VadOptions.neg_threshold)
VAD_SILERO_HYSTERESIS = 0.15
VAD_END_SILENCE_S = 0.15  # s of non-speech after speech that make a speech end
VAD_MIN_SPEECH_S = 0.09  # s of speech frames before a silence for it to count as an end
# s of new audio without speech after which a live hop runs anyway: hops in silence are skipped
# (LiveSession.hop_due), this bounds how late speech the VAD missed is decoded
LIVE_SILENCE_HOP_S = 5.0
# `serve --live-hop-s` range: a hop shorter than a client's 100-ms frames decodes per frame; a
# hop that reaches the open window's limit (LIVE_MAX_WINDOW_S) would commit by force each hop
LIVE_HOP_MIN_S, LIVE_HOP_MAX_S = 0.1, 5.0
FLUSH_INTERVAL_S = 0.050  # s; streaming text flush window (DESIGN section 6)
# s a shutting-down server gives its live sessions to receive their final transcript after
# it ends them (a session's last hop took 0.2-2.6 s under the load of 100 sessions,
# docs/benchmarks.md session 26); under aiohttp's 60-s shutdown_timeout and a pod's usual
# 30-s grace period
# A live client may send audio faster than real time (a recorder catching up, benchmarks that
# stream a meeting's head at 4-8x), but not without bound: one socket sent 1.8 h of audio in
# 0.8 s and held the engine and GBs of memory (a trial). Past a burst of LIVE_AUDIO_BURST_S,
# the gateway reads its frames no faster than LIVE_MAX_SPEED x real time (a token bucket: TCP
# backpressure, nothing is dropped). Each message counts as at least LIVE_MIN_MESSAGE_S of
# audio, so a flood of tiny frames is paced too (917k 2-byte frames in 15 s stalled the event
# loop for everyone).
LIVE_MAX_SPEED = 16.0  # x real time, sustained
LIVE_AUDIO_BURST_S = 60.0  # s of audio accepted at once ahead of that
LIVE_MIN_MESSAGE_S = 0.01  # s of audio a message (binary or text) counts as at least
# s of audio in the shortest frame a client should send (docs/protocol.md: a ping waits behind
# the frames before it, and tiny frames are read at the per-message pace above); `livemeet
# stream --hop-s` refuses shorter (0.0001 s sent one-sample frames: a trial)
LIVE_MIN_FRAME_S = 0.02
# s from a live connection's opening to its `start`: keepalives reset the idle timer, so
# without this, sockets that never start were held open for good (3,000 of them: a trial)
LIVE_START_TIMEOUT_S = 10.0
LIVE_DRAIN_TIMEOUT_S = 20.0
# s uploads in flight (a body still arriving included) get to finish once a graceful shutdown
# began (`serve --upload-drain-s`); those still running then are answered engine_unavailable
UPLOAD_DRAIN_S = 60.0
# s past the upload drain that aiohttp's shutdown waits for the requests it then cancels,
# so the answers of the uploads cut at the drain's end go out first
UPLOAD_CUTOFF_GRACE_S = 5.0
# s an upload refused or cut by a shutdown (one still running at the drain's end, or one that
# comes on an open connection while it drains) is told to wait before it is sent again
# (Retry-After). Not the 1 s default: the server is going away, and its listener is closed
# already, so an early retry meets a refused connection, after which the openai SDK backs off
# only 0.5 s then 1 s (2 retries by default): it had given the upload up before a restarted
# server served. 30 s covers a restart (the demo backend starts in a few s; MOSS-TD in ~16-21
# s with Triton's kernels cached, 45-53 s cold: docs/benchmarks.md) and stays within what
# clients honour (the openai SDK: up to 120 s)
SHUTDOWN_RETRY_AFTER_S = 30.0
# s a restart (`serve --shutdown-live keep`) waits for a kept session's audio taken in to be on
# disk before it closes the socket: many journal commits; the client holds what is not acked
LIVE_RESTART_DURABLE_WAIT_S = 2.0
# s a live session's `transcript.final` waits for the audio taken in to be on disk, so the ack
# sent right before it covers all of it (an ack names only audio on disk): many journal
# commits; a disk slower than that gets the final with the ack of what is on disk. The same
# wait covers the answers to renames and merges the journal holds back (they go out first)
LIVE_FINAL_DURABLE_WAIT_S = 2.0
# s for the error frames and closes of the sessions still open then, and for the captions
# subscribers' last frames and closes: past it, a socket not read is dropped
LIVE_DRAIN_CLOSE_S = 2.0
# s a failing live connection spends sending the frames it owed (`session.ready` first) ahead
# of its error: a client that does not read gets the error (or its close) after this
LIVE_FLUSH_BEFORE_ERROR_S = 0.5
# s; longest a live client's accepted audio goes unacknowledged (`audio.ack`, DESIGN 5.9): one
# ack per interval at most, so a client's resume buffer holds at most this much (plus what
# is in flight) beyond the ack, and a burst of frames costs no ack per frame
ACK_INTERVAL_S = 0.250
# s; longest the live journal's writer (livemeet/gateway/live_journal_writer.py) gathers appends
# before it writes, syncs and commits them as one group: an ack goes out only once its audio is
# durable, and acks go out every ACK_INTERVAL_S, so a group commit 2.5 times as often keeps
# an ack's delay within one interval, while a commit (an fdatasync per session's file plus one
# SQLite transaction) serves every session's ~0.1 s of frames at once, not one frame each
JOURNAL_COMMIT_INTERVAL_S = 0.100
# the journal writer's fdatasyncs of one group run on this many threads at once: the disk
# queues them (an NVMe or virtio queue holds many) and ext4 lets them share a journal commit,
# where one after another each waited for its own. `loadtest.journal_load --sessions 200` on
# the dev VM: a group's commit p50 0.019-0.022 s on 8 threads against 0.052-0.058 s on one
JOURNAL_SYNC_THREADS = 8
# bytes of stored audio a rebuilt session is fed per append (whole frames): 1 MiB is ~33 s at
# 16 kHz mono, ~5 s of 48-kHz stereo; big enough that an hour's file is a few hundred reads
JOURNAL_READ_CHUNK_BYTES = 1 << 20
# s a live session whose socket went away waits for a resume before it is ended as by `end`
# (`serve --live-resume-window`; 0: no resume, a vanished client's session is aborted)
LIVE_RESUME_WINDOW_S = 60.0
# s a live session waits for its revision (transcript.revised, DESIGN 5.7) after its final
# before it closes without one: a revision is an upload of the whole meeting at upload
# priority (a 90-minute one decodes in about a minute on an idle GPU, far longer behind
# uploads or on a CPU); bounds a revision that never comes
LIVE_REVISE_TIMEOUT_S = 600.0
RESUME_TOKEN_BYTES = 32  # bytes of randomness in a resume token (256 bits, secrets module)
# s a live session rebuilt after its engine worker died waits for its accepted audio to reach
# the disk, since the new backend session is fed all of it from the journal; the journal
# commits every JOURNAL_COMMIT_INTERVAL_S, so this is many commits (a slower disk: the session
# fails with the engine's error). A resume waits for nothing: its offset is the durable audio
LIVE_REBUILD_DURABLE_WAIT_S = 1.0
# s a live session whose engine worker died waits for the engine to be started again before
# it fails: the gateway restarts a lost worker after 1 s, doubling to 30 s
# (engine_client.py), and a model loads in seconds (the demo) to a minute (MOSS-TD, bf16)
LIVE_ENGINE_RECOVERY_S = 120.0
LIVE_ENGINE_POLL_S = 0.1  # s between looks at whether the engine is back
# MiB the data directory's disk keeps free: under it new live sessions and uploads get
# storage_failed (507) and /readyz is 503 (gateway/disk.py); a live session's journal writes
# ~115 MB an hour at 16 kHz mono, ~690 MB at 48-kHz stereo, so this is a few session-hours
MIN_FREE_DISK_MB = 512.0
DISK_CHECK_INTERVAL_S = 1.0  # s a free-space lookup is reused
# MiB above the floor the free space must be back at before a server that fell under the floor
# takes new work again (and /readyz is 200): hysteresis. At the floor itself the server's own
# writes and deletes (a spilled upload's file, up to 173 MB for 90 min of 16-kHz WAV; a
# journal's ~115 MB per session-hour) moved the free space across it and back, flipping
# readiness and refusals with each; space is freed by hand (DISK_RETRY_AFTER_S), so the
# margin costs a server that is nearly full nothing
DISK_READY_MARGIN_MB = 256.0
DISK_RETRY_AFTER_S = 60.0  # s a refusal for low disk tells clients to wait (Retry-After)
# s between sweeps of stored transcripts older than --retention-days (and one at start)
RETENTION_SWEEP_INTERVAL_S = 3600.0
MAX_RESUME_FIELD_CHARS = 128  # characters; longest `resume.session_id` / `resume_token`
# s a resume waits for the socket it takes its session over from to close (it sends that
# socket `session_taken_over`); a dead peer never answers the close, so the wait is bounded
LIVE_TAKEOVER_CLOSE_S = 1.0
# Captions subscriptions (GET /v1/sessions/{id}/captions, gateway/captions.py):
# finals a subscriber is sent on joining (then the current partial): an overlay shows the
# last 2-3 lines; 20 give a page that scrolls some context without replaying an hour
CAPTIONS_SNAPSHOT_FINALS = 20
# finals queued unsent to one subscriber before it is closed with queue_full (it reconnects
# for a fresh snapshot): a session commits ~1 final per 2-5 s, so 64 is minutes of backlog,
# and the bound keeps a stalled subscriber's memory at 64 finals, not the meeting's
CAPTIONS_MAX_QUEUED_FINALS = 64
# s between WebSocket pings to a subscriber (it sends nothing itself): one that does not
# answer within half of it is closed, so a vanished overlay does not hold a socket for good
CAPTIONS_HEARTBEAT_S = 30.0
# API keys (livemeet/gateway/auth.py, api_keys.py): `lm_<id>_<secret>`
API_KEY_ID_BYTES = 6  # bytes of a key's public id, 12 hex characters: named in logs and lists
API_KEY_SECRET_BYTES = 32  # bytes of randomness in a key's secret (256 bits, secrets module)
# characters; longest key a client may present (ours are 59): a header holds up to 8190 bytes,
# and a longer string is no key of ours, so it is refused before it is hashed
MAX_API_KEY_CHARS = 256
MAX_API_KEY_NAME_CHARS = 64  # characters; longest `livemeet keys create --name`
# s between the server's looks at the key store for keys created or revoked by `livemeet keys`
# while it runs (a presented key it does not know makes it look at once)
API_KEYS_RELOAD_INTERVAL_S = 1.0
# live sessions one client (its API key; its address where the server asks for no key) may
# hold at once, detached ones waiting for a resume included (`serve
# --max-live-sessions-per-client`; 0: no cap): without a cap, one client could take every
# --max-sessions slot (256 by default) and starve the others. A GPU runs ~100 live sessions
# at the latency target (docs/benchmarks.md), so 32 is a third of one; a client that needs
# more (one key shared by a whole site) gets a higher cap from its operator
MAX_LIVE_SESSIONS_PER_CLIENT = 32
# leading bits of an IPv6 address that name a client for that cap: its /64, RFC 4291's
# subnet, in which a host picks any interface identifier (a new address per session, else)
IPV6_CLIENT_PREFIX_BITS = 64


def num_audio_tokens(num_samples: int) -> int:
    """Audio tokens for `num_samples` samples at 16 kHz: ceil(S / 1280) (MODEL.md section 1.5).

    Raises ValueError for a negative count.
    """
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    return -(-num_samples // SAMPLES_PER_TOKEN)


# Audio input (livemeet/audio/decode.py, livemeet/audio/pcm.py)
FILE_RESAMPLE_QUALITY = "VHQ"  # soxr preset for uploads: quality over latency
LIVE_RESAMPLE_QUALITY = "HQ"  # soxr preset for live PCM: lower group delay than VHQ
MIN_PCM_SAMPLE_RATE = 8_000  # Hz; lowest client rate accepted on the live socket (telephony)
MAX_PCM_SAMPLE_RATE = 192_000  # Hz; highest client rate accepted on the live socket
# Hz; the rates a file may declare or decode at: below 1 kHz no speech is left and a header
# saying so is damaged (1 Hz made 32 KB read as 16,000 s: audio_too_long, the wrong error);
# 768 kHz is the highest rate audio formats use (PCM/DXD); 0 in a container means not known
# before decoding (MPEG-TS), and the decoded frames' rate is checked instead
MIN_FILE_SAMPLE_RATE = 1_000
MAX_FILE_SAMPLE_RATE = 768_000
MAX_PCM_CHANNELS = 8  # interleaved channels accepted on the live socket (down-mixed to mono)
# channels a file may have (averaged to mono): FFmpeg's decoders open at most 512
# (FF_SANE_NB_CHANNELS; more failed as "FFmpeg: Invalid argument", a trial's 4096-channel WAV)
# and libsndfile at most 1024; the lower one for every file, so a WAV is not refused or taken
# by which library reads its header (one whose data chunk declares 0 bytes goes to FFmpeg)
MAX_FILE_CHANNELS = 512
PCM_S16LE_BYTES = 2  # bytes per sample of the live socket's only encoding, pcm_s16le
# s of 16 kHz mono PCM16 in the largest live frame (MAX_FRAME_BYTES): 32.768 s, `livemeet stream
# --hop-s`'s most (it sends one frame a hop)
LIVE_MAX_FRAME_S = MAX_FRAME_BYTES / (PCM_S16LE_BYTES * SAMPLE_RATE)
DECODE_BLOCK_FRAMES = 65_536  # sample frames per soundfile read block (bounds peak memory)
TRUNCATION_TOLERANCE_S = 0.25  # s an exact-duration container may decode short before BadAudio
# fraction of an FFmpeg-decoded file's packets that may fail to decode (skipped) before the file
# is BadAudio: the ffmpeg command line's -max_error_rate default (2/3)
MAX_BAD_PACKET_FRACTION = 2 / 3

# Evaluation (livemeet/eval)
DER_COLLAR_S = 0.25  # s per side of each reference boundary not scored by DER (md-eval `-c 0.25`)
# where DER's speaker mapping counts overlap: the scored time, as pyannote.metrics does (the
# default), or the whole region before collars and overlap are removed, as md-eval does
DER_MAPPINGS = ("pyannote", "md-eval")

# Engine (KV cache, scheduler); sources: MODEL.md sections 2-3 and 7, DESIGN.md sections 4, 10.
KV_BLOCK_SIZE = 128  # tokens per paged-KV block (why 128: livemeet/engine/block_manager.py)
KV_BLOCK_SIZES = (16, 32, 64, 128)  # tokens per KV block the attention kernels support
KV_BYTES_PER_TOKEN = 28 * 2 * 8 * 128 * 2  # bytes; 112 KiB: layers x (K, V) x kv-heads x dim x bf16
CHUNKED_PREFILL_SIZE = 4_096  # tokens; largest prefill chunk of one request in one step
MIN_PREFILL_CHUNK = 16  # tokens; a budget-cut chunk smaller than this waits for a step with room
MAX_CONTEXT_TOKENS = 131_072  # tokens; decoder max_position_embeddings (no RoPE scaling)
EOS_TOKEN_ID = 151_645  # <|im_end|>


# Live layer (livemeet/session/live.py, livemeet/transcript/commit.py); chosen by us, tuned on the
# demo backend (DESIGN section 5.5).
COMMIT_HORIZON_S = 1.0  # s; a segment commits only if it ends this far behind the audio edge
COMMIT_TIME_TOLERANCE_S = 0.5  # s; two hypotheses agree on a segment if its times differ less
# s; the output grammar's time resolution (MODEL.md section 6: stamps usually have 2 decimals):
# a start stamp within one step past the audio edge may denote speech before it
STAMP_RESOLUTION_S = 0.01
LIVE_MAX_WINDOW_S = 25.0  # s; longest open window before a forced commit (Whisper reads <= 30 s)
MAX_PROMPT_CHARS = 4_096  # characters; longest client prompt (live `start` or an upload's form)
MAX_LANGUAGE_CHARS = 32  # characters; longest `language` (live `start` or an upload's form)
MAX_HOTWORDS = 256  # hotwords in a live `start` (each is in every hop's prompt)
MAX_HOTWORD_CHARS = 128  # characters per hotword: a name or a phrase
# characters (after stripping); longest name a live `speaker.rename` gives a label: a person's
# full name or a role ("Dr. Alexandra Papadopoulou-Smith, chair"), short enough for a caption
MAX_SPEAKER_NAME_CHARS = 64
# distinct labels one live session may name (a client may name labels before they are heard):
# meetings have tens of speakers; the bound keeps a session's name map, and the replay and
# captions snapshot that carry it, small
MAX_NAMED_SPEAKERS = 256
# labels one live session may merge away (`speaker.merge`): each merge takes a distinct label
# the session has shown and is never undone, so the bound keeps the merge map, and the replay
# and captions snapshot that carry a `speaker.merged` per merge, small
MAX_MERGED_SPEAKERS = 256
CORS_MAX_AGE_S = 600  # s a browser may cache a CORS preflight's answer (Chromium caps 7,200)
LIVE_PROMPT_CHARS = 200  # characters of committed text passed as the decode prompt
# tokens of committed transcript a live hop prefills as forced assistant tokens, so it decodes
# only the new tail (DESIGN 5.3: the whole committed transcript up to 2,048 tokens, then its most
# recent 2,048); 0 re-decodes the whole meeting every hop (MODEL.md section 10)
LIVE_FORCED_TRANSCRIPT_TOKENS = 2_048
# tokens a hop still forces when the GPU is behind (livemeet/session/forced_budget.py): the
# floor of the budget that halves after slow hops (~23 s of transcript at 330 tokens a
# minute, four or five segments). 100 sessions x 10 minutes on an H200, per-word p95 over
# minutes 7.5-10 (docs/benchmarks.md): session 19 (per segment) 3.05 s at 512, 2.48 s at 256;
# session 27, no decode-only steps, 1.83 s at 256 (273 forced ids a hop) and 1.51 s with 128
# held fixed (122 a hop; 5.78 against 6.37 engine-ms per hop). What a shorter forced context
# does to the model's output is unvalidated, as the forced transcript itself (DESIGN 5.3);
# >= the cap turns adaptation off
LIVE_FORCED_TRANSCRIPT_MIN_TOKENS = 128
# ids of a draft a request may carry (livemeet.engine.request: draft verification): a live hop
# drafts what the previous hop decoded after the same forced transcript, ~8-14 ids at 1-s hops
# (the open tail; docs/benchmarks.md session 18: 13.6 decoded per hop)
MAX_DRAFT_TOKENS = 64
# a session whose hops' smoothed duration passes this fraction of the hop interval halves its
# budget, one below the next fraction grows it by the step (additive increase, multiplicative
# decrease). p95 partial latency is about 0.95 of the wait for the next hop, a 0.1-s frame and
# the hop at its own p95, ~1.5-2x its mean: 64 sessions whose hops averaged 0.35-0.41 s of a
# 1-s interval saw ~2.0 s p95 (docs/benchmarks.md, session 18), so the load was held between
# 0.15 and 0.3 from then (0.25 and 0.5 before). Hops of 0.25-0.26 s on average then gave
# per-word p95 1.51-1.53 s, just over DESIGN's 1.5 (64 sessions with the budget at ~570
# forced tokens, session 26; 100 sessions at 128, session 27), so the load is now held between
# 0.1 and 0.2 (not yet measured as such); `serve --live-hop-load` sets the slow fraction (the
# fast one is its half)
LIVE_FORCED_BUDGET_SLOW_FRACTION = 0.2
LIVE_FORCED_BUDGET_GROW_SHARE = 0.5  # the budget grows below this share of the slow fraction
LIVE_FORCED_BUDGET_FAST_FRACTION = LIVE_FORCED_BUDGET_SLOW_FRACTION * LIVE_FORCED_BUDGET_GROW_SHARE
MAX_LIVE_HOP_LOAD = 1.0  # a hop as long as its interval: the session's hops run back to back
MIN_LIVE_HOP_LOAD = 0.01  # 10 ms of a 1-s hop: below it every hop halves the budget anyway
# tokens the budget grows by after a fast hop; an adaptive floor must hold at least this many
# (forced_budget.py), so it is the floor's: from the floor to the cap in 15 fast hops
LIVE_FORCED_BUDGET_STEP_TOKENS = 128
# weight of the newest hop in a session's smoothed load (the fractions above apply to it): at
# one hop a second ~3 s of memory; a hop moves the load by 0.3 of its own difference from it
LIVE_FORCED_BUDGET_SMOOTHING = 0.3
# An upload whose decode ends (EOS) at least UPLOAD_CONTINUE_GAP_S of audio before the audio's
# end is continued (DESIGN 5.8: the model tends to stop near ~16k output tokens, 40-48 minutes
# of dense speech): a new request over the same audio with the transcript's most recent
# segments forced (DESIGN 5.3), at most UPLOAD_MAX_CONTINUATIONS times, each only while the
# previous one added segments. 30 s: one encoder window, longer than a pause in a meeting and
# short against what an early stop loses (a 90-minute upload, MAX_AUDIO_S, needs ~2)
UPLOAD_CONTINUE_GAP_S = 30.0
UPLOAD_MAX_CONTINUATIONS = 4
# ids of committed transcript a continuation forces: DESIGN 5.3's 2,048, whatever the live
# setting (`--live-forced-transcript-tokens 0` still continues uploads)
UPLOAD_CONTINUE_FORCED_TOKENS = 2_048
LOOP_MAX_REPEATS = 2  # consecutive identical segments kept; longer runs are a decode loop
# Consecutive same-text segments (a count) in one window of a window re-decoder's upload
# (`RedecodeCore.upload_pieces`) that are a loop: the first is kept and the next window starts
# after it. Genuine runs survive (the next window writes them again); AMI and a 316-s trial
# file hold genuine runs of at most 3 ("What's it username?"), the trial's loop 27
UPLOAD_LOOP_MIN_REPEATS = 4

# Engine process boundary (livemeet/engine/worker.py, livemeet/gateway/engine_client.py).
ENGINE_START_TIMEOUT_S = 300.0  # s to wait for WorkerReady (model load)
ENGINE_CLOSE_TIMEOUT_S = 10.0  # s to wait for the worker to exit after Shutdown before a kill
# A lost engine worker is started again (livemeet/gateway/engine_client.py) after a delay that
# doubles from ENGINE_RESTART_DELAY_S to ENGINE_RESTART_MAX_DELAY_S with each attempt of the
# last ENGINE_RESTART_WINDOW_S; past ENGINE_MAX_RESTARTS attempts in that window, or failed
# starts in a row, the client gives up and /healthz fails, so a supervisor replaces the
# process (a crash loop, a GPU gone)
ENGINE_RESTART_DELAY_S = 1.0
ENGINE_RESTART_MAX_DELAY_S = 30.0
ENGINE_RESTART_WINDOW_S = 600.0
ENGINE_MAX_RESTARTS = 5
ENGINE_POLL_S = 0.05  # s an idle worker / the gateway's reader thread blocks on its queue per poll
# s a worker holding uploads for incoming ones blocks on its inbox per poll: how late it can
# notice that the hold's wait ran out (BackendCore.is_holding)
ENGINE_IDLE_POLL_S = 0.005
# s a new upload may be held to be prefilled together with uploads still arriving (the
# scheduler's upload batching; --upload-batch-wait-ms). 100 ms: a burst of 16 short uploads
# needs ~50-70 ms of gateway work to reach the engine, and a 50 ms cap split such waves into
# two prefill steps (H200 short c16 through HTTP, same call: 519 -> 646 audio-s/s with 100 ms;
# docs/benchmarks.md session 6). An upload is only held while others arrive or decode.
UPLOAD_BATCH_WAIT_S = 0.100
# s of estimated GPU time per engine step while no live session is open and no live request
# queued (the scheduler's upload budget; --upload-step-budget-ms). Live work keeps its shorter
# steps (LIVE_STEP_BUDGET_S); uploads alone take 200 ms, which pays for a whole 4,096-token
# chunk at the end of a 37-minute prompt (the chunk alone ~0.10 s in bf16, ~0.12 s over an FP8
# cache, with 15 decode rows ~0.11 / ~0.13 s; StepCostModel), where a 50-ms budget cut it into
# pieces that leave the last wave of attention programs part-empty.
UPLOAD_STEP_BUDGET_S = 0.200
# s of estimated GPU time per engine step while live sessions are open (--live-step-budget-ms).
# A hop's new segment takes one decode step per token (~26 for a 3-6 s turn at 330 tokens a
# minute), so under load a hop lasts ~27 steps of this budget. At 100 live sessions over
# minutes 7.5-10 of 10-minute meetings (H200, docs/benchmarks.md session 22) partial latency
# p50 / p95 was 1.72 / 2.40 s at 50 ms, 1.57 / 2.47 s at 25 ms and 1.29 / 2.29 s at 15 ms
# (with the fused encoder path, ~4 % of the GPU's time less): ~70 steps a second instead of
# ~32, no fewer hops (their fixed cost was the feared one; session 19 measured 15 ms worse
# before the host path was cut).
LIVE_STEP_BUDGET_S = 0.015
MAX_LIVE_STEP_BUDGET_S = FLUSH_INTERVAL_S  # s; one flush window, the default until session 22
# decode-only steps after each engine step that prefilled live work, while the most urgent live
# request decodes (--live-decode-steps; livemeet.engine.scheduler): a hop's new segment decodes
# up to 1 + this many ids per prefill step, for a pass over the weights and a launch per
# extra step (StepCostModel.fixed_s), and the hops queued meanwhile wait for those steps. 2
# from session 21 (latency within the spread, engine time per hop -6 %) to 26; once forced
# hops decoded every new word (session 24) they were ~57 steps a second at 100 sessions, and
# without them per-word p95 fell from 2.46 to 1.83 s, engine-ms per hop from 7.52 to 6.37
# (H200, minutes 7.5-10 of 10-minute meetings; docs/benchmarks.md, session 27)
LIVE_DECODE_STEPS = 0
# of the engine's estimated time that uploads keep while live work competes
# (--upload-min-share; livemeet.engine.scheduler): live work spends at most the rest of each
# step and uploads keep the share across steps. At 0.25, 64 live 10-minute sessions beside 2
# uploads on an H100 gave per-word p95 2.40 s against 1.16 s alone, and the uploads 16.5
# audio-s/s (docs/benchmarks.md, session 32). 0 lets live work take everything.
UPLOAD_MIN_SHARE = 0.25
MAX_UPLOAD_MIN_SHARE = 0.9  # a share of 1 would starve live work
MAX_LIVE_DECODE_STEPS = 8
MIN_LIVE_STEP_BUDGET_S = 0.005  # s; below it a step's fixed cost (~0.7 ms) is >15 % of it
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")  # the KV pool: the model's 16-bit dtype, or e4m3
# s; the upload budget's bound. A live session's first hop can find up to three upload steps
# ahead of it (one running, one queued by the async lookahead, one scheduled), so the bound
# keeps that under a hop (LIVE_HOP_S).
MAX_UPLOAD_STEP_BUDGET_S = LIVE_HOP_S / 4
# s; the GIL switch interval in the gateway and engine worker processes (Python's default is
# 5 ms). A thread that wants the GIL waits up to this long while another runs Python, and
# uploads hop between the event loop and decode threads, and engine events between the worker
# loop and its queue feeder: 0.5 ms gave short c16 through HTTP +6 % (708 -> 749 audio-s/s, same
# call; docs/benchmarks.md session 6).
GIL_SWITCH_INTERVAL_S = 0.0005
ENGINE_STATS_INTERVAL_S = 0.5  # s; most time between two EngineStats posts of a stepping worker
# s; an engine step this long is logged with its parts and shape: a normal step is ~1.5 ms
# (decode) to ~0.2 s (a late 4,096-token chunk of a long prompt) on an H200
ENGINE_SLOW_STEP_S = 0.5
SESSION_EVENT_BUFFER = 1024  # events buffered per session (after coalescing) before it fails
# bytes; an array this large crosses to the engine process in shared memory, a smaller one inside
# its pickled command (livemeet/engine/shared_audio.py). Measured on a CPU box: the pipe costs
# ~0.16 ms per second of audio (64 KB) and holds the worker in its inbox read meanwhile; a block
# costs ~0.1 ms fixed (file, thread hop, one more message) plus ~0.6 ms per MiB. At 256 KiB (4.1 s
# of float32 audio) typical live frames (20 ms-1 s: at most 64 KB) stay in the pipe while a
# short uploaded clip takes a block (an 11.6-s clip through the pipe held the worker ~1.9 ms,
# a burst of 16 of them ~30 ms in front of their prefill); the pipe's share costs <= ~0.7 ms.
SHARED_AUDIO_MIN_BYTES = 1 << 18
# s between warnings that appends fall back to the pipe for lack of /dev/shm room: with
# Docker's 64 MB /dev/shm a burst of ~80 short uploads fills it, and each append would warn
SHM_FALLBACK_WARNING_INTERVAL_S = 60.0

# Repetition guard (livemeet/transcript/repetition.py); chosen by us. Greedy decoding loops on
# noise and laughter (MODEL.md section 5.5); real meetings repeat short replies ("yeah.") a few
# times, never this many times in a row, and never a character period over this long a span.
# segments; this many consecutive same-text segments by one speaker = a loop
REPETITION_MAX_SEGMENT_REPEATS = 4
# segments; a run of one text whose copies change speaker is a loop only at this length: short
# replies ("Yeah.", "Okay.") go back and forth in meetings, and four such turns in a row cut a
# trial's upload at 4.9 s of 138 s
REPETITION_MAX_MIXED_REPEATS = 12
REPETITION_MIN_SPAN_CHARS = 120  # characters; shortest periodic tail of one segment = a loop
REPETITION_MAX_PERIOD_CHARS = 24  # characters; longest period the in-segment check looks for
