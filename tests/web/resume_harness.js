// Runs livemeet/web/recorder.js in a stub browser (node's vm) through a dropped connection and its
// resume, with a fake microphone and fake WebSockets the script drives by hand. Prints one
// JSON line: what each socket was sent, the captions shown, the status line, and a check of
// ResumeBuffer on its own. argv: recorder.js path, then "resume" (a drop and its resume),
// "expire" (the drop outlasts the session's resume window: the page gives up), "outage"
// (no server answers for longer than the window, then one does: the page resumes) or
// "restart" (the server says server_restarting, closes 1012, is down past the window, then
// answers: the page resumes), then
// optionally the page's URL (default https://meet.example:8000/).
const fs = require("fs");
const vm = require("vm");
const { stubBrowser, sleep } = require("./stub_browser");

const [source, scenario, href = "https://meet.example:8000/"] = process.argv.slice(2);
const page = new URL(href);
const { element, sockets, speak, sandbox: makeSandbox } = stubBrowser();
const sandbox = makeSandbox({
  location: { host: page.host, protocol: page.protocol, href: page.href },
  fetch: async () => ({ ok: true, json: async () => ({ demo: false, model: "m" }) }),
});
vm.runInNewContext(fs.readFileSync(source, "utf8"), sandbox);
const final = (id, start) => ({ type: "segment.final", id, start, end: start + 1,
                                speaker: "S01", text: id });

function bufferAlone() {
  const b = new sandbox.ResumeBuffer(4800); // 3 frames of 1600
  const frame = (i) => new Int16Array(1600).fill(i).buffer;
  const pushed = [0, 1, 2, 3].map((i) => b.push(frame(i))); // the 4th overflows
  b.ack(2400); // frame 0 whole, half of frame 1
  const from = b.from(2400).map((d) => [new Int16Array(d)[0], d.byteLength / 2]);
  const after = b.push(frame(4)); // room again after the ack
  return { pushed, lost: b.lostFrames, from, after, next: b.next };
}

async function expire() {
  await sleep(10);
  element("start").listeners.click();
  await sleep(10);
  sockets[0].open();
  sockets[0].receive({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                       model: "m", resume_token: "tok", resume_window_s: 0.2, resumed: false,
                       offset: 0 });
  sockets[0].drop(1006);
  await sleep(400); // one retry (after 250 ms): a server answers, and drops it, past the window
  if (sockets[1]) { sockets[1].open(); sockets[1].drop(1006); }
  await sleep(20); // (giving up schedules no further retry: the status says so)
  console.log(JSON.stringify({ sockets: sockets.length, status: element("status").textContent,
                               start_disabled: element("start").disabled }));
  process.exit(0);
}

// "outage": after the drop no server answers (killed, restarting) for longer than the
// session's window; the page keeps trying (a restarted server keeps its sessions a window from
// its own start), and resumes once one answers.
async function outage() {
  await sleep(10);
  element("start").listeners.click();
  await sleep(10);
  sockets[0].open();
  sockets[0].receive({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                       model: "m", resume_token: "tok", resume_window_s: 0.3, resumed: false,
                       offset: 0 });
  sockets[0].drop(1006);
  for (let i = 1; i <= 2; i++) { // the retries after 250 and 500 ms find no server
    while (sockets.length <= i) await sleep(5);
    sockets[i].drop(1006);
  }
  const statusDuring = element("status").textContent;
  while (sockets.length <= 3) await sleep(5); // ~1 s after the drop: past its 0.3-s window
  const last = sockets[3];
  last.open();
  last.receive({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                 model: "m", resume_token: "tok", resume_window_s: 0.3, resumed: true,
                 offset: 0 });
  console.log(JSON.stringify({ sockets: sockets.length, statusDuring,
                               resumed: last.sent[0].resume || null,
                               status: element("status").textContent }));
  process.exit(0);
}

// "restart": a graceful restart (`serve --shutdown-live keep`) sends server_restarting and
// closes 1012; the server is down for longer than the session's window, then its next start
// answers the resume. Waits are bounded: a page that gave up prints how far it got.
async function restart() {
  await sleep(10);
  element("start").listeners.click();
  await sleep(10);
  sockets[0].open();
  sockets[0].receive({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                       model: "m", resume_token: "tok", resume_window_s: 0.3, resumed: false,
                       offset: 0 });
  sockets[0].receive({ type: "error", code: "server_restarting", retryable: true,
                       message: "the server is restarting" });
  const statusRestarting = element("status").textContent;
  sockets[0].drop(1012);
  const statusClosed = element("status").textContent;
  const until = async (n) => {
    for (let waited = 0; sockets.length <= n && waited < 3000; waited += 5) await sleep(5);
    return sockets[n];
  };
  const statusRetries = [];
  const detailRetries = [];
  for (let i = 1; i <= 2; i++) { // the retries after 250 and 500 ms find no server
    const retry = await until(i);
    if (retry) retry.drop(1006);
    statusRetries.push(element("status").textContent);
    detailRetries.push(element("status-detail").textContent);
  }
  const last = await until(3); // ~1 s after the close: past its 0.3-s window
  if (last) {
    last.open();
    last.receive({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                   model: "m", resume_token: "tok", resume_window_s: 0.3, resumed: true,
                   offset: 0 });
  }
  console.log(JSON.stringify({ sockets: sockets.length, statusRestarting, statusClosed,
                               statusRetries, detailRetries,
                               resumed: last ? last.sent[0].resume || null : null,
                               status: element("status").textContent }));
  process.exit(0);
}

(async () => {
  if (scenario === "expire") return expire();
  if (scenario === "outage") return outage();
  if (scenario === "restart") return restart();
  await sleep(10); // the page's own start-up
  element("start").listeners.click();
  await sleep(10);
  const first = sockets[0];
  first.open();
  speak(); speak(); speak(); // before session.ready: kept, not sent yet
  first.receive({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                  model: "m", resume_token: "tok", resume_window_s: 60, resumed: false,
                  offset: 0, captions_token: "c/tok" });
  const overlay = { hidden: element("overlay").hidden, url: element("overlay-url").textContent };
  speak(); speak(); // frames 3, 4: live
  first.receive({ type: "audio.ack", offset: 3200 }); // frames 0, 1
  first.receive(final("seg-0000", 0));
  first.drop(1006); // the network went
  speak(); speak(); // frames 5, 6: kept for the resume
  const statusOffline = element("status").textContent;
  await sleep(400); // the first retry comes after 250 ms
  const second = sockets[1];
  second.open();
  // the server had frames 0-2 (4,800 frames): the page sends 3-6 again, then live
  second.receive({ type: "session.ready", session_id: "s-1", protocol: 0, demo: false,
                   model: "m", resume_token: "tok", resume_window_s: 60, resumed: true,
                   offset: 4800 });
  second.receive(final("seg-0000", 0)); // replay: shown already
  second.receive(final("seg-0001", 1));
  speak(); // frame 7: live on the new socket
  element("stop").listeners.click();
  await sleep(50); // Stop's flush of the worklet, then `end`
  console.log(JSON.stringify({
    sockets: sockets.length,
    liveUrl: first.url,
    first: first.sent,
    second: second.sent,
    finals: element("finals").children.length,
    statusOffline,
    status: element("status").textContent,
    buffer: bufferAlone(),
    overlay,
  }));
  process.exit(0);
})();
