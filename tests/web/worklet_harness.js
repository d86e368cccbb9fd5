// Runs livemeet/web/pcm-worklet.js (the recorder's AudioWorklet) under node's vm: a stub
// AudioWorkletProcessor whose port records what the worklet posts, fed blocks of 128 samples
// (a render quantum) as a context at `sampleRate` would. Prints one JSON line with a run per
// case. argv: pcm-worklet.js path.
const fs = require("fs");
const vm = require("vm");

const [source] = process.argv.slice(2);
const QUANTUM = 128;

// A worklet at context rate `rate`, made with `options` (the page's AudioWorkletNode options)
function worklet(rate, options) {
  let Processor = null;
  const posted = [];
  class AudioWorkletProcessor {
    constructor() { this.port = { postMessage: (m) => posted.push(m) }; }
  }
  vm.runInNewContext(fs.readFileSync(source, "utf8"), {
    sampleRate: rate, AudioWorkletProcessor, Int16Array, Math,
    registerProcessor: (name, cls) => { Processor = cls; },
  });
  const node = new Processor(options);
  // feed `samples` (numbers in -1..1) in render quanta, mono
  const feed = (samples) => {
    for (let i = 0; i < samples.length; i += QUANTUM) {
      node.process([[Float32Array.from(samples.slice(i, i + QUANTUM))]]);
    }
  };
  return { node, posted, feed };
}

const out = {};
// flush: the samples of the frame being filled, then a fresh frame
{
  const w = worklet(16000, undefined);
  w.feed(new Array(1024).fill(0.5));
  out.beforeFlush = w.posted.length;
  w.node.port.onmessage({ data: "flush" });
  const answer = w.posted[w.posted.length - 1];
  out.flushed = answer.flushed ? new Int16Array(answer.flushed).length : null;
  out.flushedValue = answer.flushed ? new Int16Array(answer.flushed)[0] : null;
  w.feed(new Array(1664).fill(0.5)); // 1,600 after the flush: one whole frame
  out.afterFlush = w.posted.slice(1).map((b) => b.byteLength / 2);
  w.node.port.onmessage({ data: "flush" });
  out.flushedAgain = new Int16Array(w.posted[w.posted.length - 1].flushed).length;
}
// rates: 1 s of a 440-Hz tone at a context's rate, posted at the output rate asked for (the
// page's processorOptions): how many samples came, and the tone's frequency in them (its
// upward zero crossings a second)
out.rates = [[8000, 8000], [8000, 16000], [11025, 11025], [44100, 16000], [48000, 16000],
             [48000, 8000], [16000, undefined]].map(([rate, outputRate]) => {
  const w = worklet(rate, outputRate ? { processorOptions: { outputRate } } : undefined);
  w.feed(Array.from({ length: rate }, (_, i) => 0.5 * Math.sin(2 * Math.PI * 440 * i / rate)));
  w.node.port.onmessage({ data: "flush" });
  const samples = [];
  for (const m of w.posted) samples.push(...new Int16Array(m.flushed || m));
  let crossings = 0;
  for (let i = 1; i < samples.length; i++) if (samples[i - 1] < 0 && samples[i] >= 0) crossings++;
  const frames = w.posted.filter((m) => !m.flushed).map((m) => m.byteLength / 2);
  return { rate, outputRate: outputRate || null, samples: samples.length, crossings,
           frame: frames[0] };
});
console.log(JSON.stringify(out));
