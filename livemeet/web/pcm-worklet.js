// AudioWorklet: microphone float32 at the context rate -> mono PCM16 LE frames of 100 ms at
// the rate the page declares in `start` (processorOptions.outputRate, 16 kHz by default).
// Downsampling averages the input samples that fall into each output sample (a box filter,
// enough to keep speech intelligible; the server does proper resampling of other rates). A
// context slower than that rate is upsampled by linear interpolation: the page declares a
// slow context's own rate for a new session (a Bluetooth headset's 8 kHz: livemeet/web/recorder.js
// workletRate, the server resamples it), so that happens only where a page resumes a session
// declared at a higher rate (a reload on another microphone). Each output sample is one per
// `ratio` input samples, whichever way: one per input sample, as before, sent 8-kHz audio
// declared as 16 kHz, twice as fast (a trial).
const DEFAULT_RATE = 16000; // Hz; the model's input rate
const FRAME_S = 0.1; // s of audio per posted frame

class PcmWorklet extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const wanted = options && options.processorOptions && options.processorOptions.outputRate;
    this.rate = wanted || DEFAULT_RATE;
    this.ratio = sampleRate / this.rate; // input samples per output sample
    this.acc = 0; // downsampling: sum of input samples for the current output sample
    this.count = 0; // input samples summed so far
    // downsampling: the fractional input position of the next output sample boundary;
    // upsampling: that of the next output sample past the previous input sample, in [0, 1)
    this.pos = 0;
    this.prev = 0; // upsampling: the previous input sample
    this.frameSamples = Math.round(this.rate * FRAME_S);
    this.out = new Int16Array(this.frameSamples);
    this.fill = 0;
    // Stop asks for the samples of the frame being filled (under 100 ms), so they are sent
    // before `end`: right after Start they may be all the audio there is
    this.port.onmessage = (msg) => {
      if (msg.data === "flush") this.flush();
    };
  }

  flush() {
    const part = this.out.slice(0, this.fill);
    this.fill = 0;
    this.port.postMessage({ flushed: part.buffer }, [part.buffer]);
  }

  emit(x) {
    const y = Math.max(-1, Math.min(1, x));
    this.out[this.fill++] = y < 0 ? y * 0x8000 : y * 0x7fff;
    if (this.fill === this.frameSamples) {
      this.port.postMessage(this.out.buffer, [this.out.buffer]);
      this.out = new Int16Array(this.frameSamples);
      this.fill = 0;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const channels = input.length;
    const n = input[0].length;
    for (let i = 0; i < n; i++) {
      let x = 0;
      for (let c = 0; c < channels; c++) x += input[c][i];
      x /= channels;
      if (this.ratio >= 1) {
        this.acc += x;
        this.count += 1;
        this.pos += 1;
        if (this.pos >= this.ratio) {
          this.pos -= this.ratio;
          this.emit(this.acc / this.count);
          this.acc = 0;
          this.count = 0;
        }
      } else {
        // the output samples between the previous input sample and this one
        for (; this.pos < 1; this.pos += this.ratio) {
          this.emit(this.prev + (x - this.prev) * this.pos);
        }
        this.pos -= 1;
        this.prev = x;
      }
    }
    return true;
  }
}

registerProcessor("pcm-worklet", PcmWorklet);
