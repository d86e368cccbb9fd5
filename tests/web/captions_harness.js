// Runs livemeet/web/captions.js (the captions overlay) in stub browsers (node's vm) with fake
// WebSockets the script drives by hand, through a snapshot, live events, a dropped connection
// and its reconnect, the session's end, refusals, speaker names (snapshot, live, after a
// reconnect), speaker merges (snapshot, live, a chain, after a reconnect, a final's `merged`),
// a revision (and a reconnect after it), the meeting's end (its last lines linger, then go)
// and a session that is gone (4404); also loads
// livemeet/web/recorder.js to compare the two pages' speaker colours. Prints one JSON line. argv:
// captions.js, recorder.js.
const fs = require("fs");
const vm = require("vm");

const [captionsSource, recorderSource] = process.argv.slice(2);

// `speed`: the page's timers run that many times faster (a 10-s wait in 10 ms at 1000)
function page(search, source, base = "https://meet.example:8000/", speed = 1) {
  const elements = {};
  function element(id) {
    if (!elements[id]) {
      elements[id] = {
        id, className: "", disabled: false, hidden: false, textContent: "", style: {},
        listeners: {}, children: [],
        addEventListener(type, fn) { this.listeners[type] = fn; },
        replaceChildren(...c) { this.children = c; },
        append(...c) { this.children.push(...c); },
      };
    }
    return elements[id];
  }
  const sockets = [];
  class FakeWebSocket {
    constructor(url) { this.url = url; sockets.push(this); }
    receive(ev) { this.onmessage({ data: JSON.stringify(ev) }); }
    drop(code) { this.onclose({ code }); }
    send() { throw new Error("the overlay must send nothing"); }
  }
  let created = 0;
  const sandbox = {
    document: { getElementById: element, createElement: () => element(`new-${created++}`) },
    window: { isSecureContext: true, addEventListener() {} },
    navigator: {},
    location: { host: new URL(base).host, protocol: new URL(base).protocol, search,
                href: `${base}captions.html${search}` },
    URL, URLSearchParams, WebSocket: FakeWebSocket, clearTimeout, setInterval,
    setTimeout: (fn, ms) => setTimeout(fn, ms / speed),
    clearInterval, console,
    fetch: async () => ({ ok: true, json: async () => ({ demo: false, model: "m" }) }),
  };
  vm.runInNewContext(fs.readFileSync(source, "utf8"), sandbox);
  // what the overlay shows: one string per line, "S01: text" (+ " ~" when partial)
  const shown = () => element("lines").children.map((line) => {
    const [who, text] = line.children;
    return `${who.textContent} ${text.textContent}${line.className.includes("partial") ? " ~" : ""}`;
  });
  const colours = () => element("lines").children.map((line) => line.children[0].style.color);
  // what is drawn over the video: the lines, and the status if displayed
  const visible = () => ({ lines: shown(), status: element("status").style.display === "block"
    ? element("status").textContent : "" });
  return { sandbox, sockets, element, shown, colours, visible };
}

const seg = (id, start, end, speaker, text) => ({ id, start, end, speaker, text });
const final = (s) => ({ type: "segment.final", ...s });
const partial = (rev, segments) => ({ type: "segment.partial", rev, segments });
const ready = { type: "captions.ready", session_id: "s 1", protocol: 0, demo: true, model: "m" };
const s0 = seg("seg-0000", 0, 2, "S01", "one");
const s1 = seg("seg-0001", 2, 4, "S02", "two");
const s2 = seg("seg-0002", 4, 6, "S01", "three");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const out = {};
  const overlay = page("?session=s%201&token=t%2Bk%2F&lines=3", captionsSource);
  const ws = overlay.sockets[0];
  out.url = ws.url;
  ws.receive(ready); // the snapshot: the last finals, then the partial
  ws.receive(final(s0));
  ws.receive(final(s1));
  // the partial still holds what seg-0001 committed, and the open tail
  ws.receive(partial(5, [seg("", 2, 4, "S02", "two"), seg("", 4, 5, "S01", "thr")]));
  out.snapshot = overlay.shown();
  ws.receive(final(s1)); // a repeat (as a reconnect's snapshot repeats): shown once
  ws.receive(final(s2));
  ws.receive(partial(6, [seg("", 6, 7, "S03", "fo")]));
  out.live = overlay.shown();
  out.liveColours = overlay.colours();
  ws.drop(1006);
  await sleep(700); // the first retry comes after RECONNECT_FIRST_MS
  out.socketsAfterDrop = overlay.sockets.length;
  const again = overlay.sockets[overlay.sockets.length - 1];
  again.receive(ready);
  again.receive(final(s1));
  again.receive(final(s2));
  again.receive(partial(7, [seg("", 6, 8, "S03", "four")]));
  out.afterReconnect = overlay.shown();
  const done = seg("seg-0003", 6, 8, "S03", "four");
  again.receive({ type: "transcript.final", segments: [s0, s1, s2, done], finish_reason: "stop",
                  coverage: 1, duration: 8 });
  out.ended = overlay.shown();
  again.drop(1000);
  await sleep(700);
  out.socketsAfterEnd = overlay.sockets.length;

  // speaker names: in the snapshot, then live (null: the label again), then after a reconnect
  // whose snapshot holds only the names the session still has
  const renamed = (speaker, name) => ({ type: "speaker.renamed", speaker, name });
  const named = page("?session=s&token=t&lines=3", captionsSource);
  const nws = named.sockets[0];
  nws.receive(ready);
  nws.receive(final(s0));
  nws.receive(final(s1));
  nws.receive(renamed("S01", "Alice"));
  nws.receive(partial(5, [seg("", 4, 5, "S01", "thr")]));
  out.namesSnapshot = named.shown();
  out.namesSnapshotColours = named.colours();
  nws.receive(renamed("S02", "Bob"));
  out.namesLive = named.shown();
  nws.receive(renamed("S01", null));
  nws.receive({ type: "speaker.unknown", speaker: "S01" }); // unknown types are ignored
  out.namesCleared = named.shown();
  nws.receive(renamed("S01", "Ann"));
  nws.drop(1006);

  // the session is gone (the meeting ended; OBS reloaded the source): nothing is drawn
  const gone = page("?session=s&token=t", captionsSource);
  gone.sockets[0].receive({ type: "error", code: "not_found", message: "no session 's'",
                            retryable: false });
  gone.sockets[0].drop(4404);
  // lines shown, then the meeting ended while the overlay was reconnecting (a server
  // restart): 4404 on the reconnect. They went at once, the final never seen (a trial): now
  // they linger as after the final (10 s, here 100 times faster), then go
  const dropped = page("?session=s&token=t", captionsSource, undefined, 100);
  dropped.sockets[0].receive(ready);
  dropped.sockets[0].receive(final(s0));
  dropped.sockets[0].drop(1006);
  await sleep(10); // the retry, after 500 ms of the page's
  dropped.sockets[1].receive({ type: "error", code: "not_found", message: "no session 's'",
                               retryable: false });
  dropped.sockets[1].drop(4404);
  out.droppedAtClose = { sockets: dropped.sockets.length, ...dropped.visible() };
  const goneDebug = page("?session=s&token=t&debug=1", captionsSource);
  goneDebug.sockets[0].drop(4404);

  const refused = page("?session=s&token=bad", captionsSource);
  refused.sockets[0].receive({ type: "error", code: "unauthorized", message: "wrong token",
                               retryable: false });
  refused.sockets[0].drop(4401);
  await sleep(700);
  out.refused = { sockets: refused.sockets.length, status: refused.element("status").textContent };
  out.gone = { sockets: gone.sockets.length, ...gone.visible() };
  out.droppedGone = { sockets: dropped.sockets.length, ...dropped.visible() };
  out.goneDebug = goneDebug.visible();
  const nagain = named.sockets[named.sockets.length - 1];
  out.namedSockets = named.sockets.length;
  nagain.receive(ready);
  nagain.receive(final(s0));
  nagain.receive(final(s1));
  nagain.receive(renamed("S02", "Robert")); // S01's name was removed meanwhile
  nagain.receive(partial(6, []));
  out.namesAfterReconnect = named.shown();

  // a revision replaces the finals it supersedes (names stay on their labels); a reconnect's
  // snapshot (the superseded finals, the final, the revision) shows it once, unchanged
  const revised = page("?session=s&token=t&lines=5", captionsSource);
  const rws = revised.sockets[0];
  const finished = { type: "transcript.final", segments: [s0, s1, s2], finish_reason: "stop",
                     coverage: 1, duration: 6 };
  const revision = { type: "transcript.revised", finish_reason: "stop",
                     supersedes: ["seg-0000", "seg-0001", "seg-0002"],
                     segments: [seg("rev-0001", 0, 3, "S01", "one, two"),
                                seg("rev-0002", 3, 6, "S02", "and three")] };
  rws.receive(ready);
  rws.receive(final(s0));
  rws.receive(final(s1));
  rws.receive(renamed("S01", "Alice"));
  rws.receive(final(s2));
  rws.receive(finished);
  out.revisedBefore = revised.shown();
  rws.receive(revision);
  out.revised = revised.shown();
  rws.drop(1006); // as if the close after the revision were lost
  await sleep(700);
  const ragain = revised.sockets[revised.sockets.length - 1];
  [ready, final(s0), final(s1), final(s2), renamed("S01", "Alice"), finished, revision]
    .forEach((ev) => ragain.receive(ev));
  out.revisedAfterReconnect = revised.shown();

  // speaker merges: in the snapshot, then live (a chain: S03 into S02, then S02 into S01),
  // then after a reconnect whose snapshot replays them; and a final's `merged` alone
  const merged = (speaker, into) => ({ type: "speaker.merged", speaker, into });
  const s3 = seg("seg-0003", 6, 8, "S03", "four");
  const merging = page("?session=s&token=t&lines=5", captionsSource);
  const mws = merging.sockets[0];
  [ready, final(s0), final(s1), final(s3), renamed("S01", "Alice"), merged("S03", "S02"),
   partial(9, [seg("", 8, 9, "S03", "fi")])].forEach((ev) => mws.receive(ev));
  out.mergesSnapshot = merging.shown();
  mws.receive(merged("S02", "S01"));
  out.mergesLive = merging.shown();
  out.mergesLiveColours = merging.colours();
  mws.drop(1006);
  await sleep(700);
  const magain = merging.sockets[merging.sockets.length - 1];
  magain.receive(ready);
  out.mergesDropped = merging.shown(); // until the snapshot's merges come again
  [final(s3), renamed("S01", "Alice"), merged("S03", "S02"), merged("S02", "S01")]
    .forEach((ev) => magain.receive(ev));
  out.mergesAfterReconnect = merging.shown();
  // a server whose captions.ready carries the snapshot's names and merges: nothing flickers
  magain.drop(1006);
  await sleep(1200);
  const mthird = merging.sockets[merging.sockets.length - 1];
  mthird.receive({ ...ready, speakers: { S01: "Alice" }, merged: { S03: "S02", S02: "S01" } });
  out.mergesAtReadyWithMaps = merging.shown();
  [final(s3), renamed("S01", "Alice"), merged("S03", "S02"), merged("S02", "S01")]
    .forEach((ev) => mthird.receive(ev));
  out.mergesAfterMapsSnapshot = merging.shown();
  mthird.receive({ ...ready, speakers: { S02: "Bob", S04: 7 }, merged: null });
  out.mapsReplaced = merging.shown(); // only what the new ready says (a non-string ignored)
  const late = page("?session=s&token=t", captionsSource);
  [ready, { type: "transcript.final", segments: [s0, s3], finish_reason: "stop", coverage: 1,
            duration: 8, merged: { S03: "S01" } }].forEach((ev) => late.sockets[0].receive(ev));
  out.mergesFromTheFinal = late.shown();

  // the meeting's end: its last lines stay a while (10 s, here 100 times faster), then go;
  // nothing reconnects
  const ending = page("?session=s&token=t&debug=1", captionsSource, undefined, 100);
  [ready, final(s0), final(s1), { type: "transcript.final", segments: [s0, s1],
                                   finish_reason: "stop", coverage: 1, duration: 4 }]
    .forEach((ev) => ending.sockets[0].receive(ev));
  ending.sockets[0].drop(1000);
  out.endedAtClose = ending.visible();
  await sleep(50); // 5 s of the page's
  out.endedAfter5s = ending.visible();
  await sleep(100);
  out.endedAfter15s = { sockets: ending.sockets.length, ...ending.visible() };

  const slow = page("?session=s&token=t", captionsSource);
  slow.sockets[0].drop(4429); // queue_full: reconnect for a fresh snapshot
  await sleep(700);
  out.socketsAfterQueueFull = slow.sockets.length;

  // served by a proxy under a path: the subscription goes there too, as ws:// on http
  const prefixed = page("?session=s&token=t", captionsSource, "http://meet.example/meet/");
  out.prefixedUrl = prefixed.sockets[0].url;

  const bare = page("", captionsSource);
  out.bare = { sockets: bare.sockets.length, status: bare.element("status").textContent };

  const recorder = page("", recorderSource);
  const labels = ["S01", "S02", "S03", "S08", "S09", "S12", "guest"];
  out.colours = {
    captions: labels.map((l) => overlay.sandbox.speakerColour(l)),
    recorder: labels.map((l) => recorder.sandbox.speakerColour(l)),
  };
  console.log(JSON.stringify(out));
  process.exit(0);
}

main();
