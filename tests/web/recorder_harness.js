// Runs livemeet/web/recorder.js in a stub browser (node's vm): clicks Start and prints the status line
// as JSON. argv: recorder.js path, then "secure" or "insecure" (an http page off localhost,
// where browsers leave navigator.mediaDevices undefined).
const fs = require("fs");
const vm = require("vm");

const [source, context] = process.argv.slice(2);
const elements = {};
function element(id) {
  if (!elements[id]) {
    elements[id] = {
      id, disabled: false, textContent: "", style: {}, listeners: {},
      addEventListener(type, fn) { this.listeners[type] = fn; },
      replaceChildren() {}, append() {},
    };
  }
  return elements[id];
}
const secure = context === "secure";
const sandbox = {
  document: { getElementById: element, createElement: () => element(`new-${Math.random()}`) },
  window: { isSecureContext: secure, addEventListener() {} },
  navigator: secure ? { mediaDevices: { getUserMedia: async () => { throw new Error("denied"); } } } : {},
  location: { host: "10.0.0.5:8000", protocol: secure ? "https:" : "http:",
              href: `${secure ? "https" : "http"}://10.0.0.5:8000/` },
  URL,
  fetch: async () => ({ ok: true, json: async () => ({ demo: false, model: "m" }) }),
  setInterval, clearInterval, setTimeout, clearTimeout, performance, console,
};
vm.runInNewContext(fs.readFileSync(source, "utf8"), sandbox);
// after the page's own start-up (it fetches readyz and sets the status line)
setTimeout(() => element("start").listeners.click(), 20);
setTimeout(() => console.log(JSON.stringify({
  status: element("status").textContent, start_disabled: element("start").disabled,
})), 80);
