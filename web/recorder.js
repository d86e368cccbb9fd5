// Microphone -> /v1/live (protocol v0, docs/protocol.md) -> partial (grey) and final captions.
const KEEPALIVE_MS = 10000;
const SPEAKER_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                         "#e377c2", "#17becf"];

const $ = (id) => document.getElementById(id);
const state = { ws: null, ctx: null, stream: null, node: null, keepalive: null, colours: {},
                opened: false };

function speakerColour(speaker) {
  if (!(speaker in state.colours)) {
    const n = Object.keys(state.colours).length;
    state.colours[speaker] = SPEAKER_COLOURS[n % SPEAKER_COLOURS.length];
  }
  return state.colours[speaker];
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

function onEvent(ev) {
  switch (ev.type) {
    case "session.ready":
      $("demo-banner").style.display = ev.demo ? "block" : "none";
      setStatus(`recording (session ${ev.session_id}, model ${ev.model})`);
      break;
    case "segment.partial":
      $("partial").replaceChildren(...ev.segments.map(segmentElement));
      break;
    case "segment.final":
      $("finals").append(segmentElement(ev));
      break;
    case "transcript.final":
      $("partial").replaceChildren();
      $("finals").replaceChildren(...ev.segments.map(segmentElement));
      setStatus(`done: ${ev.duration.toFixed(1)} s, ${ev.finish_reason}`);
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
  state.colours = {};
  state.opened = false;
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
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/live`);
  ws.binaryType = "arraybuffer";
  state.ws = ws;
  ws.onopen = () => {
    state.opened = true;
    ws.send(JSON.stringify({ type: "start", sample_rate: 16000, channels: 1,
                             encoding: "pcm_s16le" }));
    state.node.port.onmessage = (msg) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(msg.data);
    };
    source.connect(state.node);
    state.keepalive = setInterval(() => ws.send(JSON.stringify({ type: "keepalive" })),
                                  KEEPALIVE_MS);
    $("stop").disabled = false;
  };
  ws.onmessage = (msg) => onEvent(JSON.parse(msg.data));
  ws.onclose = (ev) => {
    clearInterval(state.keepalive);
    stopAudio();
    if (!state.opened) setStatus(`cannot connect to the server (closed ${ev.code})`);
    else if (ev.code === 1001) {
      // the server shut down and drained the session: the transcript above is final up to
      // where it stopped; a new recording continues on a server that is up
      setStatus("the server restarted: the transcript is final up to here; press Start to go on");
    } else if (ev.code !== 1000) setStatus(`${$("status").textContent} (closed ${ev.code})`);
    $("start").disabled = false;
    $("stop").disabled = true;
  };
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
  if (state.ws && state.ws.readyState === WebSocket.OPEN) {
    state.ws.send(JSON.stringify({ type: "end" }));
    setStatus("finishing…");
  }
}

$("start").addEventListener("click", () => start().catch((e) => {
  stopAudio(); // release a microphone that was granted before the failure
  setStatus(`cannot start: ${e.message}`);
  $("start").disabled = false;
}));
$("stop").addEventListener("click", stop);
showServer();
