/* bertlab explore: the core every view builds on.
 *
 * One global object, BL: the payload and its arrays, the shared state (the token under the
 * pointer, the chosen layer, head and pair), the view registry, DOM helpers that never parse
 * HTML (token strings and the input text are user data), the two palettes, number formatting,
 * and PNG/SVG export. The payload format is bertlab/explore/payload.py's (schema: "bertlab-explore/1").
 *
 * Conventions for views:
 *  - BL.view({id, title, order, render(container, payload), figure()}) registers a view; BL.mount
 *    builds <section class="view" id="view-ID" data-view="ID"> with the title and the PNG/SVG
 *    buttons and calls render(container, payload) with the section's body.
 *  - BL.on(fn) listeners are called as fn(state, changedKeys). BL.load (a new payload) drops every
 *    listener and state; views add theirs again when they render.
 *  - An element with class "tok" and data-i is a token: hovering sets state.token, leaving it for
 *    anything that is not a token sets it back to null (the views' overviews), a click pins it (a
 *    second click unpins; a pinned token stays when the pointer leaves), and core gives every .tok
 *    of the current token the class "hl".
 *  - Text is cut by code points, never by String indices: the payload's character offsets are
 *    Python str indices (code points), and an emoji is one code point but two UTF-16 units.
 *    BL.chars(s) is the code points of s, BL.clip(s, n) its first n of them.
 */
"use strict";

const BL = (() => {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const cache = new WeakMap(); // array object of the payload -> {data, shape}
  let listeners = [];
  let pinned = false;
  const views = [];

  // ---- arrays -------------------------------------------------------------------------------

  function bytesOf(b64) {
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let k = 0; k < bin.length; k++) out[k] = bin.charCodeAt(k);
    return out;
  }

  // IEEE 754 half -> float, by hand (Float16Array may not exist): 1 sign, 5 exponent, 10 mantissa bits.
  const F16 = (() => {
    const table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) {
      const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
      if (e === 0) table[h] = s * m * 2 ** -24; // subnormal: m/1024 * 2^-14
      else if (e === 31) table[h] = m ? NaN : s * Infinity;
      else table[h] = s * (1 + m / 1024) * 2 ** (e - 15);
    }
    return table;
  })();

  // Typed arrays read in the platform's byte order; every browser platform is little-endian,
  // which is the payload's order.
  function decode(a) {
    const bytes = bytesOf(a.b64);
    const buf = bytes.buffer;
    switch (a.dtype) {
      case "f32": return new Float32Array(buf);
      case "i32": return new Int32Array(buf);
      case "u16": return new Uint16Array(buf);
      case "f16": {
        const raw = new Uint16Array(buf), out = new Float32Array(raw.length);
        for (let k = 0; k < raw.length; k++) out[k] = F16[raw[k]];
        return out;
      }
      default: throw new Error("unknown dtype " + a.dtype);
    }
  }

  function arr(a) {
    let d = cache.get(a);
    if (!d) {
      d = {data: decode(a), shape: a.shape.slice()};
      const n = d.shape.reduce((p, q) => p * q, 1);
      if (d.data.length !== n) throw new Error(`array of shape [${d.shape}] holds ${d.data.length} numbers`);
      cache.set(a, d);
    }
    return d;
  }

  // Row-major offset of the leading indices idx (fewer indices than axes = start of that block).
  function offset(shape, idx) {
    let off = 0;
    for (let k = 0; k < shape.length; k++) off = off * shape[k] + (k < idx.length ? idx[k] : 0);
    return off;
  }
  function at(a, ...idx) { const d = arr(a); return d.data[offset(d.shape, idx)]; }
  function row(a, ...idx) {
    const d = arr(a), n = d.shape[d.shape.length - 1], off = offset(d.shape, idx);
    return d.data.subarray(off, off + n);
  }

  // ---- attention, full or summarised to the top-k of each row --------------------------------

  function attention(l, h, i, j) {
    const A = BL.payload.layers.attention;
    if (A.dtype) return at(A, l, h, i, j);
    const idx = row(A.index, l, h, i), val = row(A.value, l, h, i);
    for (let k = 0; k < idx.length; k++) if (idx[k] === j) return val[k];
    return null;
  }
  function attentionRow(l, h, i) {
    const A = BL.payload.layers.attention, out = [];
    if (A.dtype) {
      const r = row(A, l, h, i);
      for (let j = 0; j < r.length; j++) out.push([j, r[j]]);
    } else {
      const idx = row(A.index, l, h, i), val = row(A.value, l, h, i);
      for (let k = 0; k < idx.length; k++) out.push([idx[k], val[k]]);
    }
    return out;
  }

  // ---- state and views ------------------------------------------------------------------------

  const state = {token: null, layer: 0, head: 0, pair: null};

  function set(patch) {
    const changed = [];
    for (const k of Object.keys(patch)) {
      if (JSON.stringify(state[k]) !== JSON.stringify(patch[k])) { state[k] = patch[k]; changed.push(k); }
    }
    if (!changed.length) return;
    if (changed.includes("token")) highlight();
    for (const fn of listeners.slice()) {
      try { fn(state, changed); } catch (e) { console.error(e); }
    }
  }
  function on(fn) { listeners.push(fn); }
  function view(spec) { views.push(spec); views.sort((a, b) => (a.order || 0) - (b.order || 0)); }

  function highlight() {
    const root = document;
    for (const e of root.querySelectorAll(".tok.hl")) e.classList.remove("hl");
    if (state.token == null) return;
    for (const e of root.querySelectorAll(`.tok[data-i="${state.token}"]`)) e.classList.add("hl");
  }

  function load(payload) {
    BL.payload = payload;
    listeners = [];
    pinned = false;
    Object.assign(state, {token: null, layer: 0, head: 0, pair: null});
  }

  // ---- DOM helpers: text only, never HTML ----------------------------------------------------

  function fill(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === "on") { for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn); }
      else if (k === "style" && typeof v === "object") Object.assign(node.style, v);
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c == null || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  const el = (tag, attrs, ...children) => fill(document.createElement(tag), attrs, children);
  const svg = (tag, attrs, ...children) => fill(document.createElementNS(SVG_NS, tag), attrs, children);

  // ---- palettes ------------------------------------------------------------------------------

  // Sequential: white -> light blue -> dark blue, one palette for every heatmap.
  const SEQ = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  function ramp(stops, t) {
    t = Math.max(0, Math.min(1, Number.isFinite(t) ? t : 0)) * (stops.length - 1);
    const k = Math.min(stops.length - 2, Math.floor(t)), f = t - k, a = stops[k], b = stops[k + 1];
    return [0, 1, 2].map(c => Math.round(a[c] + (b[c] - a[c]) * f));
  }
  function colorRGB(v, lo = 0, hi = 1) { return ramp(SEQ, hi > lo ? (v - lo) / (hi - lo) : 0); }
  function color(v, lo, hi) { const c = colorRGB(v, lo, hi); return `rgb(${c[0]},${c[1]},${c[2]})`; }
  // Diverging: negative blue, zero white, positive red.
  const DIV = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];
  function divergingRGB(v, absMax) { return ramp(DIV, absMax > 0 ? 0.5 + 0.5 * v / absMax : 0.5); }
  function diverging(v, absMax) { const c = divergingRGB(v, absMax); return `rgb(${c[0]},${c[1]},${c[2]})`; }

  // A canvas heatmap of rows x cols cells of cw x ch pixels (both default to cell), value(r, c)
  // coloured by rgb(v) (default: color(v, lo, hi)).
  function heatCanvas(rows, cols, value, {lo = 0, hi = 1, cell = 4, cw = cell, ch = cell, rgb = null,
    cls = null} = {}) {
    const cv = el("canvas", {width: cols * cw, height: rows * ch, class: cls});
    const ctx = cv.getContext("2d"), img = ctx.createImageData(cols * cw, rows * ch), px = img.data;
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) {
      const v = value(r, c), col = rgb ? rgb(v) : colorRGB(v, lo, hi);
      for (let y = r * ch; y < (r + 1) * ch; y++) for (let x = c * cw; x < (c + 1) * cw; x++) {
        const o = (y * cols * cw + x) * 4;
        px[o] = col[0]; px[o + 1] = col[1]; px[o + 2] = col[2]; px[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    return cv;
  }
  // A vector as one strip of diverging colours (one column per dimension).
  function strip(vec, absMax, {width = 384, height = 18} = {}) {
    const n = vec.length, cv = el("canvas", {width, height, class: "strip"}), ctx = cv.getContext("2d");
    for (let k = 0; k < n; k++) {
      ctx.fillStyle = diverging(vec[k], absMax);
      const x0 = Math.floor(k * width / n), x1 = Math.floor((k + 1) * width / n);
      ctx.fillRect(x0, 0, Math.max(1, x1 - x0), height);
    }
    return cv;
  }

  // ---- text ----------------------------------------------------------------------------------

  function tokenLabel(i) { const t = BL.payload.tokens[i]; return t ? t.token : "?"; }

  // The code points of s (the units of the payload's offsets); the first n of them, with "…" in
  // the last place when some are left out (ellipsis = false: just the first n).
  const chars = s => Array.from(s == null ? "" : String(s));
  function clip(s, n, ellipsis = true) {
    const c = chars(s);
    if (c.length <= n) return c.join("");
    return ellipsis ? c.slice(0, Math.max(0, n - 1)).join("") + "…" : c.slice(0, n).join("");
  }

  // The width of s in px pixels of the page's monospace font (for laying out SVG text).
  const MONO = 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", Menlo, monospace';
  let measurer = null;
  function textWidth(s, px = 12, family = MONO) {
    measurer = measurer || document.createElement("canvas").getContext("2d");
    measurer.font = `${px}px ${family}`;
    return measurer.measureText(s).width;
  }

  // Fixed digits for ordinary magnitudes, exponent form for the very small or large; ASCII "-".
  function fmt(x, digits = 4) {
    if (x == null || Number.isNaN(x)) return "–";
    if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
    if (Number.isInteger(x) && Math.abs(x) < 1e15) return String(x);
    const a = Math.abs(x);
    if (a !== 0 && (a < 10 ** -digits || a >= 1e6)) return x.toExponential(Math.max(1, digits - 1));
    return x.toFixed(digits);
  }
  // An integer with thin thousands separators: 109,482,240.
  function count(n) { return Number(n).toLocaleString("en-US"); }

  // ---- export --------------------------------------------------------------------------------

  // Presentation properties copied inline into an exported SVG (it is drawn without the page's CSS).
  const STYLE_PROPS = ["fill", "fill-opacity", "stroke", "stroke-width", "stroke-opacity",
    "stroke-dasharray", "opacity", "font-family", "font-size", "font-weight", "font-style",
    "text-anchor", "dominant-baseline", "visibility", "display"];

  function inlineStyles(src, dst) {
    if (src.nodeType !== 1) return;
    const cs = getComputedStyle(src);
    const style = STYLE_PROPS.map(p => { const v = cs.getPropertyValue(p); return v ? `${p}:${v}` : ""; })
      .filter(Boolean).join(";");
    if (style) dst.setAttribute("style", style);
    dst.removeAttribute("class");
    for (let k = 0; k < src.children.length; k++) inlineStyles(src.children[k], dst.children[k]);
  }

  function svgSize(s) {
    const w = parseFloat(s.getAttribute("width")), h = parseFloat(s.getAttribute("height"));
    if (w > 0 && h > 0) return [w, h];
    const r = s.getBoundingClientRect();
    if (r.width > 0 && r.height > 0) return [r.width, r.height];
    const vb = s.viewBox && s.viewBox.baseVal;
    return vb && vb.width ? [vb.width, vb.height] : [300, 150];
  }

  function serialise(s) {
    const [w, h] = svgSize(s), c = s.cloneNode(true);
    inlineStyles(s, c);
    c.setAttribute("xmlns", SVG_NS);
    c.setAttribute("width", w);
    c.setAttribute("height", h);
    return {text: new XMLSerializer().serializeToString(c), w, h};
  }

  function b64utf8(text) {
    const bytes = new TextEncoder().encode(text);
    let bin = "";
    for (let k = 0; k < bytes.length; k += 0x8000) bin += String.fromCharCode(...bytes.subarray(k, k + 0x8000));
    return btoa(bin);
  }
  const svgURL = text => "data:image/svg+xml;base64," + b64utf8(text);

  function loadImage(url) {
    return new Promise((ok, fail) => {
      const im = new Image();
      im.onload = () => ok(im);
      im.onerror = () => fail(new Error("could not draw an SVG figure for export"));
      im.src = url;
    });
  }

  function figuresOf(id) {
    const v = views.find(x => x.id === id);
    if (!v) throw new Error(`no view "${id}"`);
    let figs = v.figure ? v.figure() : [];
    figs = (Array.isArray(figs) ? figs : [figs]).filter(Boolean);
    if (!figs.length) throw new Error(`view "${id}" has nothing to export`);
    return figs;
  }

  const PAD = 12, SCALE = 2;
  async function exportView(id, kind = "png") {
    const parts = figuresOf(id).map(f => f instanceof HTMLCanvasElement
      ? {canvas: f, w: f.width, h: f.height} : serialise(f));
    const W = Math.ceil(Math.max(...parts.map(p => p.w)) + 2 * PAD);
    const H = Math.ceil(parts.reduce((s, p) => s + p.h + PAD, PAD));
    if (kind === "svg") {
      let y = PAD, body = "";
      for (const p of parts) {
        const inner = p.canvas
          ? `<image x="0" y="0" width="${p.w}" height="${p.h}" href="${p.canvas.toDataURL("image/png")}"/>`
          : p.text;
        body += `<g transform="translate(${PAD},${y})">${inner}</g>`;
        y += p.h + PAD;
      }
      return svgURL(`<svg xmlns="${SVG_NS}" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">` +
        `<rect width="100%" height="100%" fill="#fff"/>${body}</svg>`);
    }
    const cv = document.createElement("canvas");
    cv.width = W * SCALE; cv.height = H * SCALE;
    const ctx = cv.getContext("2d");
    ctx.scale(SCALE, SCALE);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    ctx.imageSmoothingEnabled = false; // heatmap cells stay sharp
    let y = PAD;
    for (const p of parts) {
      const src = p.canvas || await loadImage(svgURL(p.text));
      ctx.drawImage(src, PAD, y, p.w, p.h);
      y += p.h + PAD;
    }
    return cv.toDataURL("image/png");
  }

  async function download(id, kind) {
    try {
      const url = await exportView(id, kind);
      const a = el("a", {href: url, download: `bertlab-${id}.${kind}`});
      document.body.appendChild(a); a.click(); a.remove();
    } catch (e) { console.error(e); }
  }

  // ---- the page: header, banner, form, sections -----------------------------------------------

  function header(root, payload) {
    const m = payload.model;
    root.appendChild(el("header", {class: "bl-header"},
      el("h1", {id: "bertlab-title"}, "bertlab explore"),
      el("p", {class: "bl-model"}, `${m.name || m.path} · ${m.class} (${m.head}) · L=${m.layers} ` +
        `A=${m.heads} H=${m.hidden} D=${m.head_dim} · ${payload.tokens.length} tokens`)));
    const notes = [...(payload.summarised || [])];
    const tr = payload.truncated;
    // payload.py may already say so in `summarised` (a sentence naming the token count)
    if (tr && !notes.some(s => s.includes(String(tr.tokens)))) notes.unshift(`The input had ${tr.tokens} tokens; it was truncated to ${tr.kept} ` +
      `(the model reads at most ${tr.limit} positions).`);
    const banner = el("div", {id: "bertlab-notes", class: "bl-notes", role: "note"},
      notes.map(s => el("p", null, s)));
    if (!notes.length) banner.hidden = true;
    root.appendChild(banner);
  }

  function form(root, payload) {
    const err = el("p", {id: "explore-error", class: "bl-error", role: "alert"});
    const text = el("textarea", {id: "explore-text", rows: 2}, payload.text);
    const pair = el("input", {id: "explore-pair", type: "text", placeholder: "second segment (optional)",
      value: payload.pair || ""});
    const trunc = el("input", {id: "explore-truncate", type: "checkbox", checked: !!payload.truncated});
    const f = el("form", {id: "explore-form", class: "bl-form"},
      el("label", null, "Text ", text), el("label", null, "Pair ", pair),
      el("label", null, trunc, " truncate to the model's length"),
      el("button", {type: "submit"}, "Explore"), err);
    f.addEventListener("submit", async ev => {
      ev.preventDefault();
      err.textContent = "";
      const body = {text: text.value, pair: pair.value.trim() ? pair.value : null, truncate: trunc.checked};
      try {
        const r = await fetch("./api/explore", {method: "POST", body: JSON.stringify(body),
          headers: {"Content-Type": "application/json"}});
        const reply = await r.json();
        if (!r.ok || reply.error) { err.textContent = reply.error || `HTTP ${r.status}`; return; }
        BL.load(reply);
        mount(BL.root, {serve: true});
      } catch (e) { err.textContent = String(e.message || e); }
    });
    root.appendChild(f);
  }

  // Builds the whole page into root from BL.payload (again, after a new payload in serve mode).
  function mount(root, mode = {}) {
    BL.root = root;
    root.textContent = "";
    const payload = BL.payload;
    header(root, payload);
    if (mode.serve) form(root, payload);
    for (const v of views) {
      const body = el("div", {class: "view-body"});
      const btn = kind => el("button", {type: "button", "data-export": kind, title: `save as ${kind.toUpperCase()}`,
        on: {click: () => download(v.id, kind)}}, kind.toUpperCase());
      const sec = el("section", {class: "view", id: "view-" + v.id, "data-view": v.id},
        el("div", {class: "view-head"}, el("h2", null, v.title), el("span", {class: "view-export"}, btn("png"), btn("svg"))),
        body);
      root.appendChild(sec);
      try { v.render(body, payload); }
      catch (e) { console.error(e); body.appendChild(el("p", {class: "bl-error"}, `this view failed: ${e.message}`)); }
    }
    highlight();
  }

  // Token linking, once per document: hover sets state.token, leaving clears it, click pins / unpins.
  function tokenAt(node) {
    const t = node && node.closest && node.closest(".tok[data-i]");
    return t ? Number(t.dataset.i) : null;
  }
  const tokenOf = ev => tokenAt(ev.target);
  document.addEventListener("mouseover", ev => {
    const i = tokenOf(ev);
    if (i != null && !pinned) set({token: i});
  });
  // Leaving a token for something that is not one (from a chip's text to the chip itself is not
  // leaving): the views go back to their overviews, unless a token is pinned.
  document.addEventListener("mouseout", ev => {
    if (pinned || tokenOf(ev) == null || tokenAt(ev.relatedTarget) != null) return;
    set({token: null});
  });
  document.addEventListener("click", ev => {
    const i = tokenOf(ev);
    if (i == null) return;
    pinned = !(pinned && state.token === i);
    set({token: i});
  });

  // Export mode (the CLI's --png): every view as PNG into <pre id="bertlab-export">.
  async function exportAll() {
    const out = {};
    for (const v of views) {
      try { out[v.id] = await exportView(v.id, "png"); } catch (e) { console.error(e); out[v.id] = null; }
    }
    const pre = el("pre", {id: "bertlab-export", hidden: true}, JSON.stringify(out));
    document.body.appendChild(pre);
    document.body.dataset.exported = "1";
  }

  return {
    payload: null, state, root: null, views,
    arr, at, row, attention, attentionRow, set, on, view, load, mount, exportAll,
    el, svg, color, colorRGB, diverging, divergingRGB, heatCanvas, strip, chars, clip, textWidth, MONO,
    tokenLabel, fmt, count, exportView, highlight, pinned: () => pinned,
  };
})();
window.BL = BL;
