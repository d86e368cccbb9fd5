// Captions overlay (an OBS browser source): subscribes read-only to one live session
// (GET /v1/sessions/{id}/captions, docs/protocol.md "Captions") and shows its last lines.
// URL: captions.html?session=<session_id>&token=<captions_token>[&lines=3][&debug=1]. A dropped
// connection is reconnected; the snapshot a new connection starts with is merged in (finals
// are deduplicated by id), so lines never repeat. Speakers show by name once named
// (`speaker.renamed`, live and in the snapshot, and `captions.ready`'s `speakers`;
// docs/protocol.md "Speaker names"), and a label merged into another (`speaker.merged`,
// "Speaker merges"; `captions.ready`'s `merged`) shows as its target: its name and colour.
// A session
// that is gone (4404: the meeting ended, and OBS reloaded the source) leaves the overlay empty,
// drawing nothing over the video: its status shows only with debug=1 (always in the console);
// one that went while the overlay was reconnecting to it (a server restart) leaves the lines
// it had shown a while first, as after its final.
// After the meeting's last frame (`transcript.final`, or its revision) the server closes with
// 1000: the last lines stay FINAL_LINGER_MS, for the end of the meeting to be read, then the
// overlay is empty (it stayed over the video for good: a trial); nothing reconnects.
// A session's revision (`transcript.revised`, docs/protocol.md "Revision") replaces the finals
// it supersedes, as on the recorder page (livemeet/web/recorder.js revisedFinals); names stay on their
// labels, which the revision keeps.
// No dependencies, no build step.
const DEFAULT_LINES = 3;
const MAX_LINES = 10;
const KEPT_FINALS = 20; // finals kept for display (a snapshot holds at most 20 too)
const RECONNECT_FIRST_MS = 500; // doubling up to RECONNECT_MAX_MS
const RECONNECT_MAX_MS = 10000;
// closes after which reconnecting cannot help: the session is over (1000), unknown (4404),
// the token is wrong (4401), or this page broke the protocol (4402)
const FINAL_CLOSES = { 1000: "", 4401: "captions: wrong token", 4402: "captions: protocol error",
                       4404: "captions: no such session (it ended, or the URL is wrong)" };
// of those, the ones shown over the video only with debug=1: a session gone is the overlay's
// normal state after a meeting (the others are a wrong URL, to be seen while setting it up)
const QUIET_CLOSES = [4404];
// s the last lines stay after the meeting ended (the close after its final): long enough to
// read the last two or three lines, short enough not to caption the next part of the stream
const FINAL_LINGER_MS = 10000;
// the recorder's palette and rule (livemeet/web/recorder.js speakerColour): S01 is the first colour
const SPEAKER_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                         "#e377c2", "#17becf"];

function speakerColour(speaker) {
  const m = /^S(\d+)$/.exec(speaker);
  let n = m ? Number(m[1]) - 1 : 0;
  if (!m) for (const ch of speaker) n = (n * 31 + ch.charCodeAt(0)) >>> 0;
  return SPEAKER_COLOURS[n % SPEAKER_COLOURS.length];
}

// {key: string} of a frame's object as a Map, other values left out (none: empty)
function stringMap(obj) {
  const map = new Map();
  if (!obj || typeof obj !== "object") return map;
  for (const [key, value] of Object.entries(obj)) if (typeof value === "string") map.set(key, value);
  return map;
}

// What the overlay shows, from the subscription's events (no DOM): the last finals, in
// order, each once, and the current partial's segments that no final covers yet.
function CaptionsModel(maxLines) {
  this.maxLines = maxLines;
  this.finals = []; // segments, oldest first, at most KEPT_FINALS
  this.seen = new Set(); // final ids shown (a reconnect's snapshot repeats some)
  this.partial = [];
  this.ended = false;
  this.names = new Map(); // {label: name}, as the session last said (speaker.renamed)
  this.merged = new Map(); // {label: into}, as the session said (speaker.merged)
}
// The label `label` shows as: itself, or for a label merged away its merge's target, in turn
// (bounded, in case of a cycle)
CaptionsModel.prototype.shownLabel = function (label) {
  for (let i = 0; i < this.merged.size && this.merged.has(label); i++) {
    label = this.merged.get(label);
  }
  return label;
};
// A transcript frame's `merged` ({label: target}), where the session merged any
CaptionsModel.prototype.noteMerged = function (merged) {
  if (!merged || typeof merged !== "object") return;
  for (const [label, into] of Object.entries(merged)) {
    if (typeof into === "string") this.merged.set(label, into);
  }
};
CaptionsModel.prototype.addFinal = function (seg) {
  if (this.seen.has(seg.id)) return;
  this.seen.add(seg.id);
  this.finals.push(seg);
  if (this.finals.length > KEPT_FINALS) this.finals.shift();
};
CaptionsModel.prototype.apply = function (ev) {
  switch (ev.type) {
    case "captions.ready":
      // a new connection's names and merges, as its snapshot replays them (a name removed
      // while this page was away is not among them): taken at once from the ready frame's
      // `speakers` and `merged`; a server without them has them cleared until its
      // snapshot's frames come (bare labels a moment: a flicker at each reconnect)
      this.names = stringMap(ev.speakers);
      this.merged = stringMap(ev.merged);
      break;
    case "speaker.renamed":
      if (typeof ev.speaker !== "string") break;
      if (typeof ev.name === "string") this.names.set(ev.speaker, ev.name);
      else this.names.delete(ev.speaker); // null: the label shows again
      break;
    case "speaker.merged":
      if (typeof ev.speaker === "string" && typeof ev.into === "string") {
        this.merged.set(ev.speaker, ev.into);
      }
      break;
    case "segment.final":
      this.addFinal(ev);
      break;
    case "segment.partial":
      this.partial = ev.segments;
      break;
    case "transcript.final":
      this.noteMerged(ev.merged);
      ev.segments.forEach((seg) => this.addFinal(seg));
      this.partial = [];
      this.ended = true;
      break;
    case "transcript.revised":
      this.noteMerged(ev.merged);
      this.revise(ev);
      break;
  }
};
// transcript.revised: its segments take the place of the finals it supersedes, in time order.
// Its ids join those seen: a reconnect's snapshot replays the superseded finals (seen: not
// shown again), then the revision, which then changes nothing.
CaptionsModel.prototype.revise = function (ev) {
  const superseded = new Set(ev.supersedes);
  const fresh = ev.segments.filter((seg) => !this.seen.has(seg.id));
  fresh.forEach((seg) => this.seen.add(seg.id));
  this.finals = this.finals.filter((seg) => !superseded.has(seg.id)).concat(fresh)
    .sort((a, b) => a.start - b.start).slice(-KEPT_FINALS);
  this.partial = [];
};
// [{label (the one it shows as: a merged label's target), speaker (that label's name, or the
// label), text, partial}], the last maxLines: finals,
// then the partial's segments past the last final's end (a partial may still hold what a
// final just committed).
CaptionsModel.prototype.lines = function () {
  const last = this.finals.length ? this.finals[this.finals.length - 1].end : -Infinity;
  const open = this.partial.filter((seg) => seg.end > last && seg.text.trim());
  const line = (seg, partial) => {
    const label = this.shownLabel(seg.speaker);
    return { label, text: seg.text, partial, speaker: this.names.get(label) || label };
  };
  const lines = this.finals.map((seg) => line(seg, false))
    .concat(open.map((seg) => line(seg, true)));
  return lines.slice(-this.maxLines);
};
// The session is gone: nothing to show
CaptionsModel.prototype.clear = function () {
  this.finals = [];
  this.partial = [];
};

function reconnectDelayMs(attempt) {
  return Math.min(RECONNECT_MAX_MS, RECONNECT_FIRST_MS * 2 ** attempt);
}

function params() {
  const query = new URLSearchParams(location.search);
  const lines = Number.parseInt(query.get("lines") || "", 10);
  return {
    session: query.get("session") || "",
    token: query.get("token") || "",
    lines: lines >= 1 && lines <= MAX_LINES ? lines : DEFAULT_LINES,
    debug: query.get("debug") === "1",
  };
}

// relative to this page, as livemeet/web/recorder.js's serverUrl: a proxy may serve both under a path
function captionsUrl(session, token) {
  const url = new URL(`v1/sessions/${encodeURIComponent(session)}/captions`, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = `?token=${encodeURIComponent(token)}`;
  return url.href;
}

function setStatus(text) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.style.display = text ? "block" : "none";
}

// A status to show only with debug=1 (the console has it either way)
function debugStatus(text) {
  if (text) console.warn(text);
  if (overlay.debug) setStatus(text);
}

function render(model) {
  const elements = model.lines().map((line) => {
    const div = document.createElement("div");
    div.className = line.partial ? "line partial" : "line";
    const who = document.createElement("span");
    who.className = "speaker";
    who.textContent = `${line.speaker}:`;
    who.style.color = speakerColour(line.label); // the shown label's colour, named or not
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = line.text;
    div.append(who, text);
    return div;
  });
  document.getElementById("lines").replaceChildren(...elements);
}

const overlay = { model: null, ws: null, attempt: 0, retry: null, debug: false };

// The meeting is over: its last lines stay FINAL_LINGER_MS, then the overlay is empty (`why`:
// for debug=1)
function linger(why) {
  setTimeout(() => {
    overlay.model.clear();
    render(overlay.model);
    debugStatus(why);
  }, FINAL_LINGER_MS);
}

function connect(session, token) {
  const ws = new WebSocket(captionsUrl(session, token));
  overlay.ws = ws;
  ws.onmessage = (msg) => {
    const ev = JSON.parse(msg.data);
    if (ev.type === "captions.ready") {
      overlay.attempt = 0;
      setStatus("");
    } else if (ev.type === "error") {
      debugStatus(`captions: ${ev.code}: ${ev.message}`); // the close says what matters
    }
    overlay.model.apply(ev);
    render(overlay.model);
  };
  ws.onclose = (ev) => {
    if (ev.code in FINAL_CLOSES) {
      if (ev.code === 1000) { // the meeting ended: its last lines, a while
        linger("captions: the meeting ended");
      } else if (QUIET_CLOSES.includes(ev.code)) {
        // gone: after lines of this meeting were shown, it ended while this page was away
        // (a server restart kept it reconnecting until the meeting was over): its last
        // lines a while, as after its final (they went at once, the final never seen: a
        // trial); none shown, no stale captions over the video either
        if (overlay.model.lines().length) linger(FINAL_CLOSES[ev.code]);
        else {
          overlay.model.clear();
          render(overlay.model);
          debugStatus(FINAL_CLOSES[ev.code]);
        }
      } else if (FINAL_CLOSES[ev.code]) setStatus(FINAL_CLOSES[ev.code]);
      return;
    }
    const delay = reconnectDelayMs(overlay.attempt++);
    overlay.retry = setTimeout(() => connect(session, token), delay);
  };
}

function main() {
  const { session, token, lines, debug } = params();
  overlay.model = new CaptionsModel(lines);
  overlay.debug = debug;
  if (!session || !token) {
    setStatus("captions: the URL needs ?session=<id>&token=<captions_token> (the recorder shows it)");
    return;
  }
  connect(session, token);
}

main();
