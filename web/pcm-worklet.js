// AudioWorklet: microphone float32 at the context rate -> 16 kHz mono PCM16 LE frames.
// Downsampling averages the input samples that fall into each output sample (a box filter,
// enough to keep speech intelligible; the server does proper resampling of other rates).
const TARGET_RATE = 16000; // Hz; the model's only input rate
const FRAME_SAMPLES = 1600; // 100 ms at 16 kHz per posted frame

class PcmWorklet extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ratio = sampleRate / TARGET_RATE; // input samples per output sample
    this.acc = 0; // sum of input samples for the current output sample
    this.count = 0; // input samples summed so far
    this.pos = 0; // fractional input position of the next output sample boundary
    this.out = new Int16Array(FRAME_SAMPLES);
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

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const channels = input.length;
    const n = input[0].length;
    for (let i = 0; i < n; i++) {
      let x = 0;
      for (let c = 0; c < channels; c++) x += input[c][i];
      this.acc += x / channels;
      this.count += 1;
      this.pos += 1;
      if (this.pos >= this.ratio) {
        this.pos -= this.ratio;
        const y = Math.max(-1, Math.min(1, this.acc / this.count));
        this.out[this.fill++] = y < 0 ? y * 0x8000 : y * 0x7fff;
        this.acc = 0;
        this.count = 0;
        if (this.fill === FRAME_SAMPLES) {
          this.port.postMessage(this.out.buffer, [this.out.buffer]);
          this.out = new Int16Array(FRAME_SAMPLES);
          this.fill = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("pcm-worklet", PcmWorklet);
