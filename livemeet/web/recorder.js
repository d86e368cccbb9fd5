// Microphone -> /v1/live (protocol v0, docs/protocol.md) -> partial (grey) and final captions.
// A dropped connection (close 1006) is resumed (docs/protocol.md, "Resume"), and so is a server
// restarting (1012, `server_restarting`: its next start has the session): the page keeps the
// audio the server has not acknowledged (`audio.ack`) and sends it again from the offset the
// resumed `session.ready` reports; finals it has shown already are skipped by id. So is a close
// for a message of the page's that the server refused (4400, 4402, 4415: it keeps the session,
// docs/protocol.md "Closing"), at most MAX_VIOLATION_RESUMES times a meeting (the next such
// close ends the meeting: windUp), and a socket that has gone silent (a dead network path
// sends no close: the watchdog, ACK_TIMEOUT_MS).
// Downloads of the transcript (JSON, SRT, VTT, text) link to the server's transcript resource
// (docs/protocol.md, "Other endpoints"), which renders them with the uploads' writers.
// A page reload does not end the meeting either: while a session is live the page keeps it in
// sessionStorage, and a reloaded page offers "Resume meeting" (a click: the microphone needs a
// user gesture) within the session's resume window; the audio spoken meanwhile is not captured.
// A meeting stopped before the reload (its final not come yet) is finished without a click or
// a microphone: a resume that only waits for the final (finishStored).
// Closing the tab mid-meeting asks first (beforeunload), and the page keeps its last meetings
// in localStorage (RECENT_KEY), so a new tab offers their transcripts.
// A microphone that goes away mid-meeting (unplugged, a headset that disconnected) is not
// replaced by silence: the page stops the audio, keeps the session and offers Resume meeting
// (a microphone again, into the same meeting) or Stop (micLost).
// Speakers can be named (docs/protocol.md, "Speaker names"): a click on a speaker, on a caption
// line or in the speakers list, asks for a name and sends `speaker.rename`; the names shown come
// only from the server (its `speaker.renamed` answers; on a resume, `session.ready`'s `speakers`
// and the replay). Names are changed only while connected: offline, the speakers list is
// disabled and a click does nothing.
// Two labels that are one person can be merged ("Merge two…", docs/protocol.md "Speaker
// merges"): the page asks which (e.g. "S03 S01": S03 is S01), checks what the server would
// refuse (a refusal closes the socket), and sends `speaker.merge`; once the server's
// `speaker.merged` says so, the merged label shows everywhere as its target (its name and
// colour), the speakers list shows the two as one, and a click on it names the target.
// A server that asks for an API key (docs/protocol.md, "API keys") gets the one typed in the
// page's API key field as `start`'s `api_key` (a page cannot set a WebSocket's headers), on
// every connection, resumes included; the tab's sessionStorage keeps it for a reload.
// Revision (docs/protocol.md, "Revision"): where `session.ready` promised one, the page says a
// revision is coming after `transcript.final`, and `transcript.revised` replaces the finals it
// supersedes in the captions shown (the speakers' names stay: it carries the session's
// labels); the downloads then hold it (the transcript resource serves the newest). A drop
// between the two is resumed for it, a silent socket judged as after `end` (FINAL_QUIET_MS),
// and the wait is bounded (REVISION_GIVE_UP_MS). `revision_failed`: the page says the final
// stands. A resume refused with not_found (4404) for a meeting the server finished meanwhile
// (what it owed went out over a dead socket) shows the transcript the server stored
// (sessionGone).
const KEEPALIVE_MS = 10000;
// Hz; the rate the page sends at (mono PCM16 LE, pcm-worklet.js), declared in `start`: the
// model's 16 kHz, the worklet downsampling a faster AudioContext, or a slower context's own
// (a Bluetooth headset's 8 kHz: the server resamples it, docs/protocol.md `start`), not under
// MIN_SAMPLE_RATE, the server's floor (workletRate)
const SAMPLE_RATE = 16000;
const MIN_SAMPLE_RATE = 8000;
const BYTES_PER_FRAME = 2; // one mono PCM16 sample frame
// audio kept for a resend, at most: past it (a long outage, or a server that stopped
// acknowledging), new audio is dropped, neither sent nor kept, and the page says how much;
// the session's audio stays contiguous (the transcript skips what was dropped)
const MAX_UNACKED_S = 60;
const RECONNECT_FIRST_MS = 250; // first retry after a drop, doubling up to RECONNECT_MAX_MS
const RECONNECT_MAX_MS = 5000;
// a server the page cannot reach may be restarting (docs/protocol.md, "Resume"): a restarted
// server keeps its sessions a window from its own start, so each failed attempt moves the
// deadline a window past it, up to this long after the drop (as `livemeet stream`)
const RECONNECT_OUTAGE_MAX_MS = 600000;
// 1012 "Service Restart" (`server_restarting`): the server restarts (SIGTERM with
// `serve --shutdown-live keep`) and its next start has the session: resumed as a drop to a
// server that cannot be reached until it is back
const SERVICE_RESTART = 1012;
// no close frame: the network, not the server, ended it; or a restart
const RESUMABLE_CLOSES = [1005, 1006, SERVICE_RESTART];
// a message of this page's that the server refused (invalid_request 4400, protocol_error 4402,
// bad_audio 4415): it closes the socket, not the session, which it keeps for a resume as after
// a drop (docs/protocol.md, "Closing": a client's violation costs nothing of its meeting), so
// the page says so and resumes; at most this many times a meeting, in case the page keeps
// sending what the server refuses. The next such close ends the meeting (windUp): left
// alone, the session waited out its resume window (60 s) before the server ended it and its
// transcript completed (a trial).
const VIOLATION_CLOSES = [4400, 4402, 4415];
const MAX_VIOLATION_RESUMES = 3;
// A dead network path (packets dropped, no close: a Wi-Fi that went, a NAT that forgot the
// connection) leaves the socket open while nothing arrives. The server acknowledges audio
// within 0.25 s of taking it in (`audio.ack`, ACK_INTERVAL_S; its journal commits every
// 0.1 s) and answers every rename and merge, so audio or a message sent and nothing from the
// server for ACK_TIMEOUT_MS means the socket is dead: the page drops it and resumes as after a
// close without a close frame. 15 s is 60 ack intervals (a slow disk's commit or a congested
// uplink's retransmissions fit in it) and leaves most of the 60-s resend buffer
// (MAX_UNACKED_S) and of the server's idle timeout (60 s: past it the server ends the
// session of a client it does not hear) for the resume.
const ACK_TIMEOUT_MS = 15000;
// After `end` the server owes the final and may say nothing while it decodes the last audio
// (75 s in a trial with a stalled engine; a browser hides the server's pings), so silence
// alone does not prove the socket dead. After this long without a word the page asks the
// transcript resource (HTTP, the captions token) instead: a final stored there that the
// socket did not bring, or no server reached, means the socket is dead (the page drops it and
// resumes: the resume replays the final); a transcript still running means wait on (asked
// again after as long). Disarming the watchdog on the last audio's ack left a dead socket
// "finishing…" for 11 minutes (a trial). The same goes for the revision after the final
// (docs/protocol.md "Revision"): a revision stored there means the socket is dead (the resume
// replays the final, then the revision); the final alone means still revising.
const FINAL_QUIET_MS = 30000;
// a socket that has not opened (the network may drop its handshake as it dropped the last
// socket's packets), and one that opened and has not answered `start`: a resume waits while
// the server rebuilds its session after its engine worker was lost (up to 120 s,
// LIVE_ENGINE_RECOVERY_S; docs/protocol.md "Resume")
const CONNECT_TIMEOUT_MS = 15000;
const READY_TIMEOUT_MS = 130000;
const WATCHDOG_EVERY_MS = 1000;
// Stop with no final this long after it: the page stops waiting and says so. The server's own
// bound is 10 minutes after `end` (then engine_unavailable, docs/protocol.md); a minute more
// for the reconnects of a page that lost its socket meanwhile.
const FINAL_GIVE_UP_MS = 660000;
// A revision due this long after the final: the page stops waiting, the final stands. The
// server's own bound is 10 minutes after the final (LIVE_REVISE_TIMEOUT_S, then
// revision_failed); a minute more, as for the final. A dead path whose revision failed would
// otherwise keep the page waiting for ever: the transcript resource says "final" for a
// revision still running and for one that failed alike.
const REVISION_GIVE_UP_MS = 660000;
// Stop asks the worklet for the audio of the frame it is filling (under 100 ms), to send before
// `end`; past this wait (a suspended context) it goes on without it
const FLUSH_WAIT_MS = 200;
// Stop before the microphone gave any audio (right after Start): `end` before any audio is a
// protocol_error; a 1000 close frees a session with no audio (docs/protocol.md, "Resume"),
// but an older server kept it for its resume window, holding one of its --max-sessions; this
// much silence, then `end`, ends it at once on either, with its final (20 ms, the shortest
// frame docs/protocol.md recommends)
const EMPTY_STOP_S = 0.02;
// a colour per speaker label, by its number (S01 the first), so the captions overlay
// (livemeet/web/captions.js, the same palette and rule) colours each speaker as this page does
const SPEAKER_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                         "#e377c2", "#17becf"];

// the page scrolled to within this of its bottom follows the newest captions; scrolled further
// up, the user reads back, and new captions must not pull the page down
const FOLLOW_SLACK_PX = 40;
const COPY_NOTE_MS = 5000; // how long "copied" (or why not) shows beside Copy
// A meeting gone from the page whose transcript the server still has "running" (it is ending
// it: offerTranscript) is asked about again this often, for at most this long (its final
// decode included)
const TRANSCRIPT_POLL_MS = 3000;
// ms an ask of the transcript resource may take before the page gives up on it (a stored
// transcript is a few hundred KB at most: seconds even on a slow link)
const TRANSCRIPT_FETCH_TIMEOUT_MS = 15000;
const TRANSCRIPT_POLL_MAX_MS = 180000;
// how long the reason a name or a merge was not sent shows in the status line: long enough to
// read it twice, then the recording status is back
const NOTE_MS = 8000;
// what a transcript's finish_reason means to the user (docs/protocol.md, transcript.final):
// `stop`, the normal end, says nothing
const FINISH_NOTES = {
  length: " (the model reached its output limit: the end of the meeting may be missing)",
  repetition: " (the model repeated itself and was cut off there: some of it may be missing)",
  abort: " (the transcription was cut short)",
};

// the downloads: [link id suffix, the resource's response_format, file extension]; JSON is
// diarized_json (segments with ids, times and speakers; plain json is the text alone)
const EXPORTS = [["json", "diarized_json", "json"], ["srt", "srt", "srt"],
                 ["vtt", "vtt", "vtt"], ["text", "text", "txt"]];
// sessionStorage key of the live session: {session_id, resume_token, captions_token,
// sample_rate, channels, started_at, resume_window_s, alive_at (when the page last had it),
// ending (Stop was pressed), stopped_at, revise (session.ready's)}
const STORAGE_KEY = "livemeet.recorder.session";
// localStorage key of the meetings this browser recorded last, newest first, at most
// RECENT_MEETINGS: [{session_id, captions_token, started_at}]. A tab closed mid-meeting (or
// after it) takes its sessionStorage along, and with it the way to the meeting's transcript,
// which the server keeps: a new tab lists these with their downloads. Only the captions
// token, which reads the captions and the transcript: the resume token stays with the tab.
// A meeting joins the list once the server acknowledged some of its audio: one that never
// had any (Start, then the tab closed or Stop) has nothing to download, and took the place of
// one that had (a trial). "Forget them" clears the list (a shared computer).
const RECENT_KEY = "livemeet.recorder.meetings";
const RECENT_MEETINGS = 5;
// a session id's characters the recent meetings' list and the status line show (its ids are
// 32 hex digits; the whole id in their tooltips)
const SHORT_ID_CHARS = 8;
// sessionStorage key of the API key typed in the page: this tab only, gone with it
const API_KEY_STORAGE_KEY = "livemeet.recorder.api_key";
const ALIVE_EVERY_MS = 1000; // alive_at is refreshed on acks at most this often
// what the server accepts in `speaker.rename` (docs/protocol.md; livemeet/gateway/
// live_protocol.py _parse_rename and name_problem): a label "S" and digits of at most 16
// characters; a name of 1..64 characters (code points) once stripped, without control
// characters, line breaks or lone surrogates, without bidirectional embeddings, overrides or
// isolates, and with at least one visible character (a letter, number, punctuation or symbol).
// One it refuses closes the session's socket, so the page applies the same rules first.
const SPEAKER_LABEL = /^S\d{1,15}$/;
const MAX_SPEAKER_NAME_CHARS = 64;
const NAME_FORBIDDEN = /[\p{Cc}\p{Cs}\p{Zl}\p{Zp}]/u;
const NAME_BIDI = /[\u202a-\u202e\u2066-\u2069]/;
const NAME_VISIBLE = /[\p{L}\p{N}\p{P}\p{S}]/u;
// what the server's str.strip() removes from a name's ends (Python's whitespace: it also
// strips U+001C-001F and U+0085, which String.prototype.trim keeps, and keeps U+FEFF, which
// trim strips), so the page checks, and sends, the name the server keeps
const NAME_SPACE = "\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029" +
                   "\\u202f\\u205f\\u3000";
const NAME_EDGES = new RegExp(`^[${NAME_SPACE}]+|[${NAME_SPACE}]+$`, "g");

const $ = (id) => document.getElementById(id);

// The page's clock for the time that passes while it runs (ms): the watchdog's silences, the
// give-ups, the resume window after a drop, a note's and the transcript polls' durations.
// Date.now() is the wall clock, which steps (an NTP correction, the user setting the time, a
// VM resumed): stepped back minutes, a dead socket went unnoticed for as long; forward, a
// live socket was dropped, a resume window cut short, a give-up came early. This one never
// steps (outside Windows, browsers stop it while the machine sleeps: woken, the page counts
// a silence from then, and a resume the server no longer keeps is refused, 4404). It starts
// again at each load: what a reloaded page reads back (sessionStorage's alive_at, started_at,
// stopped_at) is the wall clock's, taken in with monotonicFrom. It reads 1 ms past
// performance.now(), never 0, which the page's times (awaitingSince, stoppedAt, dropAt, ...)
// hold for "none": a browser that coarsens performance.now() (to 100 ms, resisting
// fingerprinting) read 0 in a page's first step, and a socket opened then owed nothing.
function monotonicMs() {
  return performance.now() + 1;
}

// `wallMs`, a Date.now() time from before this page's load, on monotonicMs's clock: as long
// before now as the wall clock says (the only measure across a reload; negative where it was
// before the page's start)
function monotonicFrom(wallMs) {
  return monotonicMs() - (Date.now() - wallMs);
}

// Its times (ms) are monotonicMs's, but for startedAt and stoppedWallAt: the wall clock's (a
// meeting's start is shown, and both are saved for a reload)
const state = { ws: null, ctx: null, stream: null, node: null, keepalive: null,
                opened: false, session: null, captions: null, startedAt: 0,
                format: { sample_rate: SAMPLE_RATE, channels: 1 }, stored: null,
                // the session whose captions come from the transcript resource once its offer
                // to resume is withdrawn (one stored before a reload, gone from the server;
                // while offered, state.stored says whose they are)
                finalsOf: null,
                // savedAt: the session's last save (alive_at is refreshed at most every
                // ALIVE_EVERY_MS)
                reloaded: false, afterReload: false, savedAt: 0, unloading: false,
                buffer: null, live: false, ending: false,
                // session.ready promised transcript.revised; it is due (the final came first)
                revise: false, revisionPending: false,
                finished: false, seenFinals: new Set(), windowS: 0, dropAt: 0, unreachableAt: 0,
                attempt: 0,
                // the server's last error ({code, message}) on this socket, and how many of
                // this meeting's closes for a refused message were resumed
                error: null, violations: 0, refused: null,
                // once the page ends the meeting for refused messages (windUp): the last
                // refusal's error, and the unacknowledged audio it did not send (frames)
                windingUp: null, unsentFrames: 0,
                // the meeting was stopped before a reload: its resume sends no audio, only
                // `end` (finishStored)
                endOnly: false,
                // the current socket opened; when the page last heard from the server; since
                // when it owes an answer (a send since it was last heard from, or the
                // socket's open and session.ready; 0: none); when Stop was pressed, and when
                // on the wall clock (stopped_at: a reloaded page's give-up counts from it)
                reached: false, heardAt: 0, awaitingSince: 0, stoppedAt: 0, stoppedWallAt: 0,
                watchdog: null,
                // when the meeting's transcript.final first came (REVISION_GIVE_UP_MS)
                finalAt: 0,
                // the last ask of the transcript resource after `end` (FINAL_QUIET_MS)
                probedAt: 0, probing: false,
                // the meeting is in the recent meetings (RECENT_KEY): it has audio
                remembered: false,
                // the status while recording; a passing note that replaced it (why a name or
                // a merge was not sent) and until when it shows (setNote)
                liveStatus: "", note: null, noteUntil: 0,
                // Stop waits for the worklet's last samples (onFlushed: when they came);
                // nothing: Stop came before any audio
                flushing: false, onFlushed: null, nothing: false,
                // the microphone's track ended: no audio until Resume meeting (micLost)
                micLost: false,
                // a meeting runs here: from Start (or Resume meeting) to its last close
                active: false,
                // the element the status line took the keyboard focus from as it was
                // disabled, to give it back once enabled (setDisabled)
                focusParked: null,
                // takes back the offer to resume a stored session once its window passed
                offerTimer: null, copyNoteTimer: null,
                // asks again about a meeting gone from the page that the server is ending
                offerPoll: null,
                // the server said it restarts (1012): until it is back, retries say so
                restarting: false,
                retry: null,
                // the captions shown (segments), the labels seen, {label: name} as the
                // server last said (speaker.renamed), {label: into} (speaker.merged)
                finals: [], partial: [], speakers: new Set(), names: new Map(),
                merged: new Map(),
                // the speakers list's button of each label it lists (renderSpeakers)
                speakerButtons: new Map() };

// Audio since the last ack, by offset (sample frames from the session's start): what a
// resume may have to send again. `push` refuses audio past `maxFrames` (counted as lost).
function ResumeBuffer(maxFrames) {
  this.maxFrames = maxFrames;
  this.chunks = []; // {start, data: ArrayBuffer}, contiguous, oldest first
  this.next = 0; // offset of the next frame pushed
  this.held = 0; // frames in chunks
  this.lostFrames = 0;
}
ResumeBuffer.prototype.push = function (data) {
  const frames = data.byteLength / BYTES_PER_FRAME;
  if (this.held + frames > this.maxFrames) {
    this.lostFrames += frames;
    return false;
  }
  this.chunks.push({ start: this.next, data });
  this.next += frames;
  this.held += frames;
  return true;
};
ResumeBuffer.prototype.ack = function (offset) {
  while (this.chunks.length) {
    const c = this.chunks[0];
    if (c.start + c.data.byteLength / BYTES_PER_FRAME > offset) break;
    this.chunks.shift();
    this.held -= c.data.byteLength / BYTES_PER_FRAME;
  }
};
// The buffers to send for audio from `offset` on (the first one cut at `offset`).
ResumeBuffer.prototype.from = function (offset) {
  return this.chunks
    .filter((c) => c.start + c.data.byteLength / BYTES_PER_FRAME > offset)
    .map((c) => (c.start >= offset ? c.data
                                   : c.data.slice((offset - c.start) * BYTES_PER_FRAME)));
};

// The audio held was counted from the page's start but goes on from `offset`: a session
// resumed after a page reload, whose first `offset` frames the server has from the old page.
ResumeBuffer.prototype.rebase = function (offset) {
  const shift = offset - (this.next - this.held); // the oldest frame held becomes `offset`
  for (const c of this.chunks) c.start += shift;
  this.next += shift;
};

// ---- the live session across page reloads (sessionStorage: this tab only)

function storage() {
  try { // absent, or refused (storage off): the page works on without reload resume
    return typeof sessionStorage === "undefined" ? null : sessionStorage;
  } catch (e) {
    return null;
  }
}

function lastingStorage() {
  try { // absent, or refused: no list of earlier meetings
    return typeof localStorage === "undefined" ? null : localStorage;
  } catch (e) {
    return null;
  }
}

// The meetings this browser recorded last (RECENT_KEY), newest first; [] when none or unreadable
function recentMeetings() {
  const store = lastingStorage();
  try {
    const list = JSON.parse(store ? store.getItem(RECENT_KEY) : "[]");
    if (Array.isArray(list)) {
      return list.filter((m) => m && typeof m.session_id === "string" &&
                                typeof m.captions_token === "string" &&
                                typeof m.started_at === "number").slice(0, RECENT_MEETINGS);
    }
  } catch (e) { /* not JSON: none */ }
  return [];
}

function saveRecentMeetings(list) {
  const store = lastingStorage();
  if (!store) return;
  try {
    if (list.length) store.setItem(RECENT_KEY, JSON.stringify(list.slice(0, RECENT_MEETINGS)));
    else store.removeItem(RECENT_KEY);
  } catch (e) { /* full or refused: the list is a convenience */ }
}

// This meeting joins the list (a resume keeps its place)
function rememberMeeting(captions, startedAt) {
  const list = recentMeetings().filter((m) => m.session_id !== captions.session_id);
  saveRecentMeetings([{ session_id: captions.session_id, captions_token: captions.captions_token,
                        started_at: startedAt }, ...list]);
}

function saveSession() {
  const store = storage();
  if (!store || !state.session) return;
  // the final came: nothing left to resume for, but a revision it promised
  if (state.finished && !state.revisionPending) return;
  state.savedAt = monotonicMs();
  store.setItem(STORAGE_KEY, JSON.stringify({
    session_id: state.session.session_id, resume_token: state.session.resume_token,
    captions_token: state.captions ? state.captions.captions_token : null,
    sample_rate: state.format.sample_rate, channels: state.format.channels,
    started_at: state.startedAt, resume_window_s: state.windowS, alive_at: Date.now(),
    // Stop was pressed: a reloaded page only fetches the final (finishStored)
    ending: state.ending, stopped_at: state.stoppedWallAt, revise: state.revise,
  }));
}

// The stored session, or null (none, unreadable, or of another format than this page sends).
// Its alive_at and stopped_at are also taken onto this page's clock, once, as it loads
// (aliveAtMono, stoppedAtMono; 0: not stopped): the wall clock may step after.
function loadSession() {
  const store = storage();
  if (!store) return null;
  try {
    const saved = JSON.parse(store.getItem(STORAGE_KEY));
    if (saved && typeof saved.session_id === "string" && typeof saved.resume_token === "string" &&
        Number.isInteger(saved.sample_rate) && saved.sample_rate >= MIN_SAMPLE_RATE &&
        saved.sample_rate <= SAMPLE_RATE && saved.channels === 1) {
      return { ...saved, aliveAtMono: monotonicFrom(saved.alive_at),
               stoppedAtMono: saved.stopped_at ? monotonicFrom(saved.stopped_at) : 0 };
    }
  } catch (e) { /* not JSON: dropped below */ }
  clearSession();
  return null;
}

function clearSession() {
  const store = storage();
  if (store) store.removeItem(STORAGE_KEY);
}

// The API key typed in the page, or "" (the server may ask for none)
function apiKey() {
  return String($("api-key").value || "").trim();
}

// Keep the typed key for a reload of this tab (a resume after it needs the key too)
function saveApiKey() {
  const store = storage();
  if (!store) return;
  if (apiKey()) store.setItem(API_KEY_STORAGE_KEY, apiKey());
  else store.removeItem(API_KEY_STORAGE_KEY);
}

function loadApiKey() {
  const store = storage();
  const saved = store ? store.getItem(API_KEY_STORAGE_KEY) : null;
  if (saved) $("api-key").value = saved;
}

// A time in the meeting (s from its start) as m:ss, h:mm:ss past an hour
function meetingTime(s) {
  const t = Math.max(0, Math.floor(s));
  const [h, m, sec] = [Math.floor(t / 3600), Math.floor((t % 3600) / 60), t % 60];
  const p = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${p(m)}:${p(sec)}` : `${m}:${p(sec)}`;
}

// A length of audio: "7.6 s" under a minute, else as meetingTime ("12:05")
function duration(s) {
  return s < 60 ? `${s.toFixed(1)} s` : meetingTime(s);
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

// The rate a new session is declared at, for an AudioContext at `contextRate` (SAMPLE_RATE)
function workletRate(contextRate) {
  const rate = Math.round(contextRate);
  if (!(rate > 0)) return SAMPLE_RATE; // not told: the worklet's default
  return Math.max(MIN_SAMPLE_RATE, Math.min(SAMPLE_RATE, rate));
}

function reconnectDelayMs(attempt) {
  return Math.min(RECONNECT_MAX_MS, RECONNECT_FIRST_MS * 2 ** attempt);
}

// When to stop trying to resume (ms, monotonicMs's clock): a window from the drop, or, when the
// last attempt found no server (`unreachableAt`), a window past that attempt, capped.
function resumeDeadlineMs(dropAt, windowS, unreachableAt) {
  const deadline = dropAt + windowS * 1000;
  if (!unreachableAt) return deadline;
  return Math.max(deadline,
                  Math.min(unreachableAt + windowS * 1000, dropAt + RECONNECT_OUTAGE_MAX_MS));
}

function speakerColour(speaker) {
  const m = /^S(\d+)$/.exec(speaker);
  let n = m ? Number(m[1]) - 1 : 0;
  if (!m) for (const ch of speaker) n = (n * 31 + ch.charCodeAt(0)) >>> 0;
  return SPEAKER_COLOURS[n % SPEAKER_COLOURS.length];
}

// A URL of this server, `path` relative to this page (as its scripts and `readyz` are), so
// the page also works behind a proxy that serves it under a path (https://host/meet/ ->
// wss://host/meet/v1/live, as `livemeet stream --url https://host/meet/` maps it); `ws`:
// with the page's WebSocket scheme (wss on https).
function serverUrl(path, ws) {
  const url = new URL(path, location.href);
  if (ws) url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

// A session id as the statuses and the recent meetings' list show it: its first characters
function shortSessionId(sessionId) {
  return sessionId.slice(0, SHORT_ID_CHARS);
}

// The captions overlay's URL for a session (docs/protocol.md, "Captions"): read-only, so
// it may be handed to whoever runs the stream (the resume token stays on this page).
function overlayUrl(sessionId, captionsToken) {
  return serverUrl("captions.html") +
         `?session=${encodeURIComponent(sessionId)}&token=${encodeURIComponent(captionsToken)}`;
}

function showOverlayUrl(ev) {
  if (!ev.captions_token) return;
  const url = overlayUrl(ev.session_id, ev.captions_token);
  $("overlay-url").textContent = url;
  $("overlay-url").href = url;
  $("overlay").hidden = false;
}

// Copy: the overlay's URL onto the clipboard, and say whether it went. The clipboard API needs
// a secure page (https or localhost) and may be refused; then the link is selected and
// copied the old way (execCommand, which works on a plain http page), or left selected for a
// copy by hand, and the page says which.
async function copyOverlayUrl() {
  const url = $("overlay-url").textContent;
  try {
    if (!navigator.clipboard) throw new Error("no clipboard API: not a secure page");
    await navigator.clipboard.writeText(url);
    copyNote("copied");
    return;
  } catch (e) { /* below */ }
  let copied = false;
  try {
    const range = document.createRange();
    range.selectNodeContents($("overlay-url"));
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    copied = document.execCommand("copy");
  } catch (e) { /* no selection either: said below */ }
  copyNote(copied ? "copied" : "not copied: this page may not use the clipboard (it needs " +
                               "https or localhost); copy the link by hand");
}

// What Copy did, beside it (role=status: read out), for a few seconds
function copyNote(text) {
  clearTimeout(state.copyNoteTimer);
  $("overlay-copied").textContent = text;
  state.copyNoteTimer = setTimeout(() => { $("overlay-copied").textContent = ""; }, COPY_NOTE_MS);
}

// The session's transcript rendered as `responseFormat` by the server, read with its
// captions_token: while the meeting runs, its finals so far; after it, the final transcript
// (kept by the server after the session is gone), so the links work after the socket closed.
function transcriptUrl(sessionId, captionsToken, responseFormat) {
  return serverUrl(`v1/sessions/${encodeURIComponent(sessionId)}/transcript`) +
         `?token=${encodeURIComponent(captionsToken)}` +
         `&response_format=${encodeURIComponent(responseFormat)}`;
}

// Ask a session's transcript resource what it holds: {ok, status (HTTP), kept: its
// X-Livemeet-Transcript-Status ("running", "final", "revised"; null unless ok), response:
// the transcript as `responseFormat`}. Rejects where no server answers.
async function askTranscript(sessionId, captionsToken, responseFormat = "text") {
  // bounded: on a dead network path a fetch may hang for minutes, and the page waits on it
  // (Start, a refused resume's transcript)
  const options = typeof AbortSignal !== "undefined" && AbortSignal.timeout
    ? { signal: AbortSignal.timeout(TRANSCRIPT_FETCH_TIMEOUT_MS) } : {};
  const resp = await fetch(transcriptUrl(sessionId, captionsToken, responseFormat), options);
  return { ok: resp.ok, status: resp.status,
           kept: resp.ok ? resp.headers.get("X-Livemeet-Transcript-Status") : null,
           // where the revision is: revised, pending, failed or none (null: an older server)
           revision: resp.ok ? resp.headers.get("X-Livemeet-Revision") : null,
           response: resp };
}

// "meeting-2026-12-05-143015.srt": the meeting's start, in local time, to the second (to the
// minute, two meetings started in one minute downloaded as one name, the browser adding
// " (1)": a trial)
function exportName(startedAt, ext) {
  const d = new Date(startedAt);
  const p = (n) => String(n).padStart(2, "0");
  return `meeting-${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}-` +
         `${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}.${ext}`;
}

// captions: {session_id, captions_token}; note: what the links hold (so far, or final)
function showExport(captions, startedAt, note) {
  if (!captions || !captions.captions_token) return;
  for (const [id, format, ext] of EXPORTS) {
    const link = $(`export-${id}`);
    link.href = transcriptUrl(captions.session_id, captions.captions_token, format);
    link.download = exportName(startedAt, ext); // same-origin: the browser names the file
  }
  $("export-note").textContent = note;
  $("export").hidden = false;
}

// ---- speaker names

// The label `label` shows as: itself, or for a label merged away its merge's target, in
// turn (a target merged away later takes its merged labels along); bounded, in case of a cycle
function shownLabel(label) {
  for (let i = 0; i < state.merged.size && state.merged.has(label); i++) {
    label = state.merged.get(label);
  }
  return label;
}

// The name of the label `label` shows as, as the server last said, or that label itself
function speakerName(label) {
  const shown = shownLabel(label);
  return state.names.get(shown) || shown;
}

// A name can be sent while the session's socket is live (a rename after Stop still applies
// until the final transcript comes; after it, the server ignores one)
function canRename() {
  return state.live && !state.finished && state.ws !== null &&
         state.ws.readyState === WebSocket.OPEN;
}

// `name` stripped as the server strips it
function stripName(name) {
  return name.replace(NAME_EDGES, "");
}

// Why `name` (stripped, not empty) would be refused by the server, or "" if it would be
// accepted: the server's checks, in its order
function nameProblem(name) {
  if ([...name].length > MAX_SPEAKER_NAME_CHARS) {
    return `a name holds at most ${MAX_SPEAKER_NAME_CHARS} characters`;
  }
  if (NAME_FORBIDDEN.test(name)) return "a name may not hold control characters or line breaks";
  if (NAME_BIDI.test(name)) {
    return "a name may not hold bidirectional embedding, override or isolate characters " +
           "(U+202A-202E, U+2066-2069: often pasted along with a name from a chat)";
  }
  if (!NAME_VISIBLE.test(name)) {
    return "a name needs a visible character (a letter, digit, punctuation or symbol)";
  }
  return "";
}

// Ask for the label's name and send it; an empty answer removes the name (the label shows).
// A label merged away is named through its target (the server refuses a rename of it).
function renameSpeaker(label) {
  label = shownLabel(label);
  if (!SPEAKER_LABEL.test(label) || !canRename()) return;
  const answer = window.prompt(`Name for ${label} (empty: show ${label})`,
                               state.names.get(label) || "");
  if (answer === null) return; // cancelled
  const name = stripName(answer);
  const problem = name ? nameProblem(name) : "";
  if (problem) {
    setNote(`${label} not renamed: ${problem}`);
    return;
  }
  if (!canRename()) return; // the connection went while the prompt was open
  sendAwaiting(state.ws,
               JSON.stringify({ type: "speaker.rename", speaker: label, name: name || null }));
}

// The labels `label` stands for in the speakers list: it, then those merged into it
function labelsShownAs(label, labels) {
  return [label, ...[...labels].filter((other) => other !== label &&
                                                    shownLabel(other) === label).sort()];
}

// The speakers list: each label seen (or named) that is not merged away, with its name and
// the labels merged into it ("Alice (S01 + S03)"); a click renames it. Then the captions'
// speakers. A label's button stays the same element while the label is listed
// (state.speakerButtons): rebuilt, the one a keyboard user had just pressed Enter on took
// the focus with it (a trial).
function renderSpeakers() {
  const labels = new Set([...state.speakers, ...state.names.keys(), ...state.merged.keys()]);
  const buttons = [...labels]
    .filter((label) => SPEAKER_LABEL.test(label) && shownLabel(label) === label).sort()
    .map((label) => {
      let button = state.speakerButtons.get(label);
      if (!button) {
        button = document.createElement("button");
        button.className = "speaker-name";
        button.addEventListener("click", () => renameSpeaker(label));
        state.speakerButtons.set(label, button);
      }
      const all = labelsShownAs(label, labels).join(" + ");
      setText(button, state.names.has(label) ? `${state.names.get(label)} (${all})` : all);
      button.title = nameAction(label);
      button.style.color = speakerColour(label);
      setDisabled(button, !canRename());
      return button;
    });
  for (const [label, button] of state.speakerButtons) {
    if (!buttons.includes(button)) state.speakerButtons.delete(label); // merged away
  }
  placeChildren($("speakers-list"), buttons);
  const merge = $("merge-speakers");
  const canMerge = canRename() && buttons.length >= 2;
  // the merge that leaves one speaker disables "Merge two…" under the keyboard focus, which
  // then went to the page's body (Chromium): the speaker left takes it
  if (!canMerge && canRename() && buttons.length && document.activeElement === merge) {
    buttons[0].focus();
  }
  setDisabled(merge, !canMerge);
  setText($("speakers-hint"), speakersHint());
  $("speakers-hint").title = canRename() ? "" : namingNote();
  $("speakers").hidden = buttons.length === 0;
  // the captions' speaker buttons too (after the final or offline a click did nothing while
  // they looked live: a trial), and their names
  relabelCaptions();
}

// `parent` shows `nodes`, in this order. A child that stays is not taken out and put back:
// that would take the keyboard focus off it, and a live region would read it out again.
function placeChildren(parent, nodes) {
  const keep = new Set(nodes);
  for (const child of [...parent.children]) if (!keep.has(child)) child.remove();
  let next = parent.firstElementChild;
  for (const node of nodes) {
    if (node === next) next = next.nextElementSibling;
    else parent.insertBefore(node, next);
  }
}

// A write of textContent, even of the same text, replaces the node's text node: a node added
// to a live region. A new text goes into the text node there is instead (a text change,
// which #finals' aria-relevant leaves unread).
function setText(node, text) {
  if (node.textContent === text) return;
  const only = node.firstChild;
  if (only && only.nodeType === Node.TEXT_NODE && !only.nextSibling) only.data = text;
  else node.textContent = text;
}

// The labels of a merge as typed: "S03 S01", "S03 into S01", "s03 -> s01", "S03=S01", ...
const MERGE_ANSWER = /^\s*(S\d{1,15})\s*(?:into|->|→|=|,|\s)\s*(S\d{1,15})\s*$/i;

// Why merging `label` into `into` would be refused by the server, or "" if it would not
function mergeProblem(label, into) {
  const known = (l) => state.speakers.has(l) || state.merged.has(l) ||
                       [...state.merged.values()].includes(l);
  if (!known(label) || !known(into)) return "both must be labels this meeting has shown";
  if (state.merged.has(label)) return `${label} shows as ${shownLabel(label)} already`;
  if (shownLabel(into) === label) return `${into} shows as ${label} already`;
  return "";
}

// Ask which label to merge into which, and send it (docs/protocol.md, "Speaker merges")
function mergeSpeakers() {
  if (!canRename()) return;
  const answer = window.prompt("Merge two speakers: the label to merge, then the one it is " +
                               "(e.g. \"S03 S01\": S03 is S01 from now on)", "");
  if (answer === null) return; // cancelled
  const m = MERGE_ANSWER.exec(answer);
  if (!m) {
    setNote("not merged: type two labels, the one to merge first (e.g. \"S03 S01\")");
    return;
  }
  const [label, into] = [m[1].toUpperCase(), m[2].toUpperCase()];
  const problem = label === into ? "a label cannot be merged into itself"
                                 : mergeProblem(label, into);
  if (problem) {
    setNote(`${label} not merged into ${into}: ${problem}`);
    return;
  }
  if (!canRename()) return; // the connection went while the prompt was open
  sendAwaiting(state.ws, JSON.stringify({ type: "speaker.merge", speaker: label, into }));
}

// A caption line: [its times, its speaker, its text] (relabelCaptions finds the speaker there)
function segmentElement(seg) {
  const div = document.createElement("div");
  div.className = "segment";
  const time = document.createElement("span");
  time.className = "time";
  time.textContent = `${meetingTime(seg.start)}–${meetingTime(seg.end)}`;
  // a label the page can name is a button: reached by the keyboard (Tab, then Enter or
  // Space), named as the speaker it shows, described by what it does (showSpeaker)
  const nameable = SPEAKER_LABEL.test(seg.speaker);
  const who = document.createElement(nameable ? "button" : "span");
  who.className = "speaker";
  if (nameable) {
    who.type = "button";
    who.addEventListener("click", () => renameSpeaker(seg.speaker));
  }
  showSpeaker(who, seg.speaker);
  const text = document.createElement("span");
  text.textContent = seg.text;
  div.append(time, who, text);
  return div;
}

// A caption line's speaker element as the label `label` shows now: its name (or the label),
// the colour of the label it shows as (a merged one's target's), and on a button what a
// click does (a merged label names its target) and whether it can
function showSpeaker(who, label) {
  const shown = shownLabel(label);
  setText(who, speakerName(label));
  who.style.color = speakerColour(shown);
  if (who.type !== "button") return;
  setDisabled(who, !canRename());
  // its name is what it shows (the speaker): a caption line is read out as it reads, not as
  // "S01: name this speaker" (an aria-label, a trial); what a click does is its description
  who.title = nameAction(shown);
}

// What a click on a speaker button does, for `label` (one not merged away): a tooltip, and
// the button's accessible description. A disabled button said "click to name" too (a
// trial): offline it says when naming comes back, after the final only the label.
function nameAction(label) {
  if (!canRename()) {
    const note = namingNote();
    return note ? `${label}: ${note}` : label;
  }
  return state.names.has(label) ? `${label}: click to rename this speaker`
                                 : `${label}: click to name this speaker`;
}

// Why the speakers cannot be named now, and whether they will be again ("": never: the
// meeting is over)
function namingNote() {
  if (state.finished) return "";
  return state.stored ? "naming comes back once the meeting is resumed"
                      : "naming comes back once the page reconnects";
}

// The speakers list's heading: what a click does now (it said "click one to name them"
// beside disabled buttons and after the meeting's end: a trial), no longer than that: a longer
// one wrapped the list onto a second line at each drop, moving the captions (a trial); why and
// until when naming is paused goes in its tooltip, as in the buttons'
function speakersHint() {
  if (canRename()) return "Speakers (click one to name them):";
  return namingNote() ? "Speakers (naming paused):" : "Speakers:";
}

// Every caption line's speaker, in place, as the names and merges say now: lines rebuilt
// for a rename took the focus off the speaker a keyboard user had named, and a screen reader
// read the whole list of finals again (a trial). The lines are state.finals' and
// state.partial's, in order.
function relabelCaptions() {
  for (const [list, segments] of [[$("finals"), state.finals], [$("partial"), state.partial]]) {
    [...list.children].forEach((line, i) => {
      if (segments[i]) showSpeaker(line.children[1], segments[i].speaker);
    });
  }
}

// What a caption line shows of its segment, its speaker as the segment labels it
function lineKey(seg) {
  return JSON.stringify([seg.start, seg.end, seg.speaker, seg.text]);
}

// The finals shown become `segments` (transcript.final's, or after a revision). A line that
// reads the same as one of them stays the element it is (the final's segments are mostly the
// finals shown, a revision's often read as the finals they supersede), so the focus stays on
// it and a screen reader reads out only the lines put in (#finals: aria-relevant additions).
function showFinals(segments) {
  const shown = new Map(); // lineKey -> the lines shown that read so, in order
  [...$("finals").children].forEach((line, i) => {
    const key = lineKey(state.finals[i]);
    shown.set(key, [...(shown.get(key) || []), line]);
  });
  const lines = segments.map((seg) => {
    const same = shown.get(lineKey(seg));
    return same && same.length ? same.shift() : segmentElement(seg);
  });
  state.finals = segments;
  placeChildren($("finals"), lines);
}

// Labels not seen before join the speakers list
function noteSpeakers(segments) {
  const before = state.speakers.size;
  for (const seg of segments) state.speakers.add(seg.speaker);
  if (state.speakers.size !== before) renderSpeakers();
}

// A passing note in the status line: why a name or a merge was not sent. It replaced the
// recording status until a rename went through, for the rest of the meeting if none did (a
// trial): the watchdog puts the status back NOTE_MS later (endNote).
function setNote(text) {
  setStatus(text);
  state.note = text;
  state.noteUntil = monotonicMs() + NOTE_MS;
}

// The note's time is up (or a rename went through): the recording status again, unless the
// status has said something else since (a drop, Stop)
function endNote() {
  if (state.note && $("status").textContent === state.note && state.live && !state.ending &&
      state.liveStatus) setStatus(state.liveStatus);
  state.note = null;
  state.noteUntil = 0;
}

// The status line says `text` (a live region: read out as it changes, so a text it says
// already is not written again); `detail`, beside it and not read out, what changes too often
// to be heard: the wait before each reconnect ("reconnecting in 0.3 s… 0.5… 1.0…" was read
// out at every retry, a trial).
function setStatus(text, detail = "") {
  setText($("status"), text);
  setDetail(detail);
}

// Only what goes beside the status line: the status says what it said (the final's "done:
// …" while the page reconnects for its revision)
function setDetail(detail) {
  setText($("status-detail"), detail);
}

// Enable or disable `el`. A disabled element drops the keyboard focus to the page's body
// (Chromium): Enter on Stop, or a speaker button disabled at the final or by a drop, left a
// keyboard user nowhere and a screen reader silent (a trial). The status line takes the focus
// first (index.html: tabindex=-1): it is read out, and Tab goes on from the controls. The
// element it came from gets it back once enabled again (after a resume) while the focus is
// still on the status line: the user's place is kept through a drop.
function setDisabled(el, disabled) {
  if (disabled && !el.disabled && document.activeElement === el) {
    state.focusParked = el;
    $("status").focus();
  }
  el.disabled = disabled;
  if (!disabled && state.focusParked === el) {
    state.focusParked = null;
    if (document.activeElement === $("status") && el.isConnected !== false) el.focus();
  }
}

// The page's scroller is at its bottom (FOLLOW_SLACK_PX): the user follows the captions
function atBottom() {
  const el = document.scrollingElement;
  return !el || el.scrollHeight - el.scrollTop - el.clientHeight <= FOLLOW_SLACK_PX;
}

function scrollToBottom() {
  const el = document.scrollingElement;
  if (el) el.scrollTop = el.scrollHeight;
}

// The line under the downloads that says where the transcript's revision is; `detail`: its
// tooltip (the server's reason a revision failed)
function showRevision(text, detail = "") {
  $("revision").textContent = text;
  $("revision").title = detail;
  $("revision").hidden = false;
}

// The revision line once a revision of `count` segments is shown (live, or as stored)
function showRevised(count) {
  showRevision(`revised: the transcript below is a pass over the whole meeting (${count} ` +
               "segments)");
}

// transcript.revised: its segments take the place of the finals it supersedes, in time order
function revisedFinals(finals, ev) {
  const superseded = new Set(ev.supersedes);
  return [...finals.filter((seg) => !superseded.has(seg.id)), ...ev.segments]
    .sort((a, b) => a.start - b.start);
}

// A transcript frame's `merged` ({label: target}, where the session merged any): the merges
// the page may have missed (a resume after the final replays them too)
function noteMerged(merged) {
  if (!merged || typeof merged !== "object") return;
  for (const [label, into] of Object.entries(merged)) {
    if (typeof into === "string") state.merged.set(label, into);
  }
}

// The server holds `offset` frames of this meeting's audio: the first that are the user's
// (not Stop's moment of silence, EMPTY_STOP_S) make it one of the recent meetings
function noteAudioHeld(offset) {
  if (state.remembered || !(offset > 0) || state.nothing || !state.captions) return;
  state.remembered = true;
  rememberMeeting(state.captions, state.startedAt);
}

// What the meeting lacks, for the status: the audio dropped while offline (so far), and once,
// the first time it is said, the audio spoken during a reload (it stuck to every later
// status, a later restart's resume and the final included: a trial)
function lostNote() {
  const lost = state.buffer ? state.buffer.lostFrames / state.format.sample_rate : 0;
  const reload = state.afterReload;
  state.afterReload = false;
  return (lost > 0 ? ` (${lost.toFixed(1)} s of audio lost while offline)` : "") +
         (reload ? " (audio spoken while the page was reloading was not captured)" : "");
}

function onEvent(ev) {
  switch (ev.type) {
    case "session.ready": {
      // the server holds the names and merges, and a resume's ready frame says them
      // (`speakers`, `merged`): taken at once, a name removed while the page was offline
      // goes. Dropped until the replay's frames came, every resume made them flicker (a
      // trial); kept until the replay seemed over (2 s without a frame), a stall mid-replay
      // dropped them (session 40's). Merges are final (no unmerge): the page's stay.
      if (ev.resumed && ev.speakers) takeNames(ev);
      // the statuses name the session by its first characters, the full id in the line's
      // tooltip (as the recent meetings' list): a 32-character id took the status to 3-5 lines
      // on a phone, and each change of line count moved the captions (a trial at 375 px)
      const id = shortSessionId(ev.session_id);
      $("status-line").title = `session ${ev.session_id}`;
      state.revise = Boolean(ev.revise);
      renderSpeakers(); // the speakers list can be used again
      $("demo-banner").style.display = ev.demo ? "block" : "none";
      showOverlayUrl(ev);
      noteAudioHeld(ev.offset); // a resumed session's audio
      if (state.finished) {
        // resumed for the revision after the final: the meeting is over, its "done: …" and
        // downloads (final) stay ("finishing… waiting for its final transcript" and "the
        // finals so far" came back until the replayed final: session 39's trial)
        setDetail(`(reconnected to session ${id}: waiting for the revision)`);
        break;
      }
      showExport(state.captions, state.startedAt, "(the finals so far)");
      if (state.windingUp) {
        setStatus(`ending the meeting (the server refused a message of this page ` +
                  `${state.violations} times, the last: ${state.windingUp}): waiting for its ` +
                  "final transcript…");
        break;
      }
      if (state.ending) { // Stop came before this resume: `end` is sent (again)
        setStatus(`finishing… (reconnected to session ${id}: waiting for its ` +
                  "final transcript)");
        break;
      }
      if (state.micLost) {
        setStatus(`reconnected to session ${id}, but ${micLostNote()}`);
        break;
      }
      setStatus(`${ev.resumed ? "resumed" : "recording"} (session ${id}, ` +
                `model ${ev.model})${lostNote()}` +
                (state.refused ? ` after the server refused a message of this page ` +
                                 `(${state.refused}); the meeting goes on` : ""));
      state.refused = null;
      state.liveStatus = `recording (session ${id}, model ${ev.model})`;
      break;
    }
    case "audio.ack":
      state.buffer.ack(ev.offset);
      noteAudioHeld(ev.offset);
      if (monotonicMs() - state.savedAt >= ALIVE_EVERY_MS) saveSession();
      break;
    case "segment.partial":
      state.partial = ev.segments;
      $("partial").replaceChildren(...ev.segments.map(segmentElement));
      noteSpeakers(ev.segments);
      break;
    case "segment.final":
      if (state.seenFinals.has(ev.id)) break; // replayed after a resume: shown already
      state.seenFinals.add(ev.id);
      state.finals.push(ev);
      $("finals").append(segmentElement(ev));
      noteSpeakers([ev]);
      break;
    case "speaker.renamed":
      if (typeof ev.speaker !== "string") break;
      if (typeof ev.name === "string") state.names.set(ev.speaker, ev.name);
      else state.names.delete(ev.speaker); // null: the label shows again
      renderSpeakers();
      endNote(); // a name went through: the reason an earlier one did not is old news
      break;
    case "speaker.merged":
      if (typeof ev.speaker !== "string" || typeof ev.into !== "string") break;
      state.merged.set(ev.speaker, ev.into);
      renderSpeakers();
      break;
    case "transcript.final":
      noteMerged(ev.merged);
      state.finished = true;
      if (!state.finalAt) state.finalAt = monotonicMs(); // a resume replays it: the first counts
      clearSession(); // the meeting is over: nothing to resume after a reload
      state.partial = [];
      $("partial").replaceChildren();
      showFinals(ev.segments);
      for (const seg of ev.segments) state.speakers.add(seg.speaker);
      renderSpeakers(); // the speakers list is disabled: the meeting is over
      if (state.nothing && !ev.segments.length) {
        setStatus("stopped before the microphone gave any audio: nothing recorded");
      } else {
        setStatus(`done: ${duration(ev.duration)} of audio transcribed` +
                  `${FINISH_NOTES[ev.finish_reason] || ""}${lostNote()}${windUpNote()}`);
      }
      showExport(state.captions, state.startedAt, "(final)");
      state.revisionPending = state.revise;
      if (state.revise) {
        showRevision("revising: a pass over the whole meeting will replace the transcript " +
                     "below in a moment…");
      }
      break;
    case "transcript.revised":
      noteMerged(ev.merged);
      state.revisionPending = false;
      showFinals(revisedFinals(state.finals, ev));
      for (const seg of ev.segments) state.speakers.add(seg.speaker);
      renderSpeakers(); // the names given to labels stay: the revision carries the same labels
      showRevised(ev.segments.length);
      showExport(state.captions, state.startedAt, "(revised)");
      break;
    case "error":
      if (ev.code === "revision_failed") { // the session succeeded: its final stands
        state.revisionPending = false;
        // plainly: the server's reason ("decode failed: RuntimeError(…); transcript.final
        // stands") read as a fault of the meeting and said twice that the final stands (a
        // trial); it is kept for whoever looks (the console, the line's tooltip)
        console.warn(`revision_failed: ${ev.message}`);
        showRevision("not revised: the pass over the whole meeting did not succeed; the " +
                     "final transcript below stands", ev.message);
        break;
      }
      if (ev.code === "server_restarting" && state.session) { // its 1012 close is resumed
        setStatus("the server is restarting: the meeting resumes once it is back…");
        break;
      }
      if (ev.code === "not_found" && state.session) {
        // a resume refused: its 4404 close says what happened (sessionGone); said here too,
        // "error not_found: no live session…" was read out for a moment first (a trial)
        state.error = { code: ev.code, message: ev.message };
        break;
      }
      state.error = { code: ev.code, message: ev.message };
      // after the final, the server closes a meeting it ended itself (its storage failed, an
      // idle page): the final's "done: …" (how much audio it covers) stays, the error beside
      // it (it replaced it: the page said only "error storage_failed" over a kept final)
      setStatus(state.finished ? `${$("status").textContent}; then error ${ev.code}: ` +
                                 ev.message
                               : `error ${ev.code}: ${ev.message}`);
      break;
  }
}

// Before any recording, say which model serves (the demo banner must not wait for a session).
// keepStatus: a meeting stored before a reload holds the status line (its own steps report
// the server's state), so only the banner is set.
async function showServer(keepStatus = false) {
  try {
    const resp = await fetch("readyz");
    const info = await resp.json();
    $("demo-banner").style.display = info.demo ? "block" : "none";
    // index.html's text describes the Whisper demo backend; another demo (the scripted test
    // backend) got it too: named by its model instead
    if (info.demo && info.backend && info.backend !== "demo") {
      $("demo-banner").textContent = `Demo backend ${info.backend} (${info.model}): not ` +
        "MOSS-Transcribe-Diarize. Start the server with --model for it.";
    }
    if (keepStatus) return;
    setStatus(resp.ok ? `ready (model ${info.model})` : "server not ready: try again shortly");
  } catch (e) {
    if (!keepStatus) setStatus(`cannot reach the server: ${e.message}`);
  }
}

// A session stored by this tab before a reload: offer to resume it while the server still
// keeps it (its window counts from when the page last had it); past that, the server has
// ended it: offer its transcript. Returns it (null: none).
function offerStored() {
  const saved = loadSession();
  if (!saved) return null;
  if (saved.ending) {
    finishStored(saved);
    return saved;
  }
  const captions = { session_id: saved.session_id, captions_token: saved.captions_token };
  if (!storedExpired(saved)) {
    state.stored = saved;
    $("resume").hidden = false;
    // short enough for two lines beside the buttons (three moved the captions by a line at
    // the click on Resume: a trial)
    setStatus(`the meeting started at ${clock(saved.started_at)} is still open: press ` +
              "Resume meeting (audio spoken during the reload was not captured)");
    showExport(captions, saved.started_at, "(the finals so far)");
    // its captions overlay serves on while the server keeps the session: shown here, it no
    // longer appears at the resume's session.ready, pushing the captions down (a trial)
    showOverlayUrl(captions);
    showFinalsSoFar(saved);
    // the offer goes stale with the window: it is taken back then (a click after it found
    // no session, or worse, a session the server had just ended)
    state.offerTimer = setTimeout(() => { if (state.stored === saved) withdrawStored(); },
                                  storedWindowEnd(saved) - monotonicMs());
    return saved;
  }
  withdrawStored(saved, true);
  return saved;
}

// The stored session's window has passed since the page last had it: the server ended it
function storedExpired(saved) {
  return monotonicMs() >= storedWindowEnd(saved);
}

// When the stored session's window ends (monotonicMs): a window after the page last had it
function storedWindowEnd(saved) {
  return saved.aliveAtMono + saved.resume_window_s * 1000;
}

// The stored session (offered, or `saved`) ended on the server: no resume, its transcript
// (and its captions) instead. `away`: it ended before the page came back (a load past its
// window); else the offer ran out while the page showed it ("while this page was away" read
// oddly to a user who had watched the page: a trial).
function withdrawStored(saved = state.stored, away = false) {
  clearTimeout(state.offerTimer);
  state.stored = null;
  state.finalsOf = saved.session_id;
  state.finished = true; // its speakers cannot be named any more
  relabelCaptions();
  $("resume").hidden = true;
  $("overlay").hidden = true; // its session is over: the overlay has nothing to show
  clearSession();
  const when = clock(saved.started_at);
  // the server ends it as the window ends: "is ending" until its transcript is stored (it
  // said "has ended" beside the downloads' "the server is ending the meeting": a trial)
  const status = away ? () => `the meeting started at ${when} ended while this page was away`
    : (kept = "running") => `the meeting started at ${when} was not resumed within its window` +
      (kept ? `: the server ${kept === "running" ? "is ending" : "has ended"} it` : "");
  setStatus(status());
  offerTranscript({ session_id: saved.session_id, captions_token: saved.captions_token },
                  saved.started_at, status);
}

// Show the downloads of a session that is gone from this page if the server has its
// transcript (a final is kept after the session ends), and say so either way.
// A transcript still "running" there is a meeting the server is ending now (its resume window
// ran out as the page's did: the offer withdrawn at the window's end said "(the finals so
// far)" for good, a trial): asked again until its final is stored. `status`: the status
// line's text before the first ask, or a function of the transcript's state (`kept`:
// "running", "final", "revised"; null where the server has none) that says it; `since`: when
// the first ask was (monotonicMs).
async function offerTranscript(captions, startedAt, status = $("status").textContent,
                               since = monotonicMs()) {
  const said = typeof status === "function" ? status : () => status;
  if (!captions || !captions.captions_token) return;
  clearTimeout(state.offerPoll);
  // the page's own meeting (stored before a reload): its captions too, as the server has them
  const own = state.finalsOf === captions.session_id;
  try {
    const { ok, kept, response } = await askTranscript(
      captions.session_id, captions.captions_token, own ? "diarized_json" : "text");
    if (state.active) return; // a meeting started meanwhile: its own downloads show
    if (ok && own) await showServerFinals(response).catch(() => {}); // not JSON: no captions
    if (ok) {
      // the resource serves the newest: the revision once it came
      const notes = { final: "(final)", revised: "(revised)",
                      running: "(the finals so far: the server is ending the meeting)" };
      showExport(captions, startedAt, notes[kept] || "(the finals so far)");
      setStatus(`${said(kept)}: download its transcript below`);
      if (kept === "running" && monotonicMs() - since < TRANSCRIPT_POLL_MAX_MS) {
        state.offerPoll = setTimeout(() => offerTranscript(captions, startedAt, status, since),
                                     TRANSCRIPT_POLL_MS);
      }
      return;
    }
  } catch (e) { /* unreachable: said below */ }
  if (state.active) return;
  setStatus(`${said(null)}: the server has no transcript of it`);
}

// what a transcript resource's X-Livemeet-Transcript-Status says of an earlier meeting
const RECENT_NOTES = { running: " (still running)", final: "", revised: " (revised)" };

// The earlier meetings of RECENT_KEY the server still has, with their downloads (a tab closed
// mid-meeting leaves no other way to them) and the length of their audio; one it no longer
// has (404: past `serve --retention-days`, or another server; 401) leaves the list, and so
// does one that holds no audio but Stop's moment of silence (EMPTY_STOP_S: a meeting an older
// page kept, stopped before any audio; nothing to download). Not `current`, the meeting
// stored before the reload (offered for a resume, finishing, or ended while the page was
// away): the status line and the downloads above are its own (the list said "(revised)" of
// it while the status still asked for its transcript: a trial).
async function showRecent(current = null) {
  const checked = await Promise.all(recentMeetings().map(async (m) => {
    if (m.session_id === current) return { m, show: false };
    let answer;
    try {
      answer = await askTranscript(m.session_id, m.captions_token, "diarized_json");
    } catch (e) {
      return { m, show: true, note: " (the server did not answer)" };
    }
    if (answer.status === 404 || answer.status === 401) return { m, gone: true };
    let audioS = null;
    try {
      audioS = (await answer.response.json()).duration;
    } catch (e) { /* not JSON: listed without its length */ }
    if (typeof audioS === "number" && audioS <= EMPTY_STOP_S) return { m, gone: true };
    return { m, show: true, note: RECENT_NOTES[answer.kept] || "", audioS };
  }));
  // read again: a meeting started meanwhile joined the list
  const gone = new Set(checked.filter((c) => c.gone).map((c) => c.m.session_id));
  if (gone.size) saveRecentMeetings(recentMeetings().filter((m) => !gone.has(m.session_id)));
  const items = checked.filter((c) => c.show).map((c) => recentItem(c.m, c.note, c.audioS));
  $("recent-list").replaceChildren(...items);
  $("recent").hidden = items.length === 0;
}

// An earlier meeting: when it started (to the second), how much audio it holds (`audioS`, as
// the server said; null: unknown) and its session id's first characters, and its downloads.
// Two meetings that started in the same minute read the same with the start alone (a trial).
function recentItem(meeting, note, audioS) {
  const li = document.createElement("li");
  const when = document.createElement("span");
  const length = typeof audioS === "number" ? `, ${duration(audioS)} of audio` : "";
  when.textContent = new Date(meeting.started_at).toLocaleString([], {
    dateStyle: "medium", timeStyle: "medium" }) + length +
    `, session ${shortSessionId(meeting.session_id)}${note}:`;
  when.title = `session ${meeting.session_id}`;
  li.append(when);
  for (const [id, format, ext] of EXPORTS) {
    const link = document.createElement("a");
    link.href = transcriptUrl(meeting.session_id, meeting.captions_token, format);
    link.download = exportName(meeting.started_at, ext);
    link.textContent = id === "text" ? "text" : id.toUpperCase();
    li.append(" ", link);
  }
  return li;
}

function forgetRecent() {
  saveRecentMeetings([]);
  $("recent-list").replaceChildren();
  $("recent").hidden = true;
}

// Start a new meeting, or (saved: a session stored before a reload) resume that one.
async function start(saved) {
  saveApiKey();
  resetMeeting(saved);
  if (!window.isSecureContext || !navigator.mediaDevices) {
    // browsers expose the microphone only to https pages and to http://localhost
    throw new Error("the microphone needs https or localhost: open this page as " +
                    `https://${location.host}/ (serve --tls-cert/--tls-key) or from localhost`);
  }
  setStatus("connecting…");
  await openMicrophone(!saved);
  state.buffer = new ResumeBuffer(MAX_UNACKED_S * state.format.sample_rate);
  state.active = true;
  connect();
}

// A meeting stopped before this page was reloaded (Stop had sent `end`, its final had not
// come): the reloaded page offered "Resume meeting" as if it still recorded, whose click
// opened the microphone, got 4404 and showed nothing (a trial). What is left is the final,
// which needs no microphone: a resume that sends no audio, only `end` again (a session
// ending already ignores it; endWithoutAudio), gets it (docs/protocol.md "Resume": a session
// ended while detached resumes ENDING), and if the server has finished the meeting and let
// it go meanwhile (4404), the transcript resource has it (sessionGone).
function finishStored(saved) {
  resetMeeting(saved);
  Object.assign(state, { ending: true, endOnly: true, reloaded: false,
                         stoppedAt: saved.stoppedAtMono || monotonicMs(),
                         stoppedWallAt: saved.stopped_at || Date.now() });
  state.buffer = new ResumeBuffer(0); // no microphone: nothing to send
  state.active = true;
  setDisabled($("stop"), true); // pressed already
  setStatus(`finishing… (the meeting started at ${clock(saved.started_at)} was stopped ` +
            "before this page was reloaded: waiting for its final transcript)");
  showExport(state.captions, saved.started_at, "(the finals so far)");
  connect();
}

// The page and the state of a meeting from scratch: a new one, or (saved) one stored before
// a reload
function resetMeeting(saved) {
  // the resume of the meeting offered after a reload keeps its finals so far on show (the
  // server's, showFinalsSoFar): its replay adds only those they lack
  const resuming = saved && state.stored === saved;
  const kept = resuming ? state.finals : [];
  setDisabled($("start"), true);
  $("resume").hidden = true;
  $("partial").replaceChildren();
  $("revision").hidden = true;
  // the offered meeting's resume keeps its overlay link (session.ready gives the same), and
  // with its finals shown, the speakers list and their downloads: they went until
  // session.ready, and the captions jumped up and back (a trial)
  if (!resuming) $("overlay").hidden = true;
  if (!kept.length) {
    $("finals").replaceChildren();
    $("speakers-list").replaceChildren();
    $("export").hidden = true;
    $("speakers").hidden = true;
  }
  state.stored = null;
  clearTimeout(state.offerTimer);
  clearTimeout(state.offerPoll);
  if (!saved) clearSession(); // a new meeting: the stored one ends on the server by itself
  Object.assign(state, {
    opened: false, live: false, ending: false, finished: false,
    seenFinals: new Set(kept.map((seg) => seg.id)),
    flushing: false, onFlushed: null, nothing: false, micLost: false, active: false,
    restarting: false,
    revise: Boolean(saved && saved.revise), revisionPending: false, error: null, violations: 0,
    probedAt: 0, refused: null, windingUp: null, endOnly: false, unsentFrames: 0,
    stoppedAt: 0, stoppedWallAt: 0, finalAt: 0, remembered: false,
    finals: kept, partial: [], speakers: new Set(kept.map((seg) => seg.speaker)),
    // and their names and merges, until the resume's ready frame gives the server's: reset,
    // the kept lines showed bare labels until the replay named them (a trial)
    names: kept.length ? state.names : new Map(), merged: kept.length ? state.merged : new Map(),
    finalsOf: null,
    speakerButtons: kept.length ? state.speakerButtons : new Map(), attempt: 0,
    reloaded: Boolean(saved), afterReload: false,
    session: saved ? { session_id: saved.session_id, resume_token: saved.resume_token } : null,
    captions: saved ? { session_id: saved.session_id, captions_token: saved.captions_token }
                    : null,
    startedAt: saved ? saved.started_at : Date.now(),
    windowS: saved ? saved.resume_window_s : 0,
    // a resume after a reload retries while the window that began with the reload lasts
    dropAt: saved ? saved.aliveAtMono : 0,
    // a resumed session goes on at the rate it was declared at; a new one's is the context's
    format: { sample_rate: saved ? saved.sample_rate : SAMPLE_RATE, channels: 1 },
  });
  if (kept.length) renderSpeakers(); // no longer offered: naming comes back at session.ready
}

// The microphone, through the worklet, into takeAudio at the session's rate (`declare`: a new
// session's, chosen from the AudioContext's).
async function openMicrophone(declare) {
  state.stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  // a microphone that goes away (unplugged, a Bluetooth headset that dropped, its permission
  // withdrawn) ends its track, and the context would go on with silence: micLost
  for (const track of state.stream.getTracks()) track.onended = micLost;
  state.ctx = new AudioContext();
  if (declare) state.format.sample_rate = workletRate(state.ctx.sampleRate);
  await state.ctx.audioWorklet.addModule("pcm-worklet.js");
  const source = state.ctx.createMediaStreamSource(state.stream);
  state.node = new AudioWorkletNode(state.ctx, "pcm-worklet",
                                    { processorOptions: { outputRate: state.format.sample_rate } });
  // a frame of audio, or the answer to Stop's flush: {flushed: the samples held, maybe none}
  state.node.port.onmessage = (msg) => {
    const flushed = msg.data && msg.data.flushed !== undefined;
    const data = flushed ? msg.data.flushed : msg.data;
    if (data.byteLength) takeAudio(data);
    if (flushed && state.onFlushed) state.onFlushed();
  };
  source.connect(state.node);
}

// The microphone's track ended mid-meeting. Sending on would send silence as if it were the
// meeting (the page said "recording" over it: a trial); ending the meeting would split it in
// two where the user only has to plug the headset back in. So the page stops the audio,
// keeps the session (its keepalives hold it) and asks: Resume meeting goes on with the
// microphone the browser gives now (the time in between is not in the transcript), Stop
// finishes the meeting as ever.
function micLost() {
  if (!state.stream || state.ending || state.finished) return;
  stopAudio();
  state.micLost = true;
  $("resume").hidden = false;
  setStatus(micLostNote());
}

function micLostNote() {
  return "the microphone stopped (unplugged, or its headset disconnected): nothing is " +
         "recorded now; press Resume meeting to go on with a microphone, or Stop to finish " +
         "the meeting";
}

// Resume meeting after micLost: the microphone again, into the same session
async function reopenMicrophone() {
  $("resume").hidden = true;
  try {
    await openMicrophone(false);
  } catch (e) {
    stopAudio();
    $("resume").hidden = false;
    setStatus(`cannot open the microphone: ${e.message}; press Resume meeting to try again, ` +
              "or Stop to finish the meeting");
    return;
  }
  state.micLost = false;
  setStatus(state.live ? "recording again (the time the microphone was away is not in the " +
                         "transcript)" : "the microphone is back: reconnecting…");
}

// Audio for the session: kept for a resend until acknowledged, and sent while live (the
// microphone runs on through a drop: its audio waits in the buffer for the resume)
function takeAudio(data) {
  if (state.buffer.push(data) && state.live && state.ws.readyState === WebSocket.OPEN) {
    sendAwaiting(state.ws, data);
  }
}

// Open a socket for a new session, or (state.session set) to resume it.
function connect() {
  const ws = new WebSocket(serverUrl("v1/live", true));
  ws.binaryType = "arraybuffer";
  state.ws = ws;
  state.reached = false; // this socket opened: a server answered
  state.awaitingSince = monotonicMs(); // its open, then session.ready
  // the watchdog runs from a meeting's first socket to its last close
  if (!state.watchdog) state.watchdog = setInterval(watchdog, WATCHDOG_EVERY_MS);
  ws.onopen = () => {
    state.reached = true;
    state.opened = true;
    // a retry reached the server: its "next try in 0.3 s" stayed on through a slow
    // session.ready (5 s in a trial)
    if (state.attempt > 0) setDetail("(reached the server: waiting for it to answer…)");
    const start = { type: "start", sample_rate: state.format.sample_rate,
                    channels: state.format.channels, encoding: "pcm_s16le" };
    if (state.session) start.resume = state.session;
    if (apiKey()) start.api_key = apiKey();
    ws.send(JSON.stringify(start));
    state.keepalive = setInterval(() => ws.send(JSON.stringify({ type: "keepalive" })),
                                  KEEPALIVE_MS);
  };
  ws.onmessage = (msg) => {
    state.heardAt = monotonicMs();
    state.awaitingSince = 0;
    const ev = JSON.parse(msg.data);
    if (ev.type === "session.ready") onReady(ws, ev);
    if (ev.type === "audio.ack") { // shows nothing
      onEvent(ev);
      return;
    }
    const follow = atBottom();
    onEvent(ev);
    if (follow) scrollToBottom();
  };
  ws.onclose = (ev) => onClose(ws, ev, state.reached);
}

// Send what the server answers (audio: its ack; `end`: the final; a rename or merge: its
// answer): the watchdog expects to hear from it
function sendAwaiting(ws, data) {
  ws.send(data);
  if (!state.awaitingSince) state.awaitingSince = monotonicMs();
}

// Every WATCHDOG_EVERY_MS: a socket that owes an answer and has been silent past its limit is
// dead (no close may ever come: docs above ACK_TIMEOUT_MS), and a Stop whose final has not
// come in FINAL_GIVE_UP_MS is given up, as is a revision not come in REVISION_GIVE_UP_MS.
function watchdog() {
  const now = monotonicMs();
  if (state.noteUntil && now >= state.noteUntil) endNote();
  if (state.ending && !state.finished && state.stoppedAt &&
      now - state.stoppedAt > FINAL_GIVE_UP_MS) {
    giveUpFinal();
    return;
  }
  if (state.revisionPending && now - state.finalAt > REVISION_GIVE_UP_MS) {
    giveUpRevision();
    return;
  }
  const ws = state.ws;
  if (ws && state.live && statusWhileOwed()) {
    askForFinal(ws); // FINAL_QUIET_MS
    return;
  }
  if (!ws || !state.awaitingSince) return;
  let limit = ACK_TIMEOUT_MS;
  if (!state.reached) limit = CONNECT_TIMEOUT_MS;
  else if (!state.live) limit = READY_TIMEOUT_MS;
  const silentMs = now - state.awaitingSince;
  if (silentMs >= limit) dropDeadSocket(ws, silentMs);
}

// `ws` carries nothing any more: close it and resume as after a close without a close frame
function dropDeadSocket(ws, silentMs) {
  // the server may have let the session go since it was last heard from: the resume window
  // counts from then
  if (!state.dropAt && state.heardAt) state.dropAt = state.heardAt;
  const reached = state.reached;
  forgetSocket(ws);
  onClose(ws, { code: 1006, why: `no answer from the server for ${Math.round(silentMs / 1000)} s` },
          reached);
}

// The transcript resource's status while the server still makes what it owes this page: the
// final after `end` ("running": it decodes), the revision after the final ("final": it
// revises); null when it owes neither
function statusWhileOwed() {
  if (state.ending && !state.finished) return "running";
  if (state.revisionPending) return "final";
  return null;
}

// After `end` (or the final, while its revision is due), FINAL_QUIET_MS without a word from
// the server: is what it owes out (the socket dead) or still being made? The transcript
// resource says.
async function askForFinal(ws) {
  const quietMs = monotonicMs() - Math.max(state.heardAt, state.probedAt);
  if (state.probing || quietMs < FINAL_QUIET_MS || !state.captions) return;
  state.probing = true;
  let kept = null;
  let revision = null;
  try {
    const answer = await askTranscript(state.captions.session_id, state.captions.captions_token);
    kept = answer.ok ? answer.kept : "gone";
    revision = answer.revision;
  } catch (e) { /* no server reached: the path is down too */ }
  state.probing = false;
  state.probedAt = monotonicMs();
  const making = statusWhileOwed();
  if (ws !== state.ws || !making) return; // moved on meanwhile
  // still at it: the socket may well be alive. "final" while a revision is owed is that only
  // if the revision is still coming: one that failed, or none coming, was said on a socket
  // that is dead (the page waited out its 11-minute bound on "revising…": a trial)
  const gaveUp = making === "final" && (revision === "failed" || revision === "none");
  if (kept === making && !gaveUp) return;
  dropDeadSocket(ws, monotonicMs() - state.heardAt);
}

function stopWatchdog() {
  clearInterval(state.watchdog);
  state.watchdog = null;
}

// Close `ws` and hear nothing more of it (on a dead path its close event may come minutes
// later, or never)
function forgetSocket(ws) {
  ws.onopen = ws.onmessage = ws.onclose = null;
  try {
    ws.close();
  } catch (e) { /* closed already */ }
}

// The page waits no more for the server (its socket, its reconnects): the meeting is over
// here
function stopWaiting() {
  clearTimeout(state.retry);
  clearInterval(state.keepalive);
  if (state.ws) forgetSocket(state.ws);
  state.live = false;
  state.ending = false;
  state.revisionPending = false;
  state.stoppedAt = state.stoppedWallAt = 0;
  state.awaitingSince = state.dropAt = state.unreachableAt = 0;
  state.active = false;
  stopWatchdog();
  stopAudio();
  clearSession();
  renderSpeakers();
  setDisabled($("start"), false);
  setDisabled($("stop"), true);
}

// No final FINAL_GIVE_UP_MS after Stop: stop waiting, and say where the transcript is
function giveUpFinal() {
  stopWaiting();
  setStatus(`no final transcript ${Math.round(FINAL_GIVE_UP_MS / 60000)} minutes after Stop: ` +
            "the page stopped waiting; the server stores the meeting's transcript once it " +
            "has it (the downloads below)");
}

// No revision REVISION_GIVE_UP_MS after the final: stop waiting; the final shown stands
function giveUpRevision() {
  stopWaiting();
  showRevision(`no revision ${Math.round(REVISION_GIVE_UP_MS / 60000)} minutes after the ` +
               "final transcript: the page stopped waiting, and the final transcript below " +
               "stands (the downloads serve the revision if the server stores one later)");
}

// The session is ready (new or resumed): send what it lacks, from its offset, then go live.
function onReady(ws, ev) {
  state.session = ev.resume_token // null: resume is off on this server
    ? { session_id: ev.session_id, resume_token: ev.resume_token } : null;
  state.windowS = ev.resume_window_s;
  if (ev.captions_token) {
    state.captions = { session_id: ev.session_id, captions_token: ev.captions_token };
  }
  state.attempt = 0;
  state.dropAt = 0;
  state.unreachableAt = 0;
  state.restarting = false;
  if (state.reloaded) {
    // the microphone's audio so far is new: it goes on from the offset the server holds
    state.buffer.rebase(ev.offset);
    state.reloaded = false;
    state.afterReload = true;
  }
  if (state.session) saveSession();
  state.buffer.ack(ev.offset);
  if (state.windingUp || state.endOnly) {
    endWithoutAudio(ws, ev.offset);
    return;
  }
  for (const data of state.buffer.from(ev.offset)) sendAwaiting(ws, data);
  state.live = true;
  // Stop came while offline (or a drop came after `end`: the server ignores a second one);
  // while Stop waits for the microphone's last samples, it sends `end` after them
  if (state.ending) {
    if (!state.flushing) sendAwaiting(ws, JSON.stringify({ type: "end" }));
  } else setDisabled($("stop"), false);
}

// The server refused a message of this page once more after MAX_VIOLATION_RESUMES resumes
// (`why`): the recording stops, and one last resume ends the meeting (endWithoutAudio), so
// that its final transcript comes now rather than once the server's resume window ran out.
function windUp(why) {
  state.windingUp = why;
  stopAudio();
  state.micLost = false;
  $("resume").hidden = true;
  setDisabled($("stop"), true);
  state.ending = true;
  if (!state.stoppedAt) { // FINAL_GIVE_UP_MS applies
    state.stoppedAt = monotonicMs();
    state.stoppedWallAt = Date.now();
  }
}

// The last resume of windUp, or the resume of a meeting stopped before a reload (endOnly): no
// audio (windUp: what the server refused may be in it, a frame it would refuse again;
// endOnly: the microphone's audio went with the old page), only `end`, after a moment of
// silence where the session holds no audio on disk (`end` needs some: docs/protocol.md; the
// server skips it if it has those frames)
function endWithoutAudio(ws, offset) {
  state.unsentFrames = Math.max(0, state.buffer.next - offset);
  if (!offset) {
    sendAwaiting(ws, new ArrayBuffer(Math.round(state.format.sample_rate * EMPTY_STOP_S) *
                                     BYTES_PER_FRAME));
  }
  sendAwaiting(ws, JSON.stringify({ type: "end" }));
  state.live = true;
}

// What the final's status adds after windUp: why the meeting ended, and what it lacks
function windUpNote() {
  if (!state.windingUp) return "";
  const unsentS = state.unsentFrames / state.format.sample_rate;
  return `; the page ended the meeting after the server refused a message of it ` +
         `${state.violations} times (the last: ${state.windingUp})` +
         (unsentS > 0 ? `: its last ${unsentS.toFixed(1)} s of audio were not sent` : "");
}

function onClose(ws, ev, reached) {
  clearInterval(state.keepalive);
  state.live = false;
  if (ws !== state.ws) return; // an old socket
  state.awaitingSince = 0;
  renderSpeakers(); // offline: no renames until the session is back
  if (state.unloading) return; // the page is going: its stored session stays for a resume
  const error = state.error;
  state.error = null;
  // a refused message: the server kept the session (at most MAX_VIOLATION_RESUMES a meeting,
  // then once more to end it: windUp)
  const refused = VIOLATION_CLOSES.includes(ev.code);
  const lastResume = refused && state.violations === MAX_VIOLATION_RESUMES &&
                     !state.windingUp && !state.finished;
  const violation = refused && (state.violations < MAX_VIOLATION_RESUMES || lastResume);
  // after the final, only the revision it promised is left to resume for
  const resumable = state.session && (!state.finished || state.revisionPending) &&
                    (RESUMABLE_CLOSES.includes(ev.code) || violation);
  if (resumable) {
    if (violation) state.violations += 1;
    const now = monotonicMs();
    if (!state.dropAt) state.dropAt = now;
    else if (!reached) state.unreachableAt = now; // a retry found no server
    // a restart: down until its next start, which keeps the session a window from then
    if (ev.code === SERVICE_RESTART) state.unreachableAt = now;
    // past the resume window the server has ended the session: nothing left to resume
    if (now < resumeDeadlineMs(state.dropAt, state.windowS, state.unreachableAt)) {
      const delay = reconnectDelayMs(state.attempt++);
      // a restart: the retries that find no server meanwhile are that restart too
      if (ev.code === SERVICE_RESTART) state.restarting = true;
      let why = ev.why || (state.restarting ? "the server is restarting" : "connection lost");
      if (violation) {
        // said again once resumed: the resume's own status would replace it at once
        state.refused = error ? `${error.code}: ${error.message}` : `closed ${ev.code}`;
        why = `the server refused a message of this page (${state.refused}) and kept the ` +
              "meeting";
      }
      if (lastResume) {
        windUp(state.refused);
        why = `the server refused a message of this page ${state.violations} times (the ` +
              `last: ${state.refused}): recording stopped; ending the meeting`;
      }
      // said once per drop: each retry's wait goes beside it, out of the live region; after
      // Stop pressed offline its acknowledgement stays (a retry's "connection lost" replaced
      // it and was read out again: a trial)
      const offlineStop = state.ending && !state.finished && !state.live &&
                          !state.windingUp && !violation;
      const next = `next try in ${(delay / 1000).toFixed(1)} s`;
      if (state.finished) {
        // the final is shown: its "done: …" stays (a drop replaced it with "stopped: the
        // meeting ends once the page reaches the server again", a trial); the reconnect
        // for the revision goes beside it, and the revision line says "revising…"
        setDetail(`(${why}: ${reconnectGoal()}, ${next})`);
      } else {
        setStatus(offlineStop ? stoppedOfflineStatus() : `${why}: ${reconnectGoal()}`, `(${next})`);
      }
      state.retry = setTimeout(connect, delay);
      return;
    }
    setStatus("connection lost for longer than the server keeps the session: " +
              "press Start for a new one");
  }
  state.dropAt = 0;
  state.unreachableAt = 0;
  state.stoppedAt = state.stoppedWallAt = 0; // no final to wait for any more
  state.active = false;
  stopWatchdog();
  stopAudio();
  if (state.micLost) $("resume").hidden = true; // nothing left to resume it into
  state.micLost = false;
  clearSession(); // ended, refused or taken over: not this page's to resume any more
  if (ev.code === 4404) {
    // not_found: the server no longer has the session (it finished it, its window ran out,
    // or it restarted without it). Start waits for its transcript: enabled beside
    // "finishing… asking it for the transcript it stored" it offered a new meeting while
    // the page still said this one was finishing (session 39's trial)
    setDisabled($("stop"), true);
    sessionGone().finally(() => setDisabled($("start"), false));
    return;
  } else if (ev.code === 4401 && !state.session) {
    // unauthorized: the server asks for an API key (its error said which problem)
    setStatus(`${$("status").textContent}: enter the server's API key above, then Start`);
  } else if (!state.opened) setStatus(`cannot connect to the server (closed ${ev.code})`);
  else if (ev.code === 1001) {
    // the server shut down and drained the session: the transcript above is final up to
    // where it stopped; a new recording continues on a server that is up
    setStatus("the server restarted: the transcript is final up to here; press Start to go on");
  } else if (refused && state.session && !state.finished) {
    // refused even while the page ended the meeting (windUp): the server ends the session
    // once its window passes and stores its transcript (the downloads, shown since
    // session.ready, then serve it)
    setStatus(`${$("status").textContent} (closed ${ev.code}, after ${state.violations} ` +
              "refused messages): recording stopped, and the page could not end the meeting: " +
              `the server ends it within ${state.windowS} s and keeps its transcript, ` +
              "download it below then; press Start for a new meeting");
  } else if (ev.code !== 1000 && !resumable) {
    setStatus(`${$("status").textContent} (closed ${ev.code})`);
  }
  setDisabled($("start"), false);
  setDisabled($("stop"), true);
}

// A resume got not_found (4404): the server has let the session go, maybe after finishing it:
// its final (and revision) went out over a socket whose path had died, or to the page before
// a reload. The page then said "the meeting had ended", kept the captions it had (none after
// a reload) and "revising…" for ever (a trial). The transcript resource keeps a finished
// meeting's transcript: the page shows it as transcript.final (or .revised) would have
// (segments, names, merges); else it says the meeting ended and offers what there is.
async function sessionGone() {
  const captions = state.captions;
  const sessionId = state.session ? state.session.session_id : "";
  const gone = `the meeting had ended: the server no longer has session ${sessionId}`;
  const notes = lostNote() + windUpNote();
  const stopped = state.ending || state.finished; // the page had asked for the final
  const hadFinal = state.finished; // only its revision was owed: "done: …" stays
  const asking = "the server has let the session go: asking it for the transcript it stored…";
  if (hadFinal) setDetail(`(${asking})`);
  else setStatus(stopped ? `finishing… (${asking})` : `${gone}: asking it for the meeting's ` +
                                                      "transcript…");
  let stored = null;
  try {
    stored = await storedTranscript(captions);
  } catch (e) { /* no server reached, or not JSON: as not stored */ }
  if (state.captions !== captions || state.active) return; // a new meeting meanwhile
  if (stored) {
    showStoredTranscript(stored, stopped ? "" : gone, notes, hadFinal);
    return;
  }
  if (state.revisionPending) {
    state.revisionPending = false;
    showRevision("no revision came before the connection was lost: the downloads serve it " +
                 "if the server stores one");
  }
  setStatus(`${gone}${notes}`);
  offerTranscript(captions, state.startedAt);
}

// The transcript statuses (X-Livemeet-Transcript-Status) of a meeting the server finished
const FINISHED = ["final", "revised"];

// The meeting's transcript as the server stored it, {kept: "final" or "revised", body: its
// diarized_json (segments with ids, times and labels; `speakers`, {label: name}, and
// `merged`, {label: target}, where any; `duration`), finishReason: why its decode stopped
// (X-Livemeet-Finish-Reason: no format carries it; null from an older server)}, or null
// where it holds no finished one.
// Rejects where no server answers or the body is not JSON.
async function storedTranscript(captions) {
  if (!captions || !captions.captions_token) return null;
  const answer = await askTranscript(captions.session_id, captions.captions_token,
                                     "diarized_json");
  if (!answer.ok || !FINISHED.includes(answer.kept)) return null;
  const body = await answer.response.json();
  if (!body || !Array.isArray(body.segments)) return null;
  return { kept: answer.kept, body,
           finishReason: answer.response.headers.get("X-Livemeet-Finish-Reason") };
}

// The meeting as the server stored it (storedTranscript) replaces what the page shows, as its
// transcript.final or transcript.revised would have: the names and merges are the server's
// last word. `gone`: what the status says first where the page had not stopped the meeting
// itself (the server ended it), else it says "done" as after a final; `notes`: lostNote's;
// `hadFinal`: the page had the final, and lost only what came after it (the revision).
function showStoredTranscript({ kept, body, finishReason }, gone, notes, hadFinal = false) {
  const follow = atBottom();
  const segments = segmentsOf(body);
  state.finished = true;
  state.revisionPending = false;
  state.partial = [];
  $("partial").replaceChildren();
  takeNames(body);
  for (const seg of segments) {
    state.seenFinals.add(seg.id);
    state.speakers.add(seg.speaker);
  }
  showFinals(segments);
  renderSpeakers();
  const audio = (typeof body.duration === "number"
    ? `${duration(body.duration)} of audio transcribed` : "transcribed") +
    (FINISH_NOTES[finishReason] || ""); // as the final's status says it
  setStatus(gone ? `${gone}; it had ended the meeting: below is the transcript it stored ` +
                   `(${audio})${notes}`
                 : `done: ${audio}${notes} (` + (hadFinal
                   ? "the connection was lost after the final"
                   : "the connection lost the server's last messages") +
                   ": below is the transcript it stored)");
  if (kept === "revised") {
    showRevised(segments.length);
  } else if (state.revise) {
    showRevision("not revised: no revision of the whole meeting came; the final transcript " +
                 "below stands");
  } else $("revision").hidden = true;
  showExport(state.captions, state.startedAt, kept === "revised" ? "(revised)" : "(final)");
  if (follow) scrollToBottom();
}

// A transcript resource's diarized_json segments as segment.final events carry them (those
// without a speaker or text left out)
function segmentsOf(body) {
  return body.segments
    .filter((seg) => seg && typeof seg.speaker === "string" && typeof seg.text === "string")
    .map((seg) => ({ id: String(seg.id), start: Number(seg.start), end: Number(seg.end),
                     speaker: seg.speaker, text: seg.text }));
}

// A transcript resource's names and merges, or a resume's ready frame's, become the page's (the
// server's last word)
function takeNames(body) {
  const names = body.speakers && typeof body.speakers === "object" ? body.speakers : {};
  state.names = new Map(Object.entries(names).filter(([, name]) => typeof name === "string"));
  noteMerged(body.merged);
}

// A meeting offered for a resume after a reload (`saved`): its finals so far, as the server
// holds them, shown until the resume replays them (the page showed no captions beside its
// "(the finals so far)" download: a trial). Nothing where the server does not answer, or
// once the offer is gone (a click on Resume; at the window's end offerTranscript takes over).
async function showFinalsSoFar(saved) {
  try {
    const answer = await askTranscript(saved.session_id, saved.captions_token, "diarized_json");
    if (answer.ok && state.stored === saved) await showServerFinals(answer.response, saved);
  } catch (e) { /* no captions until the resume replays them */ }
}

// The captions of the meeting this page shows from the transcript resource (one stored before
// a reload: `saved`, the offer to resume it, or state.finalsOf once that is withdrawn), from
// its diarized_json `response`, where that meeting is still the page's.
async function showServerFinals(response, saved = null) {
  const body = await response.json();
  const still = saved ? state.stored === saved : state.finalsOf !== null && !state.active;
  if (!still || !body || !Array.isArray(body.segments)) return;
  takeNames(body);
  const segments = segmentsOf(body);
  showFinals(segments);
  // the speakers list too, disabled until a resume (it stayed hidden beside named captions:
  // session 40's trial); it relabels the lines kept from an earlier answer
  for (const seg of segments) state.speakers.add(seg.speaker);
  renderSpeakers();
}

// What the page reconnects for: after Stop, to end the meeting (Stop pressed while the server
// was down went unacknowledged: the status kept "connection lost: reconnecting…", a trial);
// after the final, for its revision
// What the status says from Stop pressed while the page could not reach the server until it
// does again
function stoppedOfflineStatus() {
  return `stopped: the meeting ends once the page reaches the server again (${reconnectGoal()})`;
}

function reconnectGoal() {
  if (state.finished) return "reconnecting for the revision…";
  if (state.ending && !state.windingUp) return "reconnecting to end the meeting…";
  return "reconnecting…";
}

function stopAudio() {
  if (state.node) state.node.port.onmessage = null;
  if (state.stream) {
    state.stream.getTracks().forEach((t) => {
      t.onended = null; // stopped here: not lost
      t.stop();
    });
  }
  if (state.ctx) state.ctx.close();
  state.node = state.stream = state.ctx = null;
}

function stop() {
  setDisabled($("stop"), true);
  $("resume").hidden = true; // after micLost: the meeting ends without it
  state.micLost = false;
  state.ending = true;
  state.stoppedAt = monotonicMs();
  state.stoppedWallAt = Date.now();
  state.flushing = true;
  flushMicrophone(() => {
    state.flushing = false;
    stopAudio();
    if (state.buffer && state.buffer.next === 0) {
      // nothing recorded: silence lets `end` end the session at once (EMPTY_STOP_S)
      state.nothing = true;
      takeAudio(new ArrayBuffer(Math.round(state.format.sample_rate * EMPTY_STOP_S) *
                                BYTES_PER_FRAME));
    }
    if (state.live) {
      sendAwaiting(state.ws, JSON.stringify({ type: "end" }));
      setStatus("finishing…");
    } else { // offline: the resume sends `end` after the audio it still owes
      setStatus(stoppedOfflineStatus(), $("status-detail").textContent);
    }
    saveSession(); // stopped: a reload fetches the final, and asks for no microphone
  });
}

// The worklet's samples of the frame it is filling, taken as audio; then `done`
function flushMicrophone(done) {
  let called = false;
  const once = () => {
    if (called) return;
    called = true;
    state.onFlushed = null;
    done();
  };
  if (!state.node) {
    once();
    return;
  }
  state.onFlushed = once;
  state.node.port.postMessage("flush");
  setTimeout(once, FLUSH_WAIT_MS);
}

// The controls stay at the top of the window (index.html, #controls: sticky) over what
// scrolls under them: what the browser scrolls into view (the focus moved by Tab, Shift+Tab
// back through the captions) must land below them, not under them (found at 375 px wide,
// where a long status makes them tall). index.html gives the elements after the bar a
// scroll-margin-top of --controls-height, the bar's height kept here.
function keepClearOfControls() {
  if (typeof ResizeObserver === "undefined") return; // the page works on without it
  const controls = $("controls");
  new ResizeObserver(() => {
    document.documentElement.style.setProperty("--controls-height",
                                               `${controls.offsetHeight}px`);
  }).observe(controls);
}

function startClicked(saved) {
  start(saved).catch((e) => {
    stopAudio(); // release a microphone that was granted before the failure
    setStatus(`cannot start: ${e.message}`);
    setDisabled($("start"), false);
    if (saved) { // the stored session is still there to resume
      state.stored = saved;
      $("resume").hidden = false;
    }
  });
}

$("api-key").addEventListener("change", saveApiKey);
$("start").addEventListener("click", () => startClicked(null));
$("resume").addEventListener("click", () => {
  if (state.micLost) reopenMicrophone();
  else if (state.stored && storedExpired(state.stored)) withdrawStored(); // a late click
  else if (state.stored) startClicked(state.stored);
});
// closing (or reloading) the tab mid-meeting: the browser asks first (the meeting would go on
// without its microphone; a reload offers to resume it, and a new tab lists a closed tab's
// meeting with its transcript, RECENT_KEY); not once Stop was pressed (the final is coming,
// and the server keeps it)
window.addEventListener("beforeunload", (e) => {
  if (!state.active || state.ending) return;
  e.preventDefault();
  e.returnValue = ""; // what older browsers need to ask
});
// a reload or a closed tab: keep the stored session (and when the page last had it)
window.addEventListener("pagehide", () => {
  if (state.live) saveSession();
  state.unloading = true;
});
$("stop").addEventListener("click", stop);
$("merge-speakers").addEventListener("click", mergeSpeakers);
$("overlay-copy").addEventListener("click", copyOverlayUrl);
$("recent-forget").addEventListener("click", forgetRecent);
loadApiKey();
keepClearOfControls();
// index.html ships Start disabled and the status "loading…": a browser may draw the page
// before this script runs, and its "idle" with Start enabled was drawn for a frame before a
// stored meeting's "finishing…" (a trial). A stored meeting first: asking readyz first left
// them on show for the fetch's time. Nothing stored: "idle" beside the enabled Start (it sat
// beside "loading…" until readyz answered), then readyz's "ready".
setDisabled($("start"), false);
const storedAtLoad = offerStored();
if (!storedAtLoad) setStatus("idle");
showServer(storedAtLoad !== null)
  .then(() => showRecent(storedAtLoad && storedAtLoad.session_id));
