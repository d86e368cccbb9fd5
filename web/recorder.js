// Microphone -> /v1/live (protocol v0, docs/protocol.md) -> partial (grey) and final captions.
// A dropped connection (close 1006) is resumed (docs/protocol.md, "Resume"): the page keeps the
// audio the server has not acknowledged (`audio.ack`) and sends it again from the offset the
// resumed `session.ready` reports; finals it has shown already are skipped by id.
// Downloads of the transcript (JSON, SRT, VTT, text) link to the server's transcript resource
// (docs/protocol.md, "Other endpoints"), which renders them with the uploads' writers.
const KEEPALIVE_MS = 10000;
const SAMPLE_RATE = 16000; // Hz; what pcm-worklet.js posts (mono PCM16 LE)
const BYTES_PER_FRAME = 2; // one mono PCM16 sample frame
// audio kept for a resend, at most: past it (a long outage, or a server that stopped
// acknowledging), new audio is dropped, neither sent nor kept, and the page says how much;
// the session's audio stays contiguous (the transcript skips what was dropped)
const MAX_UNACKED_S = 60;
const RECONNECT_FIRST_MS = 250; // first retry after a drop, doubling up to RECONNECT_MAX_MS
const RECONNECT_MAX_MS = 5000;
const RESUMABLE_CLOSES = [1005, 1006]; // no close frame: the network, not the server, ended it
// a colour per speaker label, by its number (S01 the first), so the captions overlay
// (web/captions.js, the same palette and rule) colours each speaker as this page does
const SPEAKER_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                         "#e377c2", "#17becf"];

// the downloads: [link id suffix, the resource's response_format, file extension]; JSON is
// diarized_json (segments with ids, times and speakers; plain json is the text alone)
const EXPORTS = [["json", "diarized_json", "json"], ["srt", "srt", "srt"],
                 ["vtt", "vtt", "vtt"], ["text", "text", "txt"]];

const $ = (id) => document.getElementById(id);
const state = { ws: null, ctx: null, stream: null, node: null, keepalive: null,
                opened: false, session: null, captions: null, startedAt: 0,
                buffer: null, live: false, ending: false,
                finished: false, seenFinals: new Set(), windowS: 0, dropAt: 0, attempt: 0,
                retry: null };

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

function reconnectDelayMs(attempt) {
  return Math.min(RECONNECT_MAX_MS, RECONNECT_FIRST_MS * 2 ** attempt);
}

function speakerColour(speaker) {
  const m = /^S(\d+)$/.exec(speaker);
  let n = m ? Number(m[1]) - 1 : 0;
  if (!m) for (const ch of speaker) n = (n * 31 + ch.charCodeAt(0)) >>> 0;
  return SPEAKER_COLOURS[n % SPEAKER_COLOURS.length];
}

// The captions overlay's URL for a session (docs/protocol.md, "Captions"): read-only, so
// it may be handed to whoever runs the stream (the resume token stays on this page).
function overlayUrl(sessionId, captionsToken) {
  return `${location.protocol}//${location.host}/captions.html` +
         `?session=${encodeURIComponent(sessionId)}&token=${encodeURIComponent(captionsToken)}`;
}

function showOverlayUrl(ev) {
  if (!ev.captions_token) return;
  const url = overlayUrl(ev.session_id, ev.captions_token);
  $("overlay-url").textContent = url;
  $("overlay-url").href = url;
  $("overlay").hidden = false;
}

// The session's transcript rendered as `responseFormat` by the server, read with its
// captions_token: while the meeting runs, its finals so far; after it, the final transcript
// (kept by the server after the session is gone), so the links work after the socket closed.
function transcriptUrl(sessionId, captionsToken, responseFormat) {
  return `${location.protocol}//${location.host}/v1/sessions/` +
         `${encodeURIComponent(sessionId)}/transcript?token=${encodeURIComponent(captionsToken)}` +
         `&response_format=${encodeURIComponent(responseFormat)}`;
}

// "meeting-2026-12-05-1430.srt": the meeting's start, in local time
function exportName(startedAt, ext) {
  const d = new Date(startedAt);
  const p = (n) => String(n).padStart(2, "0");
  return `meeting-${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}-` +
         `${p(d.getHours())}${p(d.getMinutes())}.${ext}`;
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

function segmentElement(seg) {
  const div = document.createElement("div");
  div.className = "segment";
  const time = document.createElement("span");
  time.className = "time";
  time.textContent = `${seg.start.toFixed(1)}–${seg.end.toFixed(1)}`;
  const who = document.createElement("span");
  who.className = "speaker";
  who.textContent = seg.speaker;
  who.style.color = speakerColour(seg.speaker);
  const text = document.createElement("span");
  text.textContent = seg.text;
  div.append(time, who, text);
  return div;
}

function setStatus(text) { $("status").textContent = text; }

function lostNote() {
  const lost = state.buffer ? state.buffer.lostFrames / SAMPLE_RATE : 0;
  return lost > 0 ? ` (${lost.toFixed(1)} s of audio lost while offline)` : "";
}

function onEvent(ev) {
  switch (ev.type) {
    case "session.ready":
      $("demo-banner").style.display = ev.demo ? "block" : "none";
      showOverlayUrl(ev);
      if (ev.captions_token) {
        state.captions = { session_id: ev.session_id, captions_token: ev.captions_token };
      }
      showExport(state.captions, state.startedAt, "(the finals so far)");
      setStatus(`${ev.resumed ? "resumed" : "recording"} (session ${ev.session_id}, ` +
                `model ${ev.model})${lostNote()}`);
      break;
    case "audio.ack":
      state.buffer.ack(ev.offset);
      break;
    case "segment.partial":
      $("partial").replaceChildren(...ev.segments.map(segmentElement));
      break;
    case "segment.final":
      if (state.seenFinals.has(ev.id)) break; // replayed after a resume: shown already
      state.seenFinals.add(ev.id);
      $("finals").append(segmentElement(ev));
      break;
    case "transcript.final":
      state.finished = true;
      $("partial").replaceChildren();
      $("finals").replaceChildren(...ev.segments.map(segmentElement));
      setStatus(`done: ${ev.duration.toFixed(1)} s, ${ev.finish_reason}${lostNote()}`);
      showExport(state.captions, state.startedAt, "(final)");
      break;
    case "error":
      setStatus(`error ${ev.code}: ${ev.message}`);
      break;
  }
}

// Before any recording, say which model serves (the demo banner must not wait for a session).
async function showServer() {
  try {
    const resp = await fetch("readyz");
    const info = await resp.json();
    $("demo-banner").style.display = info.demo ? "block" : "none";
    setStatus(resp.ok ? `ready (model ${info.model})` : "server not ready: try again shortly");
  } catch (e) {
    setStatus(`cannot reach the server: ${e.message}`);
  }
}

async function start() {
  $("start").disabled = true;
  $("finals").replaceChildren();
  $("partial").replaceChildren();
  $("overlay").hidden = true;
  $("export").hidden = true;
  Object.assign(state, { opened: false, session: null, captions: null, startedAt: Date.now(),
                         live: false, ending: false,
                         finished: false, seenFinals: new Set(), dropAt: 0, attempt: 0 });
  if (!window.isSecureContext || !navigator.mediaDevices) {
    // browsers expose the microphone only to https pages and to http://localhost
    throw new Error("the microphone needs https or localhost: open this page as " +
                    `https://${location.host}/ (serve --tls-cert/--tls-key) or from localhost`);
  }
  setStatus("connecting…");
  state.stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  state.ctx = new AudioContext();
  await state.ctx.audioWorklet.addModule("pcm-worklet.js");
  const source = state.ctx.createMediaStreamSource(state.stream);
  state.node = new AudioWorkletNode(state.ctx, "pcm-worklet");
  state.buffer = new ResumeBuffer(MAX_UNACKED_S * SAMPLE_RATE);
  // the microphone runs on through a drop: its audio waits in the buffer for the resume
  state.node.port.onmessage = (msg) => {
    if (state.buffer.push(msg.data) && state.live && state.ws.readyState === WebSocket.OPEN) {
      state.ws.send(msg.data);
    }
  };
  source.connect(state.node);
  connect();
}

// Open a socket for a new session, or (state.session set) to resume it.
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/live`);
  ws.binaryType = "arraybuffer";
  state.ws = ws;
  ws.onopen = () => {
    state.opened = true;
    const start = { type: "start", sample_rate: SAMPLE_RATE, channels: 1,
                    encoding: "pcm_s16le" };
    if (state.session) start.resume = state.session;
    ws.send(JSON.stringify(start));
    state.keepalive = setInterval(() => ws.send(JSON.stringify({ type: "keepalive" })),
                                  KEEPALIVE_MS);
  };
  ws.onmessage = (msg) => {
    const ev = JSON.parse(msg.data);
    if (ev.type === "session.ready") onReady(ws, ev);
    onEvent(ev);
  };
  ws.onclose = (ev) => onClose(ws, ev);
}

// The session is ready (new or resumed): send what it lacks, from its offset, then go live.
function onReady(ws, ev) {
  state.session = ev.resume_token // null: resume is off on this server
    ? { session_id: ev.session_id, resume_token: ev.resume_token } : null;
  state.windowS = ev.resume_window_s;
  state.attempt = 0;
  state.dropAt = 0;
  state.buffer.ack(ev.offset);
  for (const data of state.buffer.from(ev.offset)) ws.send(data);
  state.live = true;
  if (state.ending) ws.send(JSON.stringify({ type: "end" })); // Stop came while offline
  else $("stop").disabled = false;
}

function onClose(ws, ev) {
  clearInterval(state.keepalive);
  state.live = false;
  if (ws !== state.ws) return; // an old socket
  const resumable = state.session && !state.finished && RESUMABLE_CLOSES.includes(ev.code);
  if (resumable) {
    if (!state.dropAt) state.dropAt = Date.now();
    // past the resume window the server has ended the session: nothing left to resume
    if (Date.now() - state.dropAt < state.windowS * 1000) {
      const delay = reconnectDelayMs(state.attempt++);
      setStatus(`connection lost: reconnecting in ${(delay / 1000).toFixed(1)} s…`);
      state.retry = setTimeout(connect, delay);
      return;
    }
    setStatus("connection lost for longer than the server keeps the session: " +
              "press Start for a new one");
  }
  state.dropAt = 0;
  stopAudio();
  if (!state.opened) setStatus(`cannot connect to the server (closed ${ev.code})`);
  else if (ev.code === 1001) {
    // the server shut down and drained the session: the transcript above is final up to
    // where it stopped; a new recording continues on a server that is up
    setStatus("the server restarted: the transcript is final up to here; press Start to go on");
  } else if (ev.code !== 1000 && !resumable) {
    setStatus(`${$("status").textContent} (closed ${ev.code})`);
  }
  $("start").disabled = false;
  $("stop").disabled = true;
}

function stopAudio() {
  if (state.node) state.node.port.onmessage = null;
  if (state.stream) state.stream.getTracks().forEach((t) => t.stop());
  if (state.ctx) state.ctx.close();
  state.node = state.stream = state.ctx = null;
}

function stop() {
  $("stop").disabled = true;
  stopAudio();
  state.ending = true;
  if (state.live) {
    state.ws.send(JSON.stringify({ type: "end" }));
    setStatus("finishing…");
  } // else: offline; the resume sends `end` after the audio it still owes
}

$("start").addEventListener("click", () => start().catch((e) => {
  stopAudio(); // release a microphone that was granted before the failure
  setStatus(`cannot start: ${e.message}`);
  $("start").disabled = false;
}));
$("stop").addEventListener("click", stop);
$("overlay-copy").addEventListener("click", () => {
  // the clipboard needs a secure page, as the microphone does; else the link can be copied
  if (navigator.clipboard) navigator.clipboard.writeText($("overlay-url").textContent);
});
showServer();
