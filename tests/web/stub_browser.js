// The stub browser livemeet/web/recorder.js runs in under node's vm (resume_harness.js,
// session_harness.js): elements made on first lookup, WebSockets and a microphone the harness
// drives by hand. `stubBrowser()` gives one page's worth:
// - element(id): the page element `id` ({textContent, disabled, style, listeners, children,
//   attributes, parentNode}; one the page made has its tagName); children move as in a DOM
//   (append, insertBefore, remove, replaceChildren take a node from where it was), and a node
//   taken out of its parent takes the keyboard focus (`focus()`) along, as does an element
//   disabled while it has it (a browser's focus fixup): `focused()` is then the body;
// - mutations: what the page changed, in order: {added: node, to: parent} for each node put
//   into a parent, {text: node, value} for each write of a node's textContent, each with `within`,
//   the changed node's ancestors then (a live region reads out both, as its aria-relevant
//   allows: inLiveRegion tells whether a change was made inside one);
// - sockets: every FakeWebSocket the page opened, in order: open(), receive(event),
//   drop(code); `sent` holds text frames parsed and binary ones as {frame, frames} (the
//   frame's first sample, its sample count); `closedByPage`: the page called close();
// - speak(): the microphone delivers one 100-ms frame (1,600 samples at 16 kHz) whose
//   samples all hold its index (0, 1, ...), so `sent` shows which frame went where;
// - worklet: what the page posted to the worklet node (`posted`), the node's options,
//   `flushSamples`: the samples its answer to a "flush" holds (0 by default; null: no answer),
//   and `contextRate`: the AudioContext's sampleRate (48000 by default);
// - microphones: the track of each getUserMedia, in order: end() as an unplugged one does;
// - sandbox(extra): the page's globals (document, window, navigator, AudioContext, the
//   worklet node, WebSocket, timers, the clocks (Date, performance: node's own), URL,
//   console), `extra` added or replacing them; the window's `listeners` hold its event
//   listeners by type (beforeunload, pagehide).
function stubBrowser() {
  const elements = {};
  const mutations = [];
  const focus = { element: null };
  // `node` (an element, or a string: a text node) leaves its parent; the focus inside it goes
  function detach(node) {
    const parent = node && node.parentNode;
    if (!parent) return;
    parent.children.splice(parent.children.indexOf(node), 1);
    node.parentNode = null;
    if (contains(node, focus.element)) focus.element = element("body");
  }
  function ancestors(node) {
    const all = [];
    for (let n = node; n; n = n.parentNode) all.push(n);
    return all;
  }
  function contains(node, other) {
    for (let n = other; n; n = n.parentNode) if (n === node) return true;
    return false;
  }
  // `node` goes into `parent` before `ref` (null: at its end)
  function adopt(parent, node, ref) {
    if (typeof node === "object") detach(node);
    const at = ref ? parent.children.indexOf(ref) : parent.children.length;
    parent.children.splice(at < 0 ? parent.children.length : at, 0, node);
    if (typeof node === "object") node.parentNode = parent;
    mutations.push({ added: node, to: parent, within: ancestors(parent) });
  }
  function element(id) {
    if (!elements[id]) {
      let text = "";
      let disabled = false;
      elements[id] = {
        id, listeners: {}, children: [], attributes: {},
        // (a custom property set with setProperty is kept under its name)
        style: { setProperty(name, value) { this[name] = String(value); } },
        parentNode: null,
        get disabled() { return disabled; },
        set disabled(value) {
          disabled = value;
          if (value && focus.element === this) focus.element = element("body");
        },
        get textContent() { return text; },
        set textContent(value) {
          text = value;
          mutations.push({ text: this, value: String(value), within: ancestors(this) });
        },
        addEventListener(type, fn) { this.listeners[type] = fn; },
        setAttribute(name, value) { this.attributes[name] = String(value); },
        getAttribute(name) { return name in this.attributes ? this.attributes[name] : null; },
        replaceChildren(...c) {
          for (const old of [...this.children]) detach(old);
          this.children = [];
          this.append(...c);
        },
        append(...c) { for (const node of c) adopt(this, node, null); },
        insertBefore(node, ref) {
          adopt(this, node, ref);
          return node;
        },
        remove() { detach(this); },
        focus() { focus.element = this; },
        get firstElementChild() { return this.children.find((c) => typeof c === "object") || null; },
        get nextElementSibling() {
          const siblings = this.parentNode ? this.parentNode.children : [];
          return siblings.slice(siblings.indexOf(this) + 1)
            .find((c) => typeof c === "object") || null;
        },
      };
    }
    return elements[id];
  }
  const focused = () => focus.element || element("body");
  // `mutation` changed a live region (an element whose aria-live the page set, or one of
  // `regions`: ids of those index.html marks) as it was then
  function inLiveRegion(mutation, regions) {
    return mutation.within.some((n) => regions.includes(n.id) || n.attributes["aria-live"]);
  }

  const sockets = [];
  class FakeWebSocket {
    constructor(url) {
      this.url = url;
      this.sent = [];
      this.readyState = 0;
      sockets.push(this);
    }
    send(data) {
      if (typeof data === "string") this.sent.push(JSON.parse(data));
      else this.sent.push({ frame: new Int16Array(data)[0], frames: data.byteLength / 2 });
    }
    open() { this.readyState = 1; this.onopen(); }
    receive(ev) { this.onmessage({ data: JSON.stringify(ev) }); }
    drop(code) { this.readyState = 3; this.onclose({ code }); }
    close() { this.closedByPage = true; this.readyState = 3; }
  }
  FakeWebSocket.OPEN = 1;

  let port = null;
  // the worklet's answer to a "flush" (Stop): the samples of the frame it was filling, each
  // holding the next frame index; `flushSamples` of them (0: none), or no answer (null)
  const worklet = { flushSamples: 0, posted: [], contextRate: 48000 };
  class FakeNode {
    constructor(ctx, name, options) {
      worklet.options = options;
      this.port = {
        postMessage(m) {
          worklet.posted.push(m);
          if (m !== "flush" || worklet.flushSamples === null) return;
          const part = new Int16Array(worklet.flushSamples).fill(frameIndex++);
          setTimeout(() => port.onmessage && port.onmessage({ data: { flushed: part.buffer } }), 0);
        },
      };
      port = this.port;
    }
  }
  let frameIndex = 0;
  function speak() { // (a worklet the page let go of delivers nothing)
    if (port.onmessage) port.onmessage({ data: new Int16Array(1600).fill(frameIndex++).buffer });
  }
  // each microphone the page was given: its track ({stopped, onended}) ends by track.end()
  const microphones = [];

  function sandbox(extra) {
    return {
      document: { getElementById: element, body: element("body"),
                  documentElement: element("html"),
                  get activeElement() { return focus.element || element("body"); },
                  createElement: (tag) => Object.assign(element(`new-${Math.random()}`),
                                                        { tagName: tag.toUpperCase() }) },
      window: { isSecureContext: true, listeners: {},
                addEventListener(type, fn) { this.listeners[type] = fn; } },
      navigator: { mediaDevices: { getUserMedia: async () => {
        const track = { stopped: false, stop() { this.stopped = true; },
                        end() { if (this.onended) this.onended({ type: "ended" }); } };
        microphones.push(track);
        return { getTracks: () => [track] };
      } } },
      URL,
      AudioContext: class {
        constructor() {
          this.audioWorklet = { addModule: async () => {} };
          this.sampleRate = worklet.contextRate;
        }
        createMediaStreamSource() { return { connect() {} }; }
        close() {}
      },
      AudioWorkletNode: FakeNode,
      WebSocket: FakeWebSocket,
      setInterval, clearInterval, setTimeout, clearTimeout, Date, performance, console,
      ...extra,
    };
  }

  return { element, sockets, speak, sandbox, worklet, microphones, mutations, focused,
           inLiveRegion };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

module.exports = { stubBrowser, sleep };
