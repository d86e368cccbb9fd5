// Runs livemeet/web/recorder.js in a stub browser (node's vm) through a meeting's life around its
// transcript downloads and its storage across page reloads: fake microphone, WebSockets,
// sessionStorage and fetch, driven by hand; a fixed clock (Date.now) so file names are known
// (run with TZ=UTC). Prints one JSON line. argv: recorder.js path, then a scenario:
// "export" (a meeting to its end: the download links during it and after the close, and the
// stored session), "reload" (a page loaded with a live session stored: Resume meeting, then a
// drop and a second resume), "gone" (the stored session's resume gets not_found, 4404; the
// server has its final), "expired" (the stored session's window has passed), "names" (speakers
// named through the page, the server's answers, a drop and the names' replay on the resume),
// "merges" (two labels merged into one through the page, the server's answers, a rename of
// the merged label, a drop and the merges' replay on the resume, the final's `merged`),
// "badnames" (speaker names the server refuses, and some it takes), "violation" (the server
// refuses a message of the page's and closes 4400/4402/4415, keeping the session), "deadpath"
// (the server stops answering without a close: the watchdog resumes, before and after Stop),
// "nofinal" (Stop, and the final never comes), "slowfinal" (a minute without a word after
// Stop: the final still decoding, or stored while the socket's path was dead), "quickstop"
// (Stop before the first audio frame; FLUSH: what the worklet holds then, "none": no answer),
// "ctxrate" (an AudioContext at CTX_RATE Hz), "reload8k" (a session stored at 8 kHz resumed
// on a 48-kHz context),
// "micgone" (the microphone's track ends mid-meeting), "recent" (the meetings this browser
// recorded last, in localStorage; the prompt before closing the tab mid-meeting), "stale" (a
// reload's offer to resume whose window then ends), "lateclick" (Resume meeting clicked past it),
// "scroll" (captions coming in while the page is at its bottom, then scrolled up), "a11y" (a
// caption's speaker as a button; Copy's feedback, CLIPBOARD and EXEC_COPY saying how it goes),
// "times" (the caption lines' times; the final's status, FINISH its finish_reason, DURATION),
// "inplace" (renames, a merge, the final and a revision change only the caption lines and
// speaker buttons they concern, in place: the keyboard focus stays, nothing else is re-read),
// "controls" (the sticky controls bar grows: what the browser scrolls into view stays below),
// "deadrevision" (silence after a final that promised a revision: TRANSCRIPT_STATUS "revised",
// the revision stored while the socket's path was dead, or "final", still revising, or failed
// unheard),
// "apikey" (the API key field: kept by the tab, sent in `start` and on the resume), "refused"
// (no key for a server that asks for one: 4401), "revised" (a meeting whose final promised a
// revision: the wait, a drop and resume for it, then transcript.revised), "unrevised" (the
// revision fails: revision_failed), "storagefull" (the server's disk fills: it ends the
// meeting, its final, then storage_failed and 4507). The wall clock stepping by STEP ms
// (either way) while the monotonic clock runs on: "stepdead" (a socket owing an ack goes
// silent), "stephealthy" (the server answers each send), "stepquiet" (silence after Stop),
// "stepwindow" (the resume window after a drop), "stepoffer" (the offer to resume after a
// reload), "stepfinal" and "steprevision" (the give-ups after Stop and after the final),
// "stepreloadending" (the give-up of a meeting stopped before a reload), "stepnote" (a
// passing note), "steppoll" (the asks about a meeting the server is ending), "stepsaved"
// (the times saved for a reload). "coarseload" (the monotonic clock reads 0 as the page
// loads: a browser that coarsens it, and a script run in its first step).
const fs = require("fs");
const vm = require("vm");
const { stubBrowser, sleep } = require("./stub_browser");

const [source, scenario] = process.argv.slice(2);
const NOW = Date.UTC(2026, 11, 5, 14, 30, 15); // the meeting's start: 2026-12-05 14:30 UTC

const { element, sockets, speak, sandbox: browserSandbox, worklet, microphones, mutations,
        focused, inLiveRegion } = stubBrowser();

class FakeStorage {
  constructor(items) { this.items = { ...items }; }
  getItem(k) { return k in this.items ? this.items[k] : null; }
  setItem(k, v) { this.items[k] = String(v); }
  removeItem(k) { delete this.items[k]; }
}

// the page's clocks, moved on by hand where a scenario needs time to pass: the wall clock
// (Date.now) from NOW, the monotonic one (performance.now) from a second into the page's
// life. advance moves both; stepWall the wall clock alone, as an NTP correction, the user
// setting the time or a VM resumed does (STEP: a scenario's step, ms, either way)
let clock = NOW;
let monotonic = Number(process.env.MONOTONIC_AT_LOAD || 1000);
const advance = (ms) => { clock += ms; monotonic += ms; };
const stepWall = (ms) => { clock += ms; };
const STEP = Number(process.env.STEP || 0);
class FixedDate extends Date {
  constructor(...args) { if (args.length) super(...args); else super(clock); }
  static now() { return clock; }
}

// the page's address: PAGE_HREF, e.g. a proxy serving livemeet under a path
const PAGE = new URL(process.env.PAGE_HREF || "https://meet.example:8000/");
const fetched = [];
const startAtFetch = [];
// window.prompt: answers given in turn (undefined when none is queued), the prompts asked
const answers = [];
const prompts = [];
// the transcripts of sessions other than s-1: "gone" the server no longer has (404), "down"
// finds no server, "r-*" still run; the others are final. "e-*" hold no audio but the 20 ms
// of silence of a Stop before any (a meeting an older page listed), "a" 12:34.5 of it, the
// others 5.25 s.
function audioOf(url) {
  const id = /\/sessions\/([^/]+)\/transcript/.exec(url);
  if (id && id[1].startsWith("e-")) return 0.02;
  return id && id[1] === "a" ? 754.5 : 5.25;
}
// TRANSCRIPT_SEQUENCE: s-1's statuses, one per ask, before TRANSCRIPT_STATUS (e.g. "running,final":
// a meeting the server is ending as it is asked, then stored; "none": a 404)
const sequence = (process.env.TRANSCRIPT_SEQUENCE || "").split(",").filter(Boolean);
function transcriptOf(url, transcriptStatus) {
  const id = /\/sessions\/([^/]+)\/transcript/.exec(url);
  if (id && id[1] === "s-1" && sequence.length) {
    const kept = sequence.shift();
    return kept === "none" ? null : kept; // "none": the server has no transcript (404)
  }
  if (id && id[1] === "down") throw new TypeError("Failed to fetch");
  if (id && id[1] === "gone") return null;
  if (id && id[1].startsWith("r-")) return "running";
  return transcriptStatus;
}

// the body of s-1's transcript resource (diarized_json) once a scenario sets it: what the
// server stored of a meeting it finished
let storedBody = null;

// each ResizeObserver the page made: [the element it observes, its callback]
const resizeObservers = [];
class FakeResizeObserver {
  constructor(callback) { this.callback = callback; }
  observe(node) { resizeObservers.push([node, this.callback]); }
}

function makeSandbox(storage, transcriptStatus, lasting) {
  const sandbox = browserSandbox({
    location: { host: PAGE.host, protocol: PAGE.protocol, href: PAGE.href },
    fetch: async (url) => {
      fetched.push(url);
      // Start as the page has it while a stored transcript (diarized_json) is on its way
      const reading = () => { if (url.includes("diarized_json")) startAtFetch.push(element("start").disabled); };
      if (url === "readyz") { // BACKEND: readyz's backend (unset: a real model, not a demo)
        const backend = process.env.BACKEND || "moss";
        const model = { moss: "m", demo: "whisper-tiny.en-demo", scripted: "scripted (tests)" };
        return { ok: true, json: async () => ({ demo: backend !== "moss", backend,
                                                model: model[backend] }) };
      }
      const kept = transcriptOf(url, transcriptStatus);
      const ok = kept !== null;
      return { ok, status: ok ? 200 : 404,
               // FINISH: a finished transcript's finish_reason, as the server says it;
               // REVISION: X-Livemeet-Revision (unset: an older server's answer, no header)
               headers: { get: (h) => (h === "X-Livemeet-Transcript-Status" ? kept
                                       : h === "X-Livemeet-Finish-Reason" && ok
                                         ? process.env.FINISH || "stop"
                                         : h === "X-Livemeet-Revision" && ok
                                           ? process.env.REVISION || null : null) },
               text: async () => "",
               json: async () => {
                 reading();
                 return storedBody && url.includes("/sessions/s-1/") ? storedBody
                                                                     : { duration: audioOf(url) };
               } };
    },
    sessionStorage: storage,
    localStorage: lasting,
    Date: FixedDate,
    performance: { now: () => monotonic },
    ResizeObserver: FakeResizeObserver,
  });
  sandbox.window.sessionStorage = storage;
  sandbox.window.localStorage = lasting;
  sandbox.document.scrollingElement = scroller;
  // CLIPBOARD: "ok" (a secure page: the clipboard API), "refused" (its writeText refused),
  // "none" (a plain http page: no clipboard API); EXEC_COPY: execCommand("copy")'s answer
  const clipboard = process.env.CLIPBOARD || "ok";
  if (clipboard !== "none") {
    sandbox.navigator.clipboard = { writeText: async (text) => {
      if (clipboard === "refused") throw new Error("NotAllowedError");
      copied.push(text);
    } };
  }
  sandbox.document.createRange = () => ({ selectNodeContents(node) { this.node = node; } });
  sandbox.window.getSelection = () => ({ removeAllRanges() { selected.length = 0; },
                                         addRange(range) { selected.push(range.node.id); } });
  sandbox.document.execCommand = (command) => {
    if (command === "copy" && process.env.EXEC_COPY === "ok") copied.push(selected.join());
    return command === "copy" && process.env.EXEC_COPY === "ok";
  };
  sandbox.window.prompt = (message, value) => {
    prompts.push([message, value]);
    return answers.shift();
  };
  return sandbox;
}

const final = (id, start) => ({ type: "segment.final", id, start, end: start + 1,
                                speaker: "S01", text: id });
const ready = (extra) => ({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                            model: "m", resume_token: "tok", resume_window_s: 60,
                            resumed: false, offset: 0, captions_token: "c/t+k=", revise: false,
                            speakers: {}, merged: {}, ...extra });
// Start a meeting: a click on Start, then the page's newest socket opens and the server
// answers `start` with `session.ready` (`ready(extra)`); returns that socket
async function startMeeting(extra) {
  element("start").listeners.click();
  await sleep(10);
  const ws = sockets[sockets.length - 1];
  ws.open();
  ws.receive(ready(extra));
  return ws;
}

function links() {
  const out = { hidden: element("export").hidden, note: element("export-note").textContent };
  for (const id of ["json", "srt", "vtt", "text"]) {
    const a = element(`export-${id}`);
    out[id] = { href: a.href, download: a.download };
  }
  return out;
}

async function exportScenario(storage) {
  element("start").listeners.click();
  await sleep(10);
  const ws = sockets[0];
  ws.open();
  const before = links();
  ws.receive(ready());
  speak(); speak();
  ws.receive(final("seg-0000", 0));
  const during = links();
  const storedDuring = storage.items[KEY] ? JSON.parse(storage.items[KEY]) : null;
  element("stop").listeners.click();
  ws.receive({ type: "transcript.final", segments: [final("seg-0000", 0)],
               finish_reason: "stop", coverage: 1, duration: 0.2 });
  ws.drop(1000);
  return { before, during, after: links(), status: element("status").textContent,
           storedDuring, storage: storage.items, revision_hidden: element("revision").hidden };
}

// the revision line: [hidden, text]; the captions shown: [speaker shown, text]
const revisionLine = () => [element("revision").hidden, element("revision").textContent];
const shownCaptions = () => element("finals").children.map((div) => [div.children[1].textContent,
                                                                     div.children[2].textContent]);
const finalOf = (segments) => ({ type: "transcript.final", segments, finish_reason: "stop",
                                 coverage: 1, duration: 3 });

async function revisedScenario() {
  const ws = await startMeeting({ revise: true });
  const finals = [said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02")];
  for (const f of finals) ws.receive(f);
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  const out = { before: revisionLine() };
  element("stop").listeners.click();
  ws.receive(finalOf(finals));
  out.waiting = revisionLine();
  out.waitingStatus = element("status").textContent;
  ws.drop(1006); // before the revision: resumed for it
  await sleep(400);
  const again = sockets[1];
  out.resumed = Boolean(again);
  again.open();
  again.receive(ready({ resumed: true, revise: true, offset: 3200, speakers: { S01: "Alice" } }));
  for (const f of finals) again.receive(f);
  again.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  again.receive(finalOf(finals));
  out.replayed = shownCaptions();
  again.receive({ type: "transcript.revised", finish_reason: "stop",
                  supersedes: ["seg-0000", "seg-0001"],
                  segments: [{ ...said("rev-0001", 0, "S01"), text: "good morning" },
                             { ...said("rev-0002", 1.5, "S03"), text: "hello" },
                             { ...said("rev-0003", 1, "S02"), text: "thanks" }] });
  again.drop(1000);
  Object.assign(out, { revised: revisionLine(), captions: shownCaptions(), links: links(),
                       status: element("status").textContent, list: speakersList(),
                       resumeStart: again.sent[0] });
  return out;
}

async function unrevisedScenario() {
  const ws = await startMeeting({ revise: true });
  ws.receive(said("seg-0000", 0, "S01"));
  element("stop").listeners.click();
  ws.receive(finalOf([said("seg-0000", 0, "S01")]));
  ws.receive({ type: "error", code: "revision_failed", retryable: false,
               message: "the revision failed (internal_error): decode failed: " +
                        "RuntimeError('scripted revision failure'); transcript.final stands" });
  ws.drop(1000);
  return { revision: revisionLine(), captions: shownCaptions(), links: links(),
           status: element("status").textContent, detail: element("revision").title };
}

// The server's disk filled mid-meeting: it ended the meeting itself (no Stop), sent its
// transcript.final, then storage_failed and a 4507 close
async function storageFullScenario(storage) {
  const ws = await startMeeting();
  const finals = [said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02")];
  speak();
  for (const f of finals) ws.receive(f);
  ws.receive({ type: "audio.ack", offset: 1600 });
  speak(); // still recording: the server ends the meeting, not the page
  ws.receive({ ...finalOf(finals), duration: 2.5 });
  speak(); // sent to a session that takes no more audio: the final says what it covers
  const message = "the server could not store this session's audio (No space left on " +
                  "device): the session was ended early, as if its client had sent `end`; " +
                  "its transcript.final (all the audio the server took in) was sent and is " +
                  "stored (GET /v1/sessions/s-1/transcript with its captions_token); the " +
                  "session cannot be resumed: start a new session to go on";
  ws.receive({ type: "error", code: "storage_failed", retryable: true, message });
  ws.drop(4507);
  await sleep(400); // a resume would have been tried by now
  return { captions: shownCaptions(), links: links(), status: element("status").textContent,
           storage: storage.items, numSockets: sockets.length,
           micStopped: microphones.every((t) => t.stopped),
           startDisabled: element("start").disabled, stopDisabled: element("stop").disabled };
}

// a session the page stored before its reload, last seen `ageMs` ago, 2 s into the meeting
const KEY = "livemeet.recorder.session";
function stored(ageMs, rate = 16000, extra = {}) {
  return { [KEY]: JSON.stringify({
    session_id: "s-1", resume_token: "tok", captions_token: "c/t+k=", sample_rate: rate,
    channels: 1, started_at: NOW - 120000, resume_window_s: 60, alive_at: NOW - ageMs,
    ...extra }) };
}

async function reloadScenario(storage) {
  const offered = { resume_hidden: element("resume").hidden, status: element("status").textContent,
                    links: links() };
  element("resume").listeners.click();
  await sleep(10);
  const first = sockets[0];
  first.open();
  speak(); speak(); speak(); // frames 0-2, heard after the reload: kept until ready
  // the server holds 2 s (32,000 frames) from before the reload
  first.receive(ready({ resumed: true, offset: 32000 }));
  const statusResumed = element("status").textContent;
  first.receive(final("seg-0000", 0)); // the replay: all new to this page
  first.receive(final("seg-0001", 1));
  speak(); // frame 3, live
  first.receive({ type: "audio.ack", offset: 32000 + 1600 }); // frame 0
  const storedLive = storage.items[KEY] ? JSON.parse(storage.items[KEY]) : null;
  first.drop(1006); // then the network
  await sleep(400);
  const second = sockets[1];
  second.open();
  // frames 0-1 arrived
  second.receive(ready({ resumed: true, offset: 32000 + 3200, speakers: { S01: "Alice" } }));
  second.receive(final("seg-0000", 0)); // replayed again: shown once
  second.receive(final("seg-0001", 1));
  second.receive(final("seg-0002", 2));
  second.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" }); // the names' replay
  return { offered, statusResumed, storedLive, first: first.sent, second: second.sent,
           namesAfterReload: shownSpeakers(),
           finals: element("finals").children.length, status: element("status").textContent };
}

// the speakers shown on the final lines, and the speakers list: [text, disabled]
const shownSpeakers = () => element("finals").children.map((div) => div.children[1].textContent);
const shownColours = () => element("finals").children.map((div) => div.children[1].style.color);
const speakersList = () => element("speakers-list").children.map((b) => [b.textContent,
                                                                          b.disabled]);
const renamesSent = (ws) => ws.sent.filter((m) => m.type === "speaker.rename");
const said = (id, start, speaker) => ({ ...final(id, start), speaker });

// reloaded mid-meeting (a resume offered): the finals so far come from the transcript
// resource, as the server holds them, before the click on Resume; its replay adds the rest
async function reloadFinalsScenario() {
  await sleep(10); // the transcript resource
  const offered = { speakers: shownSpeakers(), texts: element("finals").children.map(
    (div) => div.children[div.children.length - 1].textContent),
                    title: element("finals").children[1].children[1].title,
                    list: speakersList(), listShown: !element("speakers").hidden,
                    listTitle: (element("speakers-list").children[1] || {}).title,
                    hint: element("speakers-hint").textContent,
                    hintTitle: element("speakers-hint").title,
                    overlayShown: !element("overlay").hidden,
                    overlayUrl: element("overlay-url").textContent };
  element("resume").listeners.click();
  await sleep(10);
  const onClick = element("finals").children.length;
  // until session.ready: the list and the downloads stay (they went: a Chromium trial)
  const connecting = { list: speakersList(), listShown: !element("speakers").hidden,
                       exportShown: !element("export").hidden,
                       overlayShown: !element("overlay").hidden,
                       hint: element("speakers-hint").textContent };
  const ws = sockets[0];
  ws.open();
  ws.receive(ready({ resumed: true, offset: 32000, speakers: { S02: "Bob" } }));
  const afterReady = shownSpeakers(); // before the replay's frames
  ws.receive(said("seg-0000", 0, "S01")); // the replay: the first two shown already
  ws.receive(said("seg-0001", 1, "S02"));
  ws.receive(said("seg-0002", 2, "S03"));
  ws.receive({ type: "speaker.renamed", speaker: "S02", name: "Bob" });
  return { offered, onClick, connecting, afterReady, afterReplay: shownSpeakers(),
           list: speakersList(), hint: element("speakers-hint").textContent };
}

async function namesScenario() {
  const ws = await startMeeting();
  ws.receive(said("seg-0000", 0, "S01"));
  ws.receive(said("seg-0001", 1, "S02"));
  const out = { initial: shownSpeakers(), list: speakersList(), colours: shownColours() };
  answers.push("  Alice ");
  element("finals").children[0].children[1].listeners.click(); // S01 on its caption line
  out.prompt = prompts[0];
  out.beforeAnswer = shownSpeakers(); // the server has not said so yet
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  out.named = shownSpeakers();
  out.namedColours = shownColours();
  out.namedList = speakersList();
  answers.push("Bob");
  element("speakers-list").children[1].listeners.click(); // S02 in the speakers list
  ws.receive({ type: "speaker.renamed", speaker: "S02", name: "Bob" });
  out.both = shownSpeakers();
  answers.push("   "); // empty: the name is removed
  element("finals").children[0].children[1].listeners.click();
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: null });
  out.cleared = shownSpeakers();
  out.clearedList = speakersList();
  answers.push("x".repeat(65)); // the server would refuse it (and close the socket)
  element("finals").children[1].children[1].listeners.click();
  out.tooLongStatus = element("status").textContent;
  answers.push(null); // cancelled
  element("finals").children[1].children[1].listeners.click();
  ws.receive({ type: "speaker.something", speaker: "S02" }); // unknown: ignored
  out.first = renamesSent(ws);
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Ann" });
  ws.drop(1006);
  out.offlineList = speakersList();
  out.offlineCaptionButtons = element("finals").children.map((line) => line.children[1].disabled);
  out.offlineHint = [element("speakers-hint").textContent, element("speakers-hint").title];
  const asked = prompts.length;
  answers.push("Zed");
  element("finals").children[0].children[1].listeners.click(); // offline: nothing happens
  out.offlinePrompts = prompts.length - asked;
  answers.length = 0;
  await sleep(400);
  const again = sockets[1];
  again.open();
  out.openedDetail = element("status-detail").textContent; // before session.ready
  // the names the server holds (S01's was removed meanwhile, S02 renamed) in the ready frame,
  // then the replay: the finals, then those names again
  again.receive(ready({ resumed: true, speakers: { S02: "Robert" } }));
  out.atReady = shownSpeakers();
  // a network stall mid-replay: the page ended the replay after 2 s without a frame and
  // dropped the names it had not given yet (session 40's trial)
  await sleep(2100);
  out.afterStall = shownSpeakers();
  again.receive(said("seg-0000", 0, "S01"));
  again.receive(said("seg-0001", 1, "S02"));
  again.receive({ type: "speaker.renamed", speaker: "S02", name: "Robert" });
  again.receive({ type: "audio.ack", offset: 0 });
  out.replayed = shownSpeakers();
  out.replayedList = speakersList();
  answers.push("Carol");
  element("finals").children[0].children[1].listeners.click();
  out.second = renamesSent(again);
  return out;
}

// names the server refuses (docs/protocol.md, speaker.rename), each answered to the prompt of
// a click on S01: the page must say why and send nothing (a refusal closes the socket); and
// names it takes, sent as the server keeps them (stripped as Python strips)
const BAD_NAMES = ["\u2068Alice\u2069", "\u202eecilA", "Bob\u202a", "\u200b", "\u0301\u200d",
                   "\u00a0\u200b\u3000"];
const GOOD_NAMES = ["\u001fZed\u0085", "\u200bAl", "\u{1F600}", "  Ann\u3000", "O'Neil-Ng"];

async function badNamesScenario() {
  const ws = await startMeeting();
  ws.receive(said("seg-0000", 0, "S01"));
  const refused = [];
  for (const name of BAD_NAMES) {
    answers.push(name);
    element("finals").children[0].children[1].listeners.click();
    refused.push(element("status").textContent);
  }
  const sentForBad = renamesSent(ws);
  for (const name of GOOD_NAMES) {
    answers.push(name);
    element("finals").children[0].children[1].listeners.click();
  }
  const statusBeforeAnswer = element("status").textContent;
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Zed" });
  const statusAfterAnswer = element("status").textContent;
  // a refusal with no rename after it: the reason shows a while, then the recording status
  answers.push("\u200b");
  element("finals").children[0].children[1].listeners.click();
  const noted = [element("status").textContent];
  advance(7000);
  await sleep(1100); // a watchdog tick
  noted.push(element("status").textContent);
  answers.push("S09 S01"); // a merge the page refuses: the same
  element("merge-speakers").listeners.click();
  noted.push(element("status").textContent);
  advance(8000);
  await sleep(1100);
  noted.push(element("status").textContent);
  return { refused, sentForBad, sentForGood: renamesSent(ws).map((m) => m.name),
           statusBeforeAnswer, statusAfterAnswer, noted };
}

// the server refuses a message of the page's (invalid_request, 4400; protocol_error, 4402;
// bad_audio, 4415) and keeps the session: the page resumes it, at most 3 times a meeting; at
// the 4th it ends the meeting with a last resume (the session waited out its resume window
// before its transcript completed: a trial). LAST says how that resume goes: "final" (the
// server holds 1,600 frames, the final comes), "empty" (it holds none on disk), "refused"
// (refused as well); "afterfinal": the 4th comes after the final, while a revision is due
// A server's session id (32 hex digits): the statuses name it by its first 8, the whole id
// in the status line's tooltip; recording, then resumed after a drop (1006)
async function longIdScenario() {
  const session_id = "0123456789abcdef0123456789abcdef";
  const ws = await startMeeting({ session_id });
  const out = { recording: element("status").textContent,
                title: element("status-line").title };
  speak();
  ws.receive({ type: "audio.ack", offset: 1600 });
  ws.drop(1006);
  await sleep(400);
  const again = sockets[sockets.length - 1];
  out.resumedWith = again.sent;
  again.open();
  again.receive(ready({ session_id, resumed: true, offset: 1600 }));
  out.resumed = element("status").textContent;
  return out;
}

async function violationScenario() {
  const how = process.env.LAST || "final";
  const revise = how === "afterfinal";
  element("start").listeners.click();
  await sleep(10);
  const out = { statuses: [], resumes: [] };
  let ws = sockets[0];
  ws.open();
  ws.receive(ready({ revise }));
  speak(); speak();
  ws.receive({ type: "audio.ack", offset: 1600 });
  for (const [i, code] of [4400, 4402, 4415, 4400].entries()) {
    if (i === 3 && revise) {
      element("stop").listeners.click();
      await sleep(300);
      ws.receive(finalOf([final("seg-0000", 0)]));
    }
    ws.receive({ type: "error", code: code === 4402 ? "protocol_error" : "invalid_request",
                 message: `refused #${i}`, retryable: false });
    ws.drop(code);
    out.statuses.push(element("status").textContent);
    if (i === 3) break; // the 4th: below
    await sleep(400);
    ws = sockets[i + 1];
    ws.open();
    ws.receive(ready({ resumed: true, offset: 1600, revise }));
    out.resumes.push(ws.sent);
    out.resumedStatuses = [...(out.resumedStatuses || []), element("status").textContent];
  }
  out.windUp = { stopDisabled: element("stop").disabled, micReleased: microphones[0].stopped,
                 asksBeforeClosing: beforeUnload() };
  await sleep(400);
  const last = sockets[4];
  out.lastResume = Boolean(last);
  if (last) {
    last.open();
    last.receive(ready({ resumed: true, offset: how === "empty" ? 0 : 1600 }));
    speak(); // (a microphone the page let go of sends nothing)
    out.lastSent = last.sent.slice();
    out.endingStatus = element("status").textContent;
    if (how === "refused") {
      last.receive({ type: "error", code: "protocol_error", message: "refused #4",
                     retryable: false });
      last.drop(4402);
    } else {
      last.receive(finalOf([final("seg-0000", 0)]));
      last.drop(1000);
    }
  }
  out.status = element("status").textContent;
  out.start_disabled = element("start").disabled;
  return out;
}

// the socket whose sends the server stops answering: a dead network path, no close (a trial:
// the page said "recording" while its resend buffer filled, and Stop spun on "finishing…")
const frames = (sent) => sent.filter((m) => "frame" in m).map((m) => m.frame);
async function deadPathScenario() {
  const out = {};
  await startMeeting();
  speak(); speak();
  sockets[0].receive({ type: "audio.ack", offset: 1600 });
  speak(); speak(); // frames 2, 3: never acknowledged
  advance(14000);
  await sleep(1100); // a watchdog tick: 14 s is not yet dead
  out.socketsAt14s = sockets.length;
  out.statusAt14s = element("status").textContent;
  advance(2000);
  await sleep(1100);
  out.closedByPage = sockets[0].closedByPage;
  out.statusDead = element("status").textContent;
  await sleep(300); // the first retry, after 250 ms
  out.socketsAfterDead = sockets.length;
  advance(16000); // the retry's handshake never completes either
  await sleep(1100 + 600);
  const resumed = sockets[2];
  out.socketCount = sockets.length;
  out.connectClosed = sockets[1].closedByPage;
  resumed.open();
  resumed.receive(ready({ resumed: true, offset: 1600 }));
  out.resent = frames(resumed.sent);
  out.resumeStart = resumed.sent[0];
  element("stop").listeners.click(); // `end`, and then no final, no message at all
  await sleep(300);
  out.endSent = resumed.sent[resumed.sent.length - 1];
  advance(29000);
  await sleep(1100);
  out.socketsAt29s = sockets.length;
  advance(2000);
  await sleep(1100 + 300);
  const last = sockets[3];
  out.finishingSockets = sockets.length;
  last.open();
  last.receive(ready({ resumed: true, offset: 6400 }));
  out.lastSent = last.sent;
  out.statusFinishing = element("status").textContent;
  last.receive(finalOf([final("seg-0000", 0)]));
  last.drop(1000);
  out.status = element("status").textContent;
  return out;
}

// The transcript resource's asks so far
function asked() {
  return fetched.filter((url) => url.includes("/transcript")).length;
}

// `ws`, the meeting's socket after `end` (or the final), hears nothing for 29 s, then 31 s:
// how often the page asked the transcript resource by each, and whether it dropped `ws`
async function quietFor31s(ws) {
  const out = {};
  advance(29000);
  await sleep(1100);
  out.askedAt29s = asked();
  advance(2000);
  await sleep(1100 + 300); // a watchdog tick, and a retry's 250 ms
  out.askedAt31s = asked();
  out.socketsAt31s = sockets.length;
  out.closedByPage = Boolean(ws.closedByPage);
  return out;
}

// Stop, the last audio's ack, then a minute of silence while the server decodes the final
// (TRANSCRIPT_STATUS "running") or after the socket's path died with the final stored
// ("final"): the page asks the transcript resource every 30 s and waits on while it runs, or
// drops the socket and resumes for the final (it stayed "finishing…" for 11 minutes, a trial)
async function slowFinalScenario(storage) {
  await startMeeting();
  speak();
  element("stop").listeners.click();
  await sleep(300);
  sockets[0].receive({ type: "audio.ack", offset: 1600 });
  // what a reload now would find: a meeting stopped, waiting for its final
  const out = { storedStopped: JSON.parse(storage.items[KEY] || "null"),
                ...await quietFor31s(sockets[0]) };
  if (sockets.length === 1) { // still decoding: the page waits on, and asks again in 30 s
    advance(31000);
    await sleep(1100);
    out.askedAt62s = asked();
    out.socketsAt62s = sockets.length;
  }
  const last = sockets[sockets.length - 1];
  if (last !== sockets[0]) {
    last.open();
    last.receive(ready({ resumed: true, offset: 1600 }));
  }
  last.receive(finalOf([final("seg-0000", 0)]));
  last.drop(1000);
  out.status = element("status").textContent;
  return out;
}

// Stop, the final (which promised a revision), then silence: the page waited for ever for a
// revision a dead path would never bring (a trial). It now asks the transcript resource
// every 30 s of silence: stored revised, it drops the socket and resumes (the resume replays
// the final and the revision); final (still revising, or failed unheard), it waits on, for at
// most 11 minutes after the final.
async function deadRevisionScenario() {
  const ws = await startMeeting({ revise: true });
  const said0 = said("seg-0000", 0, "S01");
  ws.receive(said0);
  speak();
  element("stop").listeners.click();
  await sleep(300);
  ws.receive({ type: "audio.ack", offset: 1600 });
  ws.receive(finalOf([said0]));
  const out = await quietFor31s(ws);
  if (sockets.length > 1) {
    const again = sockets[1];
    again.open();
    again.receive(ready({ resumed: true, revise: true, offset: 1600 }));
    again.receive(said0);
    again.receive(finalOf([said0]));
    again.receive({ type: "transcript.revised", finish_reason: "stop", supersedes: ["seg-0000"],
                    segments: [{ ...said("rev-0001", 0, "S01"), text: "good morning" }] });
    again.drop(1000);
    out.resumeStart = again.sent[0];
  } else {
    advance(31000);
    await sleep(1100);
    out.askedAt62s = asked();
    out.socketsAt62s = sockets.length;
    out.revisionWaiting = revisionLine();
    advance(11 * 60000 - 62000 + 1000); // 11 minutes after the final, and a second
    await sleep(1100);
    out.socketsAtEnd = sockets.length;
    out.closedByPageAtEnd = Boolean(ws.closedByPage);
    out.start_disabled = element("start").disabled;
  }
  Object.assign(out, { captions: shownCaptions(), revision: revisionLine(),
                       status: element("status").textContent,
                       statuses: mutations.filter((m) => m.text === element("status"))
                         .map((m) => m.value) });
  return out;
}

// The socket's path dies after the final (its revision, and the close, never come), or after
// `end` (TRANSCRIPT_STATUS "final": the final never comes): the page asks the transcript
// resource, drops the socket and resumes, and the resume gets not_found (4404): the server
// had finished the meeting and let it go. The page kept the captions it had, "revising…" for
// ever, and said the meeting had ended (a trial): it now shows the stored transcript.
async function silentScenario(revise) {
  const ws = await startMeeting({ revise });
  const finals = [said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02"),
                  said("seg-0002", 2, "S03")];
  for (const f of finals) ws.receive(f);
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  ws.receive(merged("S03", "S01"));
  speak();
  element("stop").listeners.click();
  await sleep(300);
  ws.receive({ type: "audio.ack", offset: 1600 });
  if (revise) ws.receive(finalOf(finals)); // then the path dies: the revision is lost
  const out = { before: shownCaptions(), revisionBefore: revisionLine() };
  // what the server stored: the revision (or the final) with a name whose answer was lost
  const last = { ...said(revise ? "rev-0003" : "seg-0003", 3, "S02"), text: "bye" };
  storedBody = {
    task: "transcribe", duration: 4.25, text: "",
    segments: revise ? [{ ...said("rev-0001", 0, "S01"), text: "good morning" },
                        { ...said("rev-0002", 1, "S02"), text: "hello" }, last]
                     : [...finals, last],
    speakers: { S01: "Alice", S02: "Bob" }, merged: { S03: "S01" } };
  advance(31000);
  await sleep(1100 + 300); // a watchdog tick, the resource asked, a retry's 250 ms
  out.socketCount = sockets.length;
  const again = sockets[sockets.length - 1];
  again.open();
  again.receive({ type: "error", code: "not_found", retryable: false,
                  message: "no live session 's-1' to resume (ended, expired, or never here)" });
  again.drop(4404);
  await sleep(20); // the transcript resource
  Object.assign(out, { captions: shownCaptions(), revision: revisionLine(), links: links(),
                       status: element("status").textContent, list: speakersList(),
                       start_disabled: element("start").disabled, startAtFetch,
                       statuses: mutations.filter((m) => m.text === element("status"))
                         .map((m) => m.value) });
  return out;
}

// Stop, and no final ever comes, though the socket is answered: the page gives up in the end
async function noFinalScenario() {
  await startMeeting();
  speak();
  element("stop").listeners.click();
  await sleep(300);
  sockets[0].receive({ type: "audio.ack", offset: 1600 });
  advance(11 * 60000 + 1000);
  await sleep(1100);
  return { status: element("status").textContent, start_disabled: element("start").disabled,
           closedByPage: sockets[0].closedByPage, count: sockets.length };
}

// Stop pressed right after Start, before the microphone's first 100-ms frame: the page sent
// `end` before any audio (protocol_error, 4402), and the session, closed without `end`, held
// a server slot for its resume window (a trial). FLUSH: the samples the worklet holds then.
async function quickStopScenario() {
  const held = Number(process.env.FLUSH);
  worklet.flushSamples = Number.isNaN(held) ? null : held;
  await startMeeting();
  element("stop").listeners.click();
  await sleep(300); // the flush's answer, or FLUSH_WAIT_MS without one
  const sent = sockets[0].sent;
  sockets[0].receive(finalOf([]));
  sockets[0].drop(1000);
  return { sent, posted: worklet.posted, status: element("status").textContent };
}

// an AudioContext at CTX_RATE Hz (a Bluetooth headset's 8 kHz): the worklet sent one sample per
// input sample, 8 kHz audio declared as 16 kHz, twice as fast (a trial)
async function contextRateScenario(storage) {
  worklet.contextRate = Number(process.env.CTX_RATE);
  await startMeeting();
  const stored = JSON.parse(storage.items[KEY]);
  return { start: sockets[0].sent[0], options: worklet.options, storedRate: stored.sample_rate };
}

// a session stored at 8 kHz, resumed after a reload by a page whose context runs at 48 kHz:
// it goes on at the rate it was declared at (a resume may not change it)
async function reload8kScenario() {
  const offered = !element("resume").hidden;
  element("resume").listeners.click();
  await sleep(10);
  sockets[0].open();
  return { offered, start: sockets[0].sent[0], options: worklet.options };
}

// the microphone's track ends mid-meeting (a headset unplugged): the page sent silence on and
// said "recording" (a trial)
async function micGoneScenario() {
  const ws = await startMeeting();
  speak(); speak(); // frames 0, 1
  microphones[0].end();
  const out = { status: element("status").textContent, resumeHidden: element("resume").hidden,
                stopDisabled: element("stop").disabled, released: microphones[0].stopped };
  speak(); // nothing comes from a worklet the page let go of
  out.sentWhileGone = frames(ws.sent);
  element("resume").listeners.click(); // go on with a microphone
  await sleep(10);
  out.microphones = microphones.length;
  out.statusBack = element("status").textContent;
  out.resumeHiddenBack = element("resume").hidden;
  speak(); // frame 2, from the new microphone, into the same session
  out.sentBack = frames(ws.sent);
  microphones[1].end(); // gone again: this time the meeting is stopped
  element("stop").listeners.click();
  await sleep(50);
  out.lastSent = ws.sent[ws.sent.length - 1];
  out.resumeHiddenStopped = element("resume").hidden;
  out.sockets = sockets.length;
  return out;
}

// localStorage's list of the meetings this browser recorded last (a tab closed mid-meeting
// left no way to its transcript: a trial): seven, one without a token, one the server no
// longer has, one it cannot be asked about, one still running
const RECENT = "livemeet.recorder.meetings";
// (and, among the five read: one an older page kept that holds no audio, and two that started
// in the same minute, "down" 10 s before "a")
function earlierMeetings() {
  const m = (id, hoursAgo) => ({ session_id: id, captions_token: `t-${id}`,
                                 started_at: NOW - hoursAgo * 3600000 });
  return { [RECENT]: JSON.stringify([m("r-1", 1), m("gone", 2), m("e-1", 2.5),
                                     { ...m("down", 4), started_at: NOW - 4 * 3600000 - 10000 },
                                     { session_id: "bad", started_at: NOW }, m("a", 4),
                                     m("b", 5), m("c", 6)]) };
}

// the page's scroller: 500 px shown of 400 px of page and 30 px a caption line; scrollTop
// clamped as a browser clamps it
const scroller = {
  clientHeight: 500, top: 0,
  get scrollHeight() {
    return 400 + 30 * (element("finals").children.length + element("partial").children.length);
  },
  get scrollTop() { return this.top; },
  set scrollTop(v) { this.top = Math.max(0, Math.min(v, this.scrollHeight - this.clientHeight)); },
};

// captions coming in: followed while the page is at its bottom, not once the user scrolled up
// (the newest went out of view below: a trial)
async function scrollScenario() {
  const ws = await startMeeting();
  for (let i = 0; i < 10; i++) ws.receive(final(`seg-${i}`, i));
  const out = { followed: [scroller.top, scroller.scrollHeight] };
  ws.receive({ type: "segment.partial", rev: 1,
               segments: [{ id: "", start: 10, end: 11, speaker: "S01", text: "and" }] });
  out.partial = [scroller.top, scroller.scrollHeight];
  scroller.scrollTop = 50; // the user scrolls up to read back
  ws.receive(final("seg-10", 10));
  ws.receive({ type: "audio.ack", offset: 1600 });
  out.readingBack = scroller.top;
  scroller.scrollTop = scroller.scrollHeight - scroller.clientHeight - 20; // near the bottom
  ws.receive(final("seg-11", 11));
  out.backAtBottom = [scroller.top, scroller.scrollHeight - scroller.clientHeight];
  return out;
}

// what was copied (the clipboard API, or execCommand of the selection), what is selected
const copied = [];
const selected = [];

// a caption line's speaker, for the keyboard and a screen reader; Copy's feedback
async function a11yScenario() {
  const ws = await startMeeting();
  ws.receive(said("seg-0000", 0, "S01"));
  ws.receive(said("seg-0001", 1, "S02"));
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  const speakers = element("finals").children.map((div) => {
    const who = div.children[1];
    return { tag: who.tagName, type: who.type, label: who.attributes["aria-label"] || null,
             text: who.textContent, title: who.title };
  });
  element("overlay-copy").listeners.click();
  await sleep(10);
  const listed = element("speakers-list").children.map((b) => [b.textContent, b.title]);
  // the connection drops, then (resumed) the final comes: the buttons' tooltips say so
  const titles = () => ({
    listed: element("speakers-list").children.map((b) => [b.title, b.disabled]),
    captions: element("finals").children.map((div) => [div.children[1].title,
                                                       div.children[1].disabled]) });
  ws.drop(1006);
  await sleep(10);
  const offline = titles();
  await sleep(400);
  const again = sockets[1];
  again.open();
  again.receive(ready({ resumed: true }));
  const online = titles();
  again.receive(finalOf([said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02")]));
  const finished = titles();
  return { speakers, listed, copied, selected, note: element("overlay-copied").textContent,
           offline, online, finished };
}

// times on the caption lines, and the status a final leaves (FINISH: its finish_reason)
async function timesScenario() {
  const ws = await startMeeting();
  speak();
  for (const [id, start] of [["a", 0.4], ["b", 75.2], ["c", 599.5], ["d", 3725.9]]) {
    ws.receive(final(id, start));
  }
  const times = element("finals").children.map((div) => div.children[0].textContent);
  element("stop").listeners.click();
  await sleep(300);
  ws.receive({ ...finalOf([]), duration: Number(process.env.DURATION || 3),
               finish_reason: process.env.FINISH || "stop" });
  return { times, status: element("status").textContent };
}

// The tab is being closed: whether the page asked the browser to ask first
let pageWindow = null;
function beforeUnload() {
  const ev = { prevented: false, preventDefault() { this.prevented = true; } };
  pageWindow.listeners.beforeunload(ev);
  return ev.prevented && ev.returnValue === "";
}

async function recentScenario(storage, lasting) {
  await sleep(20); // the transcripts' checks
  const listed = () => element("recent-list").children.map((li) => [
    li.children[0].textContent, li.children.filter((c) => c.href).map((a) => [a.textContent,
                                                                                a.href])]);
  const ids = () => JSON.parse(lasting.items[RECENT] || "[]").map((m) => m.session_id);
  const out = { hidden: element("recent").hidden, listed: listed(), stored: ids() };
  out.idle = beforeUnload();
  const first = await startMeeting();
  out.storedReady = ids(); // no audio yet
  speak();
  first.receive({ type: "audio.ack", offset: 1600 });
  out.storedLive = ids();
  out.recording = beforeUnload();
  element("stop").listeners.click();
  await sleep(300);
  out.stopping = beforeUnload();
  first.receive(finalOf([]));
  first.drop(1000);
  // Stop before the microphone gave audio: only the page's moment of silence is acknowledged
  const empty = await startMeeting({ session_id: "s-2" });
  element("stop").listeners.click();
  await sleep(300);
  empty.receive({ type: "audio.ack", offset: 320 });
  empty.receive({ ...finalOf([]), duration: 0.02 });
  empty.drop(1000);
  out.storedEmpty = ids();
  for (const id of ["s-3", "s-4"]) { // two more meetings: the oldest leaves the list
    const ws = await startMeeting({ session_id: id });
    speak();
    ws.receive({ type: "audio.ack", offset: 1600 });
  }
  out.storedLater = ids();
  out.storedEntry = JSON.parse(lasting.items[RECENT])[0];
  element("recent-forget").listeners.click();
  out.forgotten = { stored: lasting.items[RECENT] || null, hidden: element("recent").hidden };
  return out;
}

// What the live region of the finals (index.html: #finals) was changed by since mutation
// `mark`: the lines put into it, and the nodes in it whose text was written
function liveChanges(mark) {
  const changes = mutations.slice(mark).filter((m) => inLiveRegion(m, ["finals"]));
  return { added: changes.filter((m) => m.added).length,
           texts: changes.filter((m) => m.text).map((m) => m.text.textContent) };
}

// A keyboard user names a speaker (Enter on a button: the button has the focus when the
// server's answer comes) and merges two; then the final and a revision come. Each rebuilt the
// whole list of finals: the focus went to the page's body, and a screen reader could read
// every final again (a trial).
async function inPlaceScenario() {
  const ws = await startMeeting({ revise: true });
  const finals = [said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02"),
                  said("seg-0002", 2, "S01")];
  for (const f of finals) ws.receive(f);
  ws.receive({ type: "segment.partial", rev: 1,
               segments: [{ id: "", start: 3, end: 4, speaker: "S01", text: "and" }] });
  const lines = () => element("finals").children.slice();
  const before = lines();
  const out = {};
  // on a caption line
  let mark = mutations.length;
  const pressed = before[2].children[1];
  pressed.focus();
  answers.push("Alice");
  pressed.listeners.click();
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  out.renamed = { focusKept: focused() === pressed, sameLines: lines().every((l, i) => l === before[i]),
                  live: liveChanges(mark), shown: shownSpeakers(),
                  partial: element("partial").children[0].children[1].textContent };
  // in the speakers list
  mark = mutations.length;
  const listed = element("speakers-list").children[1];
  listed.focus();
  answers.push("Bob");
  listed.listeners.click();
  ws.receive({ type: "speaker.renamed", speaker: "S02", name: "Bob" });
  out.listRenamed = { focusKept: focused() === listed,
                      sameButton: element("speakers-list").children[1] === listed,
                      list: speakersList(), live: liveChanges(mark) };
  // a merge, through "Merge two…": S02's line shows S01's name, S02 leaves the speakers list,
  // and "Merge two…", disabled with one speaker left, hands the focus to that speaker's button
  mark = mutations.length;
  element("merge-speakers").focus();
  answers.push("S02 S01");
  element("merge-speakers").listeners.click();
  ws.receive(merged("S02", "S01"));
  out.merged = { focus: focused() === element("speakers-list").children[0],
                 mergeDisabled: element("merge-speakers").disabled,
                 sameLines: lines().every((l, i) => l === before[i]),
                 live: liveChanges(mark), shown: shownSpeakers(), list: speakersList() };
  // the final: the finals shown, and one the partial showed (from_partial)
  element("stop").listeners.click();
  await sleep(300);
  mark = mutations.length;
  const last = { ...said("seg-0003", 3, "S01"), text: "and", flags: ["from_partial"] };
  ws.receive(finalOf([...finals, last]));
  out.final = { sameLines: before.every((l, i) => l === lines()[i]),
                live: liveChanges(mark), captions: shownCaptions(),
                partialLines: element("partial").children.length, disabled: pressed.disabled };
  // a revision: seg-0000 and seg-0002 read the same again (their lines stay), seg-0001 and
  // seg-0003 become one new line
  const kept = lines();
  mark = mutations.length;
  ws.receive({ type: "transcript.revised", finish_reason: "stop",
               supersedes: ["seg-0000", "seg-0001", "seg-0002", "seg-0003"],
               segments: [{ ...finals[0], id: "rev-0001" }, { ...finals[2], id: "rev-0002" },
                          { ...said("rev-0003", 1, "S02"), end: 4, text: "hello and" }] });
  const now = lines();
  out.revised = { live: liveChanges(mark),
                  captions: shownCaptions(), kept: [now[0] === kept[0], now[2] === kept[2]] };
  return out;
}

// Stop pressed while the server is down: the status kept "connection lost: reconnecting in
// 4.0 s…" (a trial); the page now says the meeting ends once it is reconnected, and its
// retries say what they are for
async function stopOfflineScenario() {
  const ws = await startMeeting();
  speak();
  ws.drop(1006);
  const out = { dropped: element("status").textContent };
  element("stop").listeners.click();
  await sleep(250); // the flush's answer
  out.stopped = element("status").textContent;
  while (sockets.length < 2) await sleep(5);
  sockets[1].drop(1006); // the retry finds no server
  out.retried = element("status").textContent;
  while (sockets.length < 3) await sleep(5);
  const again = sockets[2];
  again.open();
  again.receive(ready({ resumed: true, offset: 1600 }));
  out.sent = again.sent.slice(1);
  again.receive(finalOf([]));
  again.drop(1000);
  out.status = element("status").textContent;
  return out;
}

// A keyboard user's focus on the buttons the page disables: a speaker in the list when the
// connection drops (and its resume), Stop pressed with Enter, a caption's speaker when the
// final comes. Each went to the page's body (Chromium, a trial).
async function focusScenario() {
  const ws = await startMeeting();
  ws.receive(said("seg-0000", 0, "S01"));
  ws.receive(said("seg-0001", 1, "S02"));
  const out = {};
  const listed = element("speakers-list").children[1];
  listed.focus();
  ws.drop(1006);
  out.dropped = { focus: focused().id, disabled: listed.disabled };
  await sleep(400);
  const again = sockets[1];
  again.open();
  again.receive(ready({ resumed: true }));
  out.resumed = { focusBack: focused() === listed, disabled: listed.disabled };
  const stop = element("stop");
  stop.focus();
  stop.listeners.click(); // Enter on Stop: a click
  out.stopped = { focus: focused().id, disabled: stop.disabled };
  await sleep(300);
  const caption = element("finals").children[0].children[1];
  caption.focus();
  again.receive(finalOf([said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02")]));
  out.final = { focus: focused().id, disabled: caption.disabled };
  return out;
}

// The controls bar (sticky at the window's top) as a long status makes it taller at 375 px:
// what the browser scrolls into view (a caption's speaker focused by Shift+Tab) went under it.
// The page keeps the bar's height as --controls-height (index.html: the scroll-margin-top of
// what is under the bar); the document's scroll-padding-top, which scrolled the page up when
// the focus went into the bar itself (a trial), stays unset.
async function controlsScenario() {
  const heights = [];
  const padding = [];
  for (const px of [58, 162]) {
    element("controls").offsetHeight = px;
    for (const [node, callback] of resizeObservers) if (node === element("controls")) callback([]);
    heights.push(element("html").style["--controls-height"]);
    padding.push(element("html").style.scrollPaddingTop || null);
  }
  return { heights, padding };
}

const mergesSent = (ws) => ws.sent.filter((m) => m.type === "speaker.merge");
const merged = (speaker, into) => ({ type: "speaker.merged", speaker, into });

// Answer the merge prompt with `answer`: what the page then sent and said
function askMerge(ws, answer) {
  const before = mergesSent(ws).length;
  answers.push(answer);
  element("merge-speakers").listeners.click();
  return { sent: mergesSent(ws).slice(before), status: element("status").textContent };
}

async function mergesScenario() {
  const ws = await startMeeting();
  const finals = [said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02"),
                  said("seg-0002", 2, "S03")];
  for (const f of finals) ws.receive(f);
  const out = { initial: shownSpeakers(), list: speakersList(), colours: shownColours(),
                buttonDisabled: element("merge-speakers").disabled };
  out.itself = askMerge(ws, "S03 S03");
  out.unseen = askMerge(ws, "S09 S01");
  out.garbled = askMerge(ws, "S03 and S01?");
  out.cancelled = askMerge(ws, null);
  out.merge = askMerge(ws, " s03 into s01 ");
  out.mergePrompt = prompts[prompts.length - 1][0];
  out.beforeAnswer = shownSpeakers(); // the server has not said so yet
  ws.receive(merged("S03", "S01"));
  out.merged = shownSpeakers();
  out.mergedColours = shownColours();
  out.mergedList = speakersList();
  out.cycle = askMerge(ws, "S01 S03");
  out.again = askMerge(ws, "S03 S02");
  answers.push("Alice");
  element("finals").children[2].children[1].listeners.click(); // S03's line: names S01
  out.renames = renamesSent(ws);
  ws.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  out.named = shownSpeakers();
  out.namedList = speakersList();
  ws.drop(1006);
  out.offlineDisabled = element("merge-speakers").disabled;
  await sleep(400);
  const again = sockets[1];
  again.open();
  again.receive(ready({ resumed: true, speakers: { S01: "Alice" }, merged: { S03: "S01" } }));
  for (const f of finals) again.receive(f);
  // the names and merges shown stay through the replay (dropped at the resume, they came back
  // with it: every resume made them flicker, a trial)
  out.beforeReplay = shownSpeakers();
  out.beforeReplayList = speakersList();
  again.receive({ type: "speaker.renamed", speaker: "S01", name: "Alice" });
  again.receive(merged("S03", "S01"));
  again.receive({ type: "segment.partial", rev: 9, segments: [] }); // the replay is over
  out.replayed = shownSpeakers();
  out.chain = askMerge(again, "S02 S03"); // into a merged label: the server resolves it
  again.receive(merged("S02", "S01"));
  out.chained = shownSpeakers();
  out.chainedList = speakersList();
  element("stop").listeners.click();
  // a final whose merges this page missed (a merge between the drop and the replay, say)
  again.receive({ ...finalOf([...finals, said("seg-0003", 3, "S04")]),
                  merged: { S03: "S01", S02: "S01", S04: "S01" } });
  out.final = shownSpeakers();
  return out;
}

// A page reloaded while finishing (Stop pressed, its final not come): it offered "Resume
// meeting" as if still recording, whose click opened the microphone and got 4404, showing
// nothing (a trial). It now resumes at once, without a microphone, for the final: LAST
// "final", the server resumes the session ending and sends it; "gone", the server finished
// it meanwhile and let it go (4404): the transcript resource has it.
async function reloadEndingScenario(storage) {
  const how = process.env.LAST || "final";
  await sleep(10);
  const out = { resumeOffered: element("resume").hidden === false,
                statusFinishing: element("status").textContent, socketCount: sockets.length };
  const ws = sockets[0];
  if (!ws) return out;
  ws.open();
  const finals = [said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02")];
  if (how === "gone") {
    storedBody = { task: "transcribe", duration: 2.5, text: "", segments: finals,
                   speakers: { S02: "Bob" } };
    ws.receive({ type: "error", code: "not_found", retryable: false,
                 message: "no live session 's-1' to resume (ended, expired, or never here)" });
    ws.drop(4404);
    await sleep(20); // the transcript resource
  } else {
    ws.receive(ready({ resumed: true, offset: 32000, revise: true, speakers: { S02: "Bob" } }));
    out.statusResumed = element("status").textContent;
    for (const f of finals) ws.receive(f);
    ws.receive({ type: "speaker.renamed", speaker: "S02", name: "Bob" });
    ws.receive(finalOf(finals));
  }
  Object.assign(out, { sent: ws.sent.slice(), microphones: microphones.length,
                       captions: shownCaptions(), revision: revisionLine(), links: links(),
                       status: element("status").textContent, storage: storage.items,
                       stopDisabled: element("stop").disabled,
                       statuses: mutations.filter((m) => m.text === element("status"))
                         .map((m) => m.value) });
  return out;
}

async function goneScenario(storage) {
  element("resume").listeners.click();
  await sleep(10);
  sockets[0].open();
  speak();
  sockets[0].receive({ type: "error", code: "not_found", message: "no session 's-1'",
                       retryable: false });
  sockets[0].drop(4404);
  await sleep(20); // the transcript's check
  return { storage: storage.items, status: element("status").textContent, links: links(),
           resume_hidden: element("resume").hidden, start_disabled: element("start").disabled };
}

// the API key: typed in the page (one kept by the tab is shown on load), sent in `start`, and
// again in the resume's `start` after a drop
const API_KEY = "livemeet.recorder.api_key";
async function apiKeyScenario(storage) {
  const shown = element("api-key").value;
  element("api-key").value = " lm_typed ";
  element("api-key").listeners.change();
  await startMeeting();
  sockets[0].drop(1006);
  await sleep(400);
  sockets[1].open();
  return { shown, stored: storage.items[API_KEY] };
}

// no key typed, on a server that asks for one: refused (4401), and the page says what to do
async function refusedScenario(storage) {
  element("start").listeners.click();
  await sleep(10);
  sockets[0].open();
  sockets[0].receive({ type: "error", code: "unauthorized",
                       message: "this server needs an API key", retryable: false });
  sockets[0].drop(4401);
  return { status: element("status").textContent, start_disabled: element("start").disabled,
           stored: storage.items[API_KEY] || null };
}

// a reloaded page offers to resume a session whose window ends a second later: the offer went
// stale, and a click after it found no session (a trial); then, a click a minute later
async function staleScenario(storage) {
  const offered = !element("resume").hidden;
  await sleep(1100); // the window's end (59 s of it had passed)
  const out = { offered, resume_hidden: element("resume").hidden,
                status: element("status").textContent, links: links(), storage: storage.items };
  return out;
}

// the offer withdrawn at the window's end, as the server ends the meeting: its transcript is
// still "running" when asked, then final (TRANSCRIPT_SEQUENCE); the note said "(the finals so
// far)" for good (a trial)
async function staleEndingScenario() {
  const offeredLines = shownSpeakers();
  storedBody = { ...storedBody, segments: [...storedBody.segments, said("seg-0002", 2, "S03")] };
  await sleep(1100); // the window's end (59 s of it had passed)
  const out = { first: links().note, firstStatus: element("status").textContent, offeredLines,
                withdrawnLines: shownSpeakers(), withdrawnList: speakersList(),
                withdrawnHint: element("speakers-hint").textContent,
                overlayShown: !element("overlay").hidden,
                title: element("finals").children[0].children[1].title };
  await sleep(3300); // asked again
  const asked = fetched.filter((url) => url.includes("/sessions/s-1/transcript")).length;
  Object.assign(out, { later: links().note, status: element("status").textContent, asked });
  await sleep(3300); // and no more
  out.askedAfter = fetched.filter((url) => url.includes("/sessions/s-1/transcript")).length;
  return out;
}

async function lateClickScenario(storage) {
  const offered = !element("resume").hidden;
  advance(60000); // the user came back a minute later
  element("resume").listeners.click();
  await sleep(20);
  return { offered, sockets_opened: sockets.length, resume_hidden: element("resume").hidden,
           status: element("status").textContent, links: links(), storage: storage.items };
}

async function expiredScenario(storage) {
  await sleep(20); // the transcript's check
  return { storage: storage.items, status: element("status").textContent, links: links(),
           lines: shownSpeakers(),
           resume_hidden: element("resume").hidden };
}

// ---- the wall clock steps (STEP ms, minutes either way: an NTP correction, the user setting
// the time, a VM resumed) while the monotonic clock runs on: the page's timers must count
// the time that really passed

// A socket owes an ack and the server says no more: it is judged dead 15 s of real time
// after (ACK_TIMEOUT_MS), not at the next tick (stepped forward: a live socket was dropped)
// nor minutes later (stepped back: a dead one went unnoticed for as long)
async function stepDeadScenario() {
  await startMeeting();
  speak();
  sockets[0].receive({ type: "audio.ack", offset: 1600 });
  speak(); // frame 1: never acknowledged
  stepWall(STEP);
  advance(14000);
  await sleep(1100); // a watchdog tick
  const out = { socketsAt14s: sockets.length, closedAt14s: Boolean(sockets[0].closedByPage),
                statusAt14s: element("status").textContent };
  advance(2000);
  await sleep(1100 + 300); // a watchdog tick, and the first retry's 250 ms
  out.closedByPage = Boolean(sockets[0].closedByPage);
  out.statusDead = element("status").textContent;
  const retry = sockets[1];
  if (retry) {
    retry.open();
    retry.receive(ready({ resumed: true, offset: 1600 }));
    out.resumeStart = retry.sent[0];
    out.resent = frames(retry.sent);
  }
  out.status = element("status").textContent;
  return out;
}

// The server acknowledges each frame within a watchdog tick; the wall clock jumps forward by
// STEP between a send and its ack, then back: the socket stays, and the meeting ends as ever
async function stepHealthyScenario() {
  const ws = await startMeeting();
  const out = { statuses: [] };
  for (const [i, step] of [STEP, -STEP].entries()) {
    speak(); // frame i, owed an ack
    stepWall(step);
    advance(300);
    await sleep(1100); // a watchdog tick before the ack
    if (ws.closedByPage) break; // dropped: it hears nothing more
    ws.receive({ type: "audio.ack", offset: 1600 * (i + 1) });
    out.statuses.push(element("status").textContent);
  }
  Object.assign(out, { socketCount: sockets.length, closedByPage: Boolean(ws.closedByPage) });
  if (!ws.closedByPage) {
    element("stop").listeners.click();
    await sleep(300);
    ws.receive(finalOf([final("seg-0000", 0)]));
    ws.drop(1000);
  }
  out.status = element("status").textContent;
  return out;
}

// Stop, the last audio's ack, then silence, the wall clock stepping by STEP as it begins: the
// transcript resource is asked after 30 s of real silence (FINAL_QUIET_MS), not at once
// (forward) nor minutes later (back); TRANSCRIPT_STATUS "final": the socket is dead, resumed
async function stepQuietScenario() {
  await startMeeting();
  speak();
  element("stop").listeners.click();
  await sleep(300);
  sockets[0].receive({ type: "audio.ack", offset: 1600 });
  stepWall(STEP);
  return quietFor31s(sockets[0]);
}

// A drop (1006), the wall clock stepping by STEP; the first retry reaches a server, and its
// connection drops too before session.ready. Forward (under a second really passed): the
// session's 60-s window is not over, the page tries again (it gave up). Back, and a minute
// and a second later: the window is over, the page gives up (it tried on for minutes more).
async function stepWindowScenario() {
  const ws = await startMeeting();
  ws.drop(1006);
  stepWall(STEP);
  if (STEP < 0) advance(61000);
  await sleep(300); // the first retry, after 250 ms
  const retry = sockets[1];
  retry.open();
  retry.drop(1006);
  const status = element("status").textContent;
  await sleep(600); // a second retry comes 500 ms after
  return { status, socketCount: sockets.length, start_disabled: element("start").disabled };
}

// Reloaded with its meeting stored 5 s before (a 60-s window), the wall clock stepping by STEP
// before the click on Resume meeting. Forward (a moment really passed): resumed (the page
// withdrew it as past its window). Back, and 56 s later: withdrawn (the page resumed it).
async function stepOfferScenario(storage) {
  const offered = !element("resume").hidden;
  stepWall(STEP);
  if (STEP < 0) advance(56000);
  element("resume").listeners.click();
  await sleep(20);
  if (sockets[0]) sockets[0].open();
  return { offered, socketCount: sockets.length,
           resumeStart: sockets[0] ? sockets[0].sent[0] : null,
           resume_hidden: element("resume").hidden, status: element("status").textContent,
           storage: storage.items };
}

// Stop (and with `revise`, the final, which promised a revision); then the server says no
// more, while the transcript resource says it is still at it. The wall clock steps by STEP:
// forward by 11 minutes, a second later the page waits on (it gave up) and shows what comes;
// back, 11 minutes and a second later it gives up (it waited on).
async function stepGiveUpScenario(revise) {
  const said0 = said("seg-0000", 0, "S01");
  const ws = await startMeeting({ revise });
  ws.receive(said0);
  speak();
  element("stop").listeners.click();
  await sleep(300);
  ws.receive({ type: "audio.ack", offset: 1600 });
  if (revise) ws.receive(finalOf([said0]));
  stepWall(STEP);
  advance(STEP < 0 ? 11 * 60000 + 1000 : 1000);
  await sleep(1100); // a watchdog tick
  const out = { status: element("status").textContent, revision: revisionLine(),
                closedByPage: Boolean(ws.closedByPage), start_disabled: element("start").disabled };
  if (!ws.closedByPage) { // still waiting: what it waits for comes
    ws.receive(revise ? { type: "transcript.revised", finish_reason: "stop",
                          supersedes: ["seg-0000"],
                          segments: [{ ...said("rev-0001", 0, "S01"), text: "good morning" }] }
                      : finalOf([said0]));
    out.then = { status: element("status").textContent, revision: revisionLine() };
  }
  return out;
}

// Reloaded while finishing: Stop was pressed 10 minutes before the load (stopped_at, the wall
// clock's). The page gives up 11 minutes after that Stop (FINAL_GIVE_UP_MS), counting the
// time after the load on its own clock while the wall clock steps by STEP: forward, a second
// after the load it waits on (it gave up); back, 61 s after the load it gives up (it waited).
async function stepReloadEndingScenario() {
  const ws = sockets[0];
  ws.open();
  ws.receive(ready({ resumed: true, offset: 32000 })); // then `end`: no audio
  stepWall(STEP);
  if (STEP < 0) advance(61000);
  await sleep(1100); // a watchdog tick
  const out = { status: element("status").textContent, closedByPage: Boolean(ws.closedByPage),
                start_disabled: element("start").disabled };
  if (!ws.closedByPage) {
    ws.receive(finalOf([said("seg-0000", 0, "S01")]));
    out.then = element("status").textContent;
  }
  return out;
}

// Reloaded while finishing, as the page's first step on a clock a browser coarsens
// (MONOTONIC_AT_LOAD 0: performance.now() reads 0): the socket it opens at once never does
// (a dead network path: no close). 16 s on, a watchdog tick: it gives up on that socket
// (CONNECT_TIMEOUT_MS) and reconnects.
async function coarseLoadScenario() {
  const ws = sockets[0];
  advance(16000);
  await sleep(1100); // a watchdog tick
  return { closedByPage: Boolean(ws.closedByPage), socketCount: sockets.length,
           status: element("status").textContent };
}

// A name the page refuses: its reason shows for 8 s (NOTE_MS), then the recording status;
// the wall clock steps by STEP at once (forward: the reason went at the next tick; back: it
// stayed for minutes)
async function stepNoteScenario() {
  const ws = await startMeeting();
  ws.receive(said("seg-0000", 0, "S01"));
  answers.push("\u200b"); // no visible character
  element("finals").children[0].children[1].listeners.click();
  const noted = [element("status").textContent];
  stepWall(STEP);
  advance(7000);
  await sleep(1100);
  noted.push(element("status").textContent);
  advance(1000);
  await sleep(1100);
  noted.push(element("status").textContent);
  return { noted };
}

// Loaded past its stored meeting's window while the server is still ending it
// (TRANSCRIPT_SEQUENCE "running,…"): the page asks about it every 3 s for at most 3 minutes
// (TRANSCRIPT_POLL_MAX_MS). The clocks moved as its first ask was answered (at the load
// below): the wall clock by STEP, and, stepped back, 3 minutes and a second. Forward: it asks
// again (it stopped asking); back: it asks no more (it asked on for minutes).
async function stepPollScenario() {
  const askedFirst = asked();
  await sleep(3300); // a next ask, after 3 s
  return { askedFirst, askedAfter: asked(), status: element("status").textContent };
}
function stepPollAtLoad() {
  if (STEP < 0) advance(3 * 60000 + 1000);
  stepWall(STEP);
}

// The times saved for a reload stay the wall clock's, stepped or not (a reloaded page can only
// count the time since them on it): alive_at is refreshed on acks at most once a second of
// real time (stepped back, it was not refreshed until the wall clock passed the last one),
// started_at and stopped_at are the wall clock's times of Start and Stop.
async function stepSavedScenario(storage) {
  const ws = await startMeeting();
  const saved = () => JSON.parse(storage.items[KEY]);
  speak();
  ws.receive({ type: "audio.ack", offset: 1600 });
  const out = { atStart: saved() };
  stepWall(STEP);
  advance(1500);
  speak();
  ws.receive({ type: "audio.ack", offset: 3200 });
  Object.assign(out, { afterStep: saved(), wallAfterStep: clock });
  advance(1000);
  out.wallAtStop = clock;
  element("stop").listeners.click();
  await sleep(300);
  out.stopped = saved();
  return out;
}

(async () => {
  const initial = { export: {}, reload: stored(5000), reloadfinals: stored(5000),
                    gone: stored(5000),
                    expired: stored(90000), names: {}, merges: {},
                    apikey: { "livemeet.recorder.api_key": "lm_kept" }, refused: {},
                    revised: {}, unrevised: {}, reload8k: stored(5000, 8000),
                    stale: stored(59000), staleending: stored(59000), lateclick: stored(5000),
                    reloadending: stored(5000, 16000, { ending: true, revise: true,
                                                        stopped_at: NOW - 5000 }),
                    stepoffer: stored(5000), steppoll: stored(90000),
                    stepreloadending: stored(5000, 16000, { ending: true,
                                                            stopped_at: NOW - 600000 }),
                    coarseload: stored(5000, 16000, { ending: true, stopped_at: NOW - 5000 }),
                  }[scenario] || {};
  const storage = new FakeStorage(initial);
  // the meeting stored before a reload is in the page's list of meetings too (it joined it
  // when it started), beside an earlier one
  const withStored = () => ({ [RECENT]: JSON.stringify([
    { session_id: "s-1", captions_token: "c/t+k=", started_at: NOW - 120000 },
    { session_id: "r-1", captions_token: "t-r-1", started_at: NOW - 3600000 }]) });
  const lasting = new FakeStorage({ recent: earlierMeetings(), reload: withStored(),
                                    expired: withStored(),
                                    reloadending: withStored() }[scenario]);
  const kept = process.env.TRANSCRIPT_STATUS || "final"; // the server's X-Livemeet-Transcript-Status
  if (["reloadfinals", "staleending", "expired"].includes(scenario)) {
    // what the server holds of the meeting so far
    storedBody = { task: "transcribe", duration: 2.0, text: "",
                   segments: [said("seg-0000", 0, "S01"), said("seg-0001", 1, "S02")],
                   speakers: { S02: "Bob" } };
  }
  const sandbox = makeSandbox(storage, kept, lasting);
  pageWindow = sandbox.window;
  element("start").disabled = true; // as index.html ships it, beside its status
  element("status").textContent = "loading…";
  vm.runInNewContext(fs.readFileSync(source, "utf8"), sandbox);
  // (the page's first ask of the transcript resource is answered once this script awaits)
  if (scenario === "steppoll") stepPollAtLoad();
  // what the page shows before anything it asked the server answers (readyz included)
  const atLoad = { status: element("status").textContent, startDisabled: element("start").disabled,
                   resumeHidden: element("resume").hidden };
  await sleep(10); // the page's own start-up
  // the demo banner as readyz left it (a session.ready later sets it by its own `demo`)
  const banner = { display: element("demo-banner").style.display,
                   text: element("demo-banner").textContent };
  const scenarios = { export: exportScenario, reload: reloadScenario, gone: goneScenario,
                      expired: expiredScenario, names: namesScenario, merges: mergesScenario,
                      apikey: apiKeyScenario, refused: refusedScenario,
                      revised: revisedScenario, unrevised: unrevisedScenario,
                      badnames: badNamesScenario, violation: violationScenario,
                      deadpath: deadPathScenario, longid: longIdScenario, nofinal: noFinalScenario,
                      slowfinal: slowFinalScenario,
                      quickstop: quickStopScenario, ctxrate: contextRateScenario,
                      reload8k: reload8kScenario, micgone: micGoneScenario,
                      recent: recentScenario, stale: staleScenario,
                      lateclick: lateClickScenario, scroll: scrollScenario,
                      a11y: a11yScenario, times: timesScenario, inplace: inPlaceScenario,
                      controls: controlsScenario, deadrevision: deadRevisionScenario,
                      reloadending: reloadEndingScenario, focus: focusScenario,
                      reloadfinals: reloadFinalsScenario,
                      stopoffline: stopOfflineScenario, staleending: staleEndingScenario,
                      silentrev: () => silentScenario(true),
                      silentfinal: () => silentScenario(false),
                      stepdead: stepDeadScenario, stephealthy: stepHealthyScenario,
                      stepquiet: stepQuietScenario, stepwindow: stepWindowScenario,
                      stepoffer: stepOfferScenario, stepfinal: () => stepGiveUpScenario(false),
                      steprevision: () => stepGiveUpScenario(true),
                      stepreloadending: stepReloadEndingScenario, stepnote: stepNoteScenario,
                      steppoll: stepPollScenario, stepsaved: stepSavedScenario,
                      storagefull: storageFullScenario, coarseload: coarseLoadScenario };
  const result = await scenarios[scenario](storage, lasting);
  result.sockets = sockets.map((s) => s.sent);
  result.fetched = fetched;
  result.atLoad = atLoad;
  result.banner = banner;
  result.recentListed = element("recent-list").children.map((li) => li.children[0].title);
  console.log(JSON.stringify(result));
  process.exit(0);
})();
