/* bertlab explore: start-up. Reads the payload and the mode from the page's two JSON script
 * elements and renders every registered view (in their `order`). Everything is per document, so
 * the same page embedded several times in one notebook (each in its own iframe srcdoc) works. */
"use strict";

(function boot() {
  function json(id) {
    const e = document.getElementById(id);
    return e ? JSON.parse(e.textContent) : null;
  }
  function start() {
    const root = document.getElementById("bertlab-root") || document.body;
    let payload, mode;
    try {
      payload = json("bertlab-payload");
      mode = json("bertlab-mode") || {serve: false};
      if (!payload || payload.format !== "bertlab-explore/1") {
        throw new Error(`expected a "bertlab-explore/1" payload, found ${payload ? payload.format : "none"}`);
      }
    } catch (e) {
      root.textContent = "bertlab explore: this page has no readable payload (" + e.message + ").";
      console.error(e);
      return;
    }
    BL.load(payload);
    // the layer and head asked for (bertlab.explore(..., layer=, head=)), when in range
    const m = payload.model;
    if (mode.layer >= 0 && mode.layer < m.layers) BL.state.layer = mode.layer;
    if (mode.head >= 0 && mode.head < m.heads) BL.state.head = mode.head;
    BL.mount(root, mode);
    // Inside a notebook's iframe: tell the parent how tall the page is (it may size the frame).
    if (window.parent && window.parent !== window) {
      const tell = () => window.parent.postMessage(
        {bertlab: "height", height: document.documentElement.scrollHeight}, "*");
      tell();
      if (window.ResizeObserver) new ResizeObserver(tell).observe(document.body);
    }
    if (location.hash === "#export") BL.exportAll();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
