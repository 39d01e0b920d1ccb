/* bertlab explore: the model views. "layers" (how each token's vector changes with depth, and the
 * masked-LM head read at every layer), "parameters" (the table of `bertlab summary` and a drawing
 * of the network graph, as keras' plot_model draws it in reference 004) and "output" (what the
 * task head answers). Everything drawn here is read from the payload (schema "bertlab-explore/1");
 * the only arithmetic done in the page is the token x token cosine of one layer's hidden states.
 * SVG figures carry their styles as attributes, so core's PNG/SVG export needs no CSS. */
"use strict";

(() => {
  const FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif";
  const MONO = "DejaVu Sans Mono, Liberation Mono, monospace";
  const INK = "#1d2330", MUTED = "#5c6577", RULE = "#d9dde5", LINE = "#7f8fa9", FOCUS = "#d35400";
  const ACCENT = "#1f5fa8", SOFT = "#9ecae1", WASH = "#f5f6f8";
  const S = BL.svg, E = BL.el;
  const CH = 6.7; // approximate width of one 11px character, for sizing boxes around SVG text

  const txt = (x, y, s, a = {}) => S("text", Object.assign({x, y, "font-family": FONT, "font-size": 11,
    fill: INK}, a), s);
  const svgRoot = (w, h, a = {}) => S("svg", Object.assign({xmlns: "http://www.w3.org/2000/svg",
    width: w, height: h, viewBox: `0 0 ${w} ${h}`, "font-family": FONT}, a),
  S("rect", {width: w, height: h, fill: "#fff"}));
  const chip = (i, extra = "") => E("span", {class: `tok chip ${extra}`, "data-i": i},
    E("span", {class: "piece"}, BL.tokenLabel(i)));
  const pct = p => (p >= 0.001 || p === 0 ? (100 * p).toFixed(1) + "%" : BL.fmt(p, 2)); // tiny: 3.2e-5

  // The token the "focused token" displays follow: the one under the pointer (or pinned), else the
  // first [MASK], else the first word piece.
  function focusOf(p) {
    if (BL.state.token != null && BL.state.token < p.tokens.length) return BL.state.token;
    const m = p.tokens.find(t => t.masked) || p.tokens.find(t => !t.special) || p.tokens[0];
    return m.i;
  }

  // =============================================================================================
  // 1. layers: self- and mean-similarity through depth, the cosine heatmap, the MLM head per layer
  // =============================================================================================

  // One line per token over layers 0..L of A (arr [L+1, T]); lines are .tok paths, so core links
  // them; the focused token's line is redrawn on top (update). The focused token's label and the
  // mean's label sit at their lines' right ends, pushed apart when they would overlap.
  function lineChart(A, title) {
    const {data, shape: [N, T]} = BL.arr(A);
    const W = 540, H = 250, m = {l: 46, r: 120, t: 38, b: 36}, LABEL_GAP = 14;
    let lo = 0;
    for (const v of data) lo = Math.min(lo, v);
    lo = Math.floor(lo * 5) / 5;
    const x = l => m.l + l * (W - m.l - m.r) / Math.max(1, N - 1);
    const y = v => m.t + (1 - (v - lo) / (1 - lo)) * (H - m.t - m.b);
    const s = svgRoot(W, H, {class: "bl-lines"});
    s.append(txt(m.l, 16, title, {class: "bl-title", "font-weight": 600, "font-size": 12}));
    for (let v = lo; v <= 1.0001; v += 0.2) {
      s.append(S("line", {x1: m.l, x2: W - m.r, y1: y(v), y2: y(v), stroke: v === 0 ? "#aab" : "#eceef2"}),
        txt(m.l - 6, y(v) + 4, v.toFixed(1), {"text-anchor": "end", fill: MUTED, "font-size": 10}));
    }
    for (let l = 0; l < N; l++) {
      s.append(txt(x(l), H - m.b + 14, l === 0 ? "emb" : String(l), {"text-anchor": "middle", fill: MUTED,
        "font-size": 10}));
    }
    s.append(txt((m.l + W - m.r) / 2, H - 6, "layer (0 = embedding output)", {"text-anchor": "middle",
      fill: MUTED, "font-size": 10}));
    const path = i => Array.from({length: N}, (_, l) =>
      `${l ? "L" : "M"}${x(l).toFixed(1)},${y(data[l * T + i]).toFixed(1)}`).join("");
    const g = S("g", {fill: "none"});
    const op = T > 200 ? 0.18 : T > 40 ? 0.35 : 0.6;
    for (let i = 0; i < T; i++) {
      g.append(S("path", {class: "tok", "data-i": i, d: path(i), stroke: LINE, "stroke-opacity": op,
        "stroke-width": 1.4}, S("title", null, `${BL.tokenLabel(i)} (${i})`)));
    }
    s.append(g);
    const mean = new Float32Array(N); // the mean over tokens, dashed
    for (let l = 0; l < N; l++) { for (let i = 0; i < T; i++) mean[l] += data[l * T + i] / T; }
    let md = ""; for (let l = 0; l < N; l++) md += `${l ? "L" : "M"}${x(l)},${y(mean[l])}`;
    const meanLabel = txt(W - m.r + 6, y(mean[N - 1]) + 4, "mean of tokens", {class: "bl-mean-label", fill: INK,
      "font-size": 10});
    s.append(S("path", {d: md, fill: "none", stroke: INK, "stroke-width": 1.5, "stroke-dasharray": "5 3",
      "pointer-events": "none"}), meanLabel);
    const hi = S("path", {fill: "none", stroke: FOCUS, "stroke-width": 2.6, "pointer-events": "none"});
    const hiLabel = txt(W - m.r + 6, 0, "", {class: "bl-focus-label", fill: FOCUS, "font-weight": 600,
      "font-family": MONO});
    const hiNote = txt(m.l + 4, m.t - 8, "", {class: "bl-focus-note", fill: FOCUS, "font-size": 10});
    s.append(hi, hiLabel, hiNote);
    // the two labels' baselines: each beside its line's end, at least LABEL_GAP apart, inside the plot
    const labelsAt = (v, mv) => {
      let a = y(v) + 4, b = y(mv) + 4;
      if (Math.abs(a - b) < LABEL_GAP) {
        const mid = (a + b) / 2, up = v >= mv ? -1 : 1; // the larger value's label goes above
        a = mid + up * LABEL_GAP / 2; b = mid - up * LABEL_GAP / 2;
      }
      const top = m.t + 6, bottom = H - m.b, shift = Math.max(0, top - Math.min(a, b)) -
        Math.max(0, Math.max(a, b) - bottom);
      return [a + shift, b + shift];
    };
    // the focused token's values, layer by layer; the middle ones give way to "…" on a deep model
    const noteOf = i => {
      const head = `${BL.clip(BL.tokenLabel(i), 16)} (${i}): `, vals = Array.from({length: N}, (_, l) =>
        data[l * T + i].toFixed(2));
      const text = vs => head + vs.join(" → ");
      let shown = vals.slice();
      while (shown.length > 3 && BL.textWidth(text(shown), 10, FONT) > W - m.l - 8) {
        shown = vals.slice(0, Math.ceil((shown.length - 2) / 2)).concat(["…"],
          vals.slice(N - Math.floor((shown.length - 2) / 2)));
      }
      return text(shown);
    };
    const update = i => {
      hi.setAttribute("d", path(i));
      const [a, b] = labelsAt(data[(N - 1) * T + i], mean[N - 1]);
      hiLabel.setAttribute("y", a.toFixed(1));
      meanLabel.setAttribute("y", b.toFixed(1));
      hiLabel.textContent = BL.clip(BL.tokenLabel(i), 14);
      hiNote.textContent = noteOf(i);
    };
    return {svg: s, update};
  }

  // Cosine similarity of every pair of tokens in hidden[l] (arr [L+1, T, H]): a T x T Float32Array.
  function cosines(p, l, cache) {
    if (cache.has(l)) return cache.get(l);
    const [, T, H] = BL.arr(p.layers.hidden).shape, unit = new Float32Array(T * H);
    for (let t = 0; t < T; t++) {
      const v = BL.row(p.layers.hidden, l, t);
      let n = 0; for (let k = 0; k < H; k++) n += v[k] * v[k];
      n = Math.sqrt(n) || 1;
      for (let k = 0; k < H; k++) unit[t * H + k] = v[k] / n;
    }
    const c = new Float32Array(T * T);
    for (let a = 0; a < T; a++) for (let b = a; b < T; b++) {
      let d = 0; for (let k = 0; k < H; k++) d += unit[a * H + k] * unit[b * H + k];
      c[a * T + b] = c[b * T + a] = d;
    }
    cache.set(l, c);
    return c;
  }

  // Draws rows/cols idx (token indices) of the T x T matrix c into canvas cv, cell px per pair, with
  // token labels when there is room, a colour bar below, and the focused token's row and column framed.
  // The cells are kept in images (key: layer and window) so that a token change only redraws frames.
  function drawHeat(cv, c, T, idx, cell, lo, focus, images, key) {
    const n = idx.length, lab = cell >= 9 ? 84 : 0, bar = 34, side = n * cell;
    cv.width = lab + side + 8; cv.height = lab + side + bar;
    const ctx = cv.getContext("2d"), img = images.get(key) || ctx.createImageData(side, side), px = img.data;
    if (!images.has(key)) for (let r = 0; r < n; r++) for (let q = 0; q < n; q++) {
      const col = BL.colorRGB(c[idx[r] * T + idx[q]], lo, 1);
      for (let yy = r * cell; yy < (r + 1) * cell; yy++) for (let xx = q * cell; xx < (q + 1) * cell; xx++) {
        const o = (yy * side + xx) * 4;
        px[o] = col[0]; px[o + 1] = col[1]; px[o + 2] = col[2]; px[o + 3] = 255;
      }
    }
    if (key != null) images.set(key, img);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, cv.width, cv.height);
    ctx.putImageData(img, lab, lab);
    ctx.font = `${Math.min(11, cell + 1)}px ${MONO}`;
    if (lab) {
      ctx.fillStyle = INK; ctx.textBaseline = "middle";
      idx.forEach((t, k) => {
        const s = BL.clip(BL.tokenLabel(t), 11, false);
        ctx.textAlign = "right"; ctx.fillText(s, lab - 4, lab + k * cell + cell / 2);
        ctx.save(); ctx.translate(lab + k * cell + cell / 2, lab - 4); ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left"; ctx.fillText(s, 0, 0); ctx.restore();
      });
    }
    const k = idx.indexOf(focus);
    if (k >= 0) {
      ctx.strokeStyle = FOCUS; ctx.lineWidth = 1.5;
      ctx.strokeRect(lab + 0.5, lab + k * cell + 0.5, side - 1, cell);
      ctx.strokeRect(lab + k * cell + 0.5, lab + 0.5, cell, side - 1);
    }
    const by = lab + side + 8, bw = Math.min(200, side); // colour bar: lo .. 1
    for (let xx = 0; xx < bw; xx++) {
      ctx.fillStyle = BL.color(lo + (1 - lo) * xx / bw, lo, 1);
      ctx.fillRect(lab + xx, by, 1, 10);
    }
    ctx.fillStyle = MUTED; ctx.font = `10px ${FONT}`; ctx.textBaseline = "top";
    ctx.textAlign = "left"; ctx.fillText(lo.toFixed(2), lab, by + 12);
    ctx.textAlign = "right"; ctx.fillText("1.00 cosine", lab + bw, by + 12);
    return {lab, cell, idx};
  }

  function heatPanel(p, view) {
    const L1 = p.layers.hidden.shape[0], T = p.tokens.length, cache = new Map(), images = new Map();
    const big = T > 128, cell = Math.max(1, Math.min(14, Math.floor(480 / T)));
    const slider = E("input", {type: "range", id: "layers-heat-layer", min: 0, max: L1 - 1, step: 1,
      value: L1 - 1});
    const shown = E("span", {class: "num"});
    const readout = E("div", {class: "bl-heat-readout note"}, "hover a cell to read it");
    const over = E("canvas", {class: "bl-heat"}), zoom = E("canvas", {class: "bl-heat"});
    const ZN = 40; // the zoom window: ZN tokens around the focused one, with labels
    const zoomFig = E("figure", {hidden: T <= 48}, zoom, E("figcaption", null,
      `Zoom: ${ZN} tokens around the focused token, with labels (follows the pointer).`));
    const all = Array.from({length: T}, (_, t) => t);
    let geo = null, zgeo = null;
    function draw() {
      const l = Number(slider.value), c = cosines(p, l, cache), f = focusOf(p);
      let lo = 1; // the colour scale runs from the layer's lowest cosine (or 0) to 1
      for (let a = 0; a < T; a++) for (let b = 0; b < T; b++) if (a !== b) lo = Math.min(lo, c[a * T + b]);
      lo = Math.min(0, Math.floor(lo * 10) / 10);
      shown.textContent = l === 0 ? "0 (embedding output)" : `${l} (output of encoder layer ${l - 1})`;
      geo = drawHeat(over, c, T, all, cell, lo, f, images, `${l}`);
      if (T > 48) {
        const a0 = Math.max(0, Math.min(T - ZN, f - ZN / 2));
        zgeo = drawHeat(zoom, c, T, all.slice(a0, a0 + ZN), 11, lo, f, images, null);
        const ctx = over.getContext("2d"); // where the zoom window lies in the overview
        ctx.strokeStyle = INK; ctx.setLineDash([3, 2]);
        ctx.strokeRect(geo.lab + a0 * cell + 0.5, geo.lab + a0 * cell + 0.5, ZN * cell, ZN * cell);
      }
    }
    function hover(cv, g, ev) {
      const r = cv.getBoundingClientRect(), sx = cv.width / r.width;
      const col = Math.floor(((ev.clientX - r.left) * sx - g.lab) / g.cell);
      const row = Math.floor(((ev.clientY - r.top) * sx - g.lab) / g.cell);
      if (row < 0 || col < 0 || row >= g.idx.length || col >= g.idx.length) return null;
      const i = g.idx[row], j = g.idx[col], c = cosines(p, Number(slider.value), cache);
      readout.textContent = "";
      readout.append(chip(i), " · ", chip(j), ` cosine ${c[i * T + j].toFixed(4)}`);
      return i;
    }
    for (const [cv, g] of [[over, () => geo], [zoom, () => zgeo]]) {
      cv.addEventListener("mousemove", ev => hover(cv, g(), ev));
      cv.addEventListener("click", ev => { const i = hover(cv, g(), ev); if (i != null) BL.set({token: i}); });
    }
    slider.addEventListener("input", draw);
    view.redrawHeat = draw;
    const note = big ? `${T} tokens: the overview draws one pixel per token pair without labels; the zoom ` +
      "beside it shows the focused token's neighbourhood with labels." : "";
    return E("div", null,
      E("h3", null, "Cosine similarity between tokens at one layer"),
      E("div", {class: "controls"}, E("label", null, "hidden state ", slider), shown),
      E("div", {class: "row"}, E("figure", null, over, E("figcaption", null,
        "cos(hᵢ, hⱼ) of the layer's hidden states, computed in the page from the payload; " +
        "the focused token's row and column are framed." + (note ? " " + note : ""))), zoomFig),
      readout);
  }

  // The MLM head read at every layer: a row per layer 0..L with the top-k pieces for token i.
  function predictionRows(p, i, table, fig) {
    const P = p.predictions, {shape: [N, , K]} = BL.arr(P.token), own = p.tokens[i].id;
    table.textContent = "";
    table.append(E("caption", null, "Top ", String(K), " predictions of the masked-LM head for ", chip(i),
      ` (token ${i}), applied to the hidden state after every layer`),
    E("tr", null, E("th", null, "layer"), Array.from({length: K}, (_, k) => E("th", null, `#${k + 1}`))));
    const W = 110 * K + 70, s = svgRoot(W, 24 + 20 * N); // the same table as a figure, for export
    s.append(txt(4, 14, `masked-LM head at every layer, token ${i} "${BL.tokenLabel(i)}"`, {"font-weight": 600}));
    for (let l = 0; l < N; l++) {
      const tr = E("tr", {class: "pred-row" + (l === N - 1 ? " pred-last" : ""), "data-layer": l},
        E("td", {class: "n"}, l === 0 ? "emb" : String(l)));
      s.append(txt(4, 36 + 20 * l, l === 0 ? "emb" : `layer ${l}`, {fill: MUTED}));
      for (let k = 0; k < K; k++) {
        const id = BL.at(P.token, l, i, k), pr = BL.at(P.prob, l, i, k);
        const piece = P.strings[String(id)] ?? `#${id}`;
        tr.append(E("td", {class: "pred" + (id === own ? " own" : ""), style: `--p: ${(100 * pr).toFixed(2)}%`, title: `id ${id}`},
          E("span", {class: "piece"}, piece), " ", E("span", {class: "num muted"}, BL.fmt(pr, 3))));
        const x0 = 70 + 110 * k, y0 = 24 + 20 * l;
        s.append(S("rect", {x: x0, y: y0 + 2, width: 104 * pr, height: 16, fill: SOFT}),
          txt(x0 + 3, y0 + 14, `${BL.clip(piece, 10, false)} ${BL.fmt(pr, 2)}`, {"font-family": MONO, "font-size": 10,
            "font-weight": id === own ? 700 : 400}));
      }
      table.append(tr);
    }
    fig.svg = s;
  }

  BL.view({
    id: "layers", title: "Layers: each token's vector through depth", order: 40,
    render(container, p) {
      const v = this;
      const self = lineChart(p.layers.self_similarity, "Similarity to its own input: cos(hₗ(t), h₀(t))");
      const mean = lineChart(p.layers.mean_similarity, "Mean similarity to the other tokens at layer l");
      const box = E("div", {id: "layers-view"});
      box.append(E("p", {class: "note"}, "Each line is one token. Left: how far its vector moves from the " +
        "embedding it started as. Right: how alike the tokens become with depth (the mean cosine to the " +
        "other tokens of the same layer). Hover a line or a token to follow it in every view."),
      E("div", {class: "row"}, self.svg, mean.svg), heatPanel(p, v));
      const fig = {svg: null};
      const table = E("table", {id: "predictions", class: "bl-pred"});
      if (p.predictions) {
        box.append(E("h3", null, "The masked-LM head at every layer"),
          E("p", {class: "note"}, "The model's own prediction is the last row; the rows above apply the " +
            "same head to earlier layers (a logit-lens reading). The focused token's predictions are shown: " +
            "by default the first [MASK]; a bold piece is the input token itself."), table);
      } else {
        box.append(E("h3", null, "Predictions per layer"), E("p", {class: "note", id: "predictions-none"},
          `No predictions: this model (${p.model.class}, head "${p.model.head}") has no masked-LM head, so ` +
          "there is no trained map from a hidden state back to word pieces to read at each layer."));
      }
      container.append(box);
      let last = null, frame = 0;
      const update = () => {
        const i = focusOf(p);
        self.update(i); mean.update(i);
        if (p.predictions && i !== last) predictionRows(p, i, table, fig);
        last = i;
        if (!frame) frame = requestAnimationFrame(() => { frame = 0; v.redrawHeat(); }); // at most once a frame
      };
      update();
      cancelAnimationFrame(frame); frame = 0; v.redrawHeat(); // drawn now: export mode reads it at once
      BL.on((st, ch) => { if (ch.includes("token")) update(); });
      v.figure = () => [self.svg, mean.svg, box.querySelector("canvas.bl-heat"), fig.svg].filter(Boolean);
    },
  });

  // =============================================================================================
  // 2. parameters: the summary table and the network graph
  // =============================================================================================

  function paramTable(p) {
    const P = p.parameters, L = p.model.layers, total = P.total || 1;
    const t = E("table", {id: "param-table", class: "bl-params"},
      E("tr", null, ["Parameter group", "Kind", "Output shape", "Params", "share", "Formula"].map((h, k) =>
        E("th", {class: k === 3 ? "n" : null}, h))));
    const rowOf = r => E("tr", {class: "param-row", "data-name": r.name, "data-layer": r.layer ?? ""},
      E("td", {class: "mono"}, r.name), E("td", null, r.kind), E("td", {class: "mono"}, r.output_shape),
      E("td", {class: "n"}, BL.count(r.params)),
      E("td", null, E("span", {class: "bl-share", style: {width: `${Math.max(1, 80 * r.params / total)}px`}})),
      E("td", {class: "mono"}, r.formula));
    const rest = P.rows.filter(r => r.layer != null && r.layer >= 1);
    let sub = null;
    for (const r of P.rows) {
      if (r.layer != null && r.layer >= 1) {
        if (!sub) { // one subtotal row stands for layers 1..L-1 until clicked
          const n = rest.reduce((a, q) => a + q.params, 0);
          sub = E("tr", {class: "param-subtotal", tabindex: 0, title: "click to show every layer"},
            E("td", {class: "mono"}, ""),
            E("td", null, `× ${L - 1}`), E("td", null, ""), E("td", {class: "n"}, BL.count(n)),
            E("td", null, E("span", {class: "bl-share", style: {width: `${Math.max(1, 80 * n / total)}px`}})),
            E("td", {class: "mono"}, `${L - 1} × ${BL.count(n / Math.max(1, L - 1))}`));
          const span = L > 2 ? `encoder.layer.1–${L - 1} (${L - 1} layers` : "encoder.layer.1 (1 layer";
          const label = open => {
            sub.firstChild.textContent = `${open ? "▾" : "▸"} ${span}, click to ${open ? "fold" : "expand"})`;
          };
          const toggle = () => {
            const open = sub.classList.toggle("open");
            t.querySelectorAll("tr.param-row.bl-folded").forEach(tr => { tr.hidden = !open; });
            label(open);
          };
          label(false);
          sub.addEventListener("click", toggle);
          sub.addEventListener("keydown", ev => {
            if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); toggle(); }
          });
          t.append(sub);
        }
        const tr = rowOf(r); tr.classList.add("bl-folded"); tr.hidden = true; t.append(tr);
      } else t.append(rowOf(r));
    }
    const legend = (P.legend || "").split(",").map(s => s.trim()).filter(Boolean).map(s => {
      const sym = s.split(" ")[0];
      return P.symbols && sym in P.symbols ? `${s} = ${BL.count(P.symbols[sym])}` : s;
    }).join(" · ");
    const tot = E("p", {id: "param-total", class: "mono"}, `Total ${BL.count(P.total)} parameters · ` +
      `trainable ${BL.count(P.trainable)} · non-trainable ${BL.count(P.total - P.trainable)} · ` +
      `${BL.count(P.tensors)} named tensors`);
    return [t, tot, E("p", {class: "note"}, "Legend: ", legend)];
  }

  // ---- the graph: measure (sizes, bottom-up), then place (coordinates, top-down) -------------------

  const PAD = 10, GAP = 20, SKIP = 30, LH = 14;
  const lines = n => [`${n.name}: ${n.class}`, `${n.in} → ${n.out}`]
    .concat(n.params ? [`${BL.count(n.params)} params`] : []);
  const textW = ss => Math.max(...ss.map((s, k) => s.length * (k ? CH : 7.4))) + 2 * PAD; // line 0 is bold

  function measure(n, parent, open) {
    if (n.op) return {n, kind: "op", w: n.name.length * CH + 26, h: 24};
    const kids = n.children || [];
    const isLayer = n.layer != null && (!parent || parent.layer == null);
    const isOpen = kids.length && (open.has(n.id) ? open.get(n.id) : !(isLayer && n.layer >= 1));
    if (!kids.length || !isOpen) {
      const ls = lines(n);
      if (kids.length) ls.push(`▸ ${kids.length} parts (click)`);
      return {n, kind: kids.length ? "collapsed" : "leaf", ls, isLayer, w: Math.max(150, textW(ls)),
        h: ls.length * LH + 12};
    }
    const ks = kids.map(k => measure(k, n, open)), ls = lines(n), head = ls.length * LH + 10;
    const extra = n.residual ? SKIP : 0;
    const w = n.parallel
      ? Math.max(textW(ls), ks.reduce((a, k) => a + k.w, 0) + GAP * (ks.length - 1) + 2 * PAD)
      : Math.max(textW(ls), Math.max(...ks.map(k => k.w)) + 2 * PAD) + extra;
    const h = head + GAP + (n.parallel ? Math.max(...ks.map(k => k.h))
      : ks.reduce((a, k) => a + k.h, 0) + GAP * (ks.length - 1)) + PAD;
    return {n, kind: "group", ls, ks, head, isLayer, w, h};
  }

  function clickable(g, fn) { // a header: click, or Enter / Space from the keyboard
    g.setAttribute("tabindex", 0);
    g.setAttribute("role", "button");
    g.addEventListener("click", fn);
    g.addEventListener("keydown", ev => {
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); fn(); }
    });
  }

  const arrow = (x1, y1, x2, y2, a = {}) => S("path", Object.assign({d: `M${x1},${y1}L${x2},${y2}`,
    stroke: "#8a93a6", "stroke-width": 1.2, fill: "none", "marker-end": "url(#bl-arrow)"}, a));

  // pos: id -> the placed box of every node drawn so far (the residual arrows aim at an inner "add").
  function place(b, x, y, onToggle, pos) {
    pos.set(b.n.id, {x, y, w: b.w, h: b.h});
    const n = b.n, title = S("title", null,
      `${n.id || "model"}: ${n.class}\nin ${n.in}\nout ${n.out}\n${BL.count(n.params)} parameters`);
    if (b.kind === "op") {
      return S("g", {class: "g-op", "data-id": n.id}, title,
        S("rect", {x, y, width: b.w, height: b.h, rx: 12, fill: "#fff4e0", stroke: "#d9a441"}),
        txt(x + b.w / 2, y + 16, n.name, {"text-anchor": "middle", "font-family": MONO, "font-size": 10.5}));
    }
    const label = (ls, x0, y0) => ls.map((s, k) => txt(x0 + PAD, y0 + 16 + k * LH, s, k === 0
      ? {"font-weight": 600} : {fill: MUTED, "font-family": MONO, "font-size": 10}));
    if (b.kind !== "group") {
      const leaf = b.kind === "leaf", cls = leaf ? "g-leaf" : "g-node collapsed" + (b.isLayer ? " g-layer" : "");
      const g = S("g", {class: cls, "data-id": n.id, "data-layer": n.layer ?? null}, title);
      if (!leaf) { // a folded group: a stacked card
        g.append(S("rect", {x: x + 4, y: y + 4, width: b.w, height: b.h, rx: 4, fill: "#e9edf4", stroke: "#aab4c6"}));
      }
      const head = S("g", {class: leaf ? null : "g-head", cursor: leaf ? null : "pointer"},
        S("rect", {x, y, width: b.w, height: b.h, rx: 4, fill: leaf ? "#eef4fb" : "#dde8f6",
          stroke: leaf ? "#9db5d6" : ACCENT}), label(b.ls, x, y));
      if (!leaf) clickable(head, () => onToggle(n.id, true));
      g.append(head);
      return g;
    }
    const g = S("g", {class: "g-node" + (b.isLayer ? " g-layer" : ""), "data-id": n.id,
      "data-layer": n.layer ?? null});
    const head = S("g", {class: "g-head", cursor: "pointer"}, title,
      S("rect", {x, y, width: b.w, height: b.head, rx: 4, fill: "#e3e9f2", stroke: "#aab4c6"}),
      label(b.ls.map((s, k) => k ? s : "▾ " + s), x, y));
    clickable(head, () => onToggle(n.id, false));
    g.append(S("rect", {x, y, width: b.w, height: b.h, rx: 4, fill: "none", stroke: "#aab4c6",
      "stroke-dasharray": b.isLayer ? null : "3 2"}), head);
    const top = y + b.head + GAP, inner = b.w - 2 * PAD - (n.residual ? SKIP : 0);
    const cx = x + PAD + inner / 2, hb = y + b.head;
    const row = b.ks.reduce((a, k) => a + k.w, 0) + GAP * (b.ks.length - 1); // parallel: centred row
    let kx = x + PAD + (n.parallel ? (b.w - 2 * PAD - row) / 2 : 0), ky = top;
    const boxes = [];
    for (const k of b.ks) { // children: side by side (parallel) or top to bottom, arrows between them
      const kxx = n.parallel ? kx : x + PAD + (inner - k.w) / 2;
      boxes.push({x: kxx, y: ky, w: k.w, h: k.h});
      g.append(place(k, kxx, ky, onToggle, pos));
      if (n.parallel) { g.append(arrow(cx, hb, kxx + k.w / 2, ky - 1)); kx += k.w + GAP; } else ky += k.h + GAP;
    }
    if (!n.parallel) {
      g.append(arrow(cx, hb, cx, top - 1));
      for (let k = 1; k < boxes.length; k++) {
        g.append(arrow(cx, boxes[k - 1].y + boxes[k - 1].h, cx, boxes[k].y - 1));
      }
    }
    if (n.residual && boxes.length) { // the skip connection: input -> the add in the last child (or the child)
      const add = (function find(k) {
        if (k.kind === "op" && /add|\+/i.test(k.n.name)) return k.n.id;
        for (const c of k.ks || []) { const r = find(c); if (r != null) return r; }
        return null;
      })(b.ks[b.ks.length - 1]);
      const last = (add != null && pos.get(add)) || boxes[boxes.length - 1];
      const xr = x + b.w - SKIP / 2, yy = last.y + last.h / 2;
      g.append(S("path", {d: `M${cx},${hb + GAP / 2}H${xr}V${yy}H${last.x + last.w + 1}`, fill: "none",
        stroke: ACCENT, "stroke-width": 1.3, "stroke-dasharray": "5 3", "marker-end": "url(#bl-arrow-skip)"}),
      txt(xr - 3, hb + GAP / 2 - 3, "residual", {"text-anchor": "end", fill: ACCENT, "font-size": 9}));
    }
    return g;
  }

  function drawGraph(s, p, open) {
    const b = measure(p.graph, null, open), W = b.w + 2 * PAD + 6, H = b.h + 2 * PAD + 6;
    s.textContent = "";
    for (const [k, v] of Object.entries({width: W, height: H, viewBox: `0 0 ${W} ${H}`})) s.setAttribute(k, v);
    const marker = (id, fill) => S("marker", {id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse"}, S("path", {d: "M0,0L10,5L0,10z", fill}));
    s.append(S("defs", null, marker("bl-arrow", "#8a93a6"), marker("bl-arrow-skip", ACCENT)),
      S("rect", {width: W, height: H, fill: "#fff"}));
    const toggle = (id, wasFolded) => { open.set(id, wasFolded); drawGraph(s, p, open); };
    s.append(place(b, PAD, PAD, toggle, new Map()));
  }

  BL.view({
    id: "parameters", title: "Parameters and the network graph", order: 50,
    render(container, p) {
      const open = new Map();
      const s = S("svg", {id: "graph", xmlns: "http://www.w3.org/2000/svg", "font-family": FONT});
      const setAll = on => () => {
        (function walk(n, parent) {
          if (n.layer != null && (!parent || parent.layer == null)) open.set(n.id, on);
          (n.children || []).forEach(k => walk(k, n));
        })(p.graph, null);
        drawGraph(s, p, open);
      };
      container.append(...paramTable(p),
        E("h3", null, "The network graph"),
        E("p", {class: "note"}, "Modules in call order, as keras' plot_model draws them (reference 004): " +
          "each box names the module, its class, input → output shape and parameters. Small rounded boxes are " +
          "operations without parameters; dashed blue arrows are the residual connections into add & " +
          "LayerNorm. Click a header to fold or unfold it; encoder layers 1.. start folded."),
        E("div", {class: "controls toggle"},
          E("button", {type: "button", on: {click: setAll(true)}}, "expand all layers"),
          E("button", {type: "button", on: {click: setAll(false)}}, "fold all layers")),
        E("div", {class: "bl-graph-box"}, s));
      drawGraph(s, p, open);
      this.figure = () => s;
    },
  });

  // =============================================================================================
  // 3. output: what the task head answers
  // =============================================================================================

  // Horizontal bars, one per item {label, value (0..1), note}; the largest is drawn in the accent.
  function bars(title, items) {
    const lw = Math.max(60, ...items.map(it => BL.chars(it.label).length * CH + 12));
    const W = lw + 400, H = 28 + 22 * items.length;
    const s = svgRoot(W, H), best = Math.max(...items.map(it => it.value));
    s.append(txt(4, 15, title, {"font-weight": 600, "font-size": 12}));
    items.forEach((it, k) => {
      const y = 24 + 22 * k;
      s.append(txt(lw - 6, y + 13, it.label, {"text-anchor": "end", "font-family": MONO}),
        S("rect", {x: lw, y: y + 2, width: 220, height: 16, fill: WASH}),
        S("rect", {x: lw, y: y + 2, width: Math.max(1, 220 * it.value), height: 16,
          fill: it.value === best ? ACCENT : SOFT}),
        txt(lw + 226, y + 13, `${pct(it.value)}${it.note ? "  " + it.note : ""}`,
          {"font-family": MONO, "font-size": 10, fill: MUTED}));
    });
    return s;
  }

  // The tokens as an SVG strip that wraps, each a .tok group with an optional line under it.
  function tokenStrip(p, under, shade) {
    const W = 900, T = p.tokens.length, items = [];
    let x = 4, y = 4;
    const rowH = under ? 42 : 26;
    for (let i = 0; i < T; i++) {
      const s = BL.tokenLabel(i), u = under ? under(i) : null;
      const w = Math.max(BL.chars(s).length * 7.3, u ? BL.chars(u.text).length * 5.9 : 0) + 12; // 12px mono, 9.5px sans
      if (x + w > W) { x = 4; y += rowH + 4; }
      items.push({i, s, u, x, y, w});
      x += w + 4;
    }
    const svg = svgRoot(W, y + rowH + 6, {class: "bl-strip"});
    for (const it of items) {
      svg.append(S("g", {class: "tok", "data-i": it.i, cursor: "pointer"},
        S("rect", {class: "tok-bg", x: it.x, y: it.y, width: it.w, height: rowH, rx: 3,
          fill: shade ? shade(it.i) : "#fff", stroke: RULE}),
        txt(it.x + it.w / 2, it.y + 16, it.s, {"text-anchor": "middle", "font-family": MONO, "font-size": 12}),
        it.u ? txt(it.x + it.w / 2, it.y + 33, it.u.text, {"text-anchor": "middle", "font-size": 9.5,
          fill: it.u.color}) : null));
    }
    return svg;
  }

  // Start and end logits of extractive QA as two rows of bars over the tokens (one column each).
  function logitRows(p, o) {
    const T = p.tokens.length, cw = Math.max(3, Math.min(22, Math.floor(860 / T))), lw = 70, rh = 60;
    const s = svgRoot(lw + T * cw + 10, 2 * rh + 40);
    const rows = [["start", BL.arr(o.start).data, o.best.start], ["end", BL.arr(o.end).data, o.best.end]];
    rows.forEach(([name, v, best], r) => {
      let m = 1e-6; for (const a of v) m = Math.max(m, Math.abs(a));
      const base = 10 + r * (rh + 14) + rh / 2;
      s.append(txt(lw - 6, base + 4, `${name} logit`, {"text-anchor": "end", fill: MUTED, "font-size": 10}),
        S("line", {x1: lw, x2: lw + T * cw, y1: base, y2: base, stroke: RULE}));
      for (let i = 0; i < T; i++) {
        const h = (rh / 2 - 2) * Math.abs(v[i]) / m;
        s.append(S("rect", {x: lw + i * cw + 0.5, y: v[i] >= 0 ? base - h : base, width: Math.max(1, cw - 1),
          height: Math.max(0.5, h), fill: i === best ? FOCUS : SOFT},
        S("title", null, `${BL.tokenLabel(i)} (${i}): ${name} ${v[i].toFixed(3)}`)));
      }
    });
    for (let i = 0; i < T; i++) { // full-height hover columns, linked like any token
      s.append(S("rect", {class: "tok bl-col", "data-i": i, x: lw + i * cw, y: 4, width: cw,
        height: 2 * rh + 24, fill: "#000", "fill-opacity": 0}));
    }
    s.append(txt(lw, 2 * rh + 36, "each column is one token; hover to link it; the best span's start and end " +
      "are orange", {fill: MUTED, "font-size": 10}));
    return s;
  }

  const HUES = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf", "#ff7f0e"]; // one colour per token-classification label

  function outputOf(p) {
    const o = p.output, figs = [], parts = []; // parts: everything shown, in order; figs: the SVGs among them
    const fig = f => { figs.push(f); parts.push(f); };
    const nsp = () => {
      fig(bars("Next sentence prediction (the [CLS] head)",
        o.nsp.labels.map((l, k) => ({label: l, value: o.nsp.probs[k]}))));
      parts.push(E("p", {class: "note"}, p.pair ? "Is the second segment the sentence that follows the first?"
        : "There is no second segment here, so this answers for the text alone."));
    };
    const mlm = () => {
      const P = p.predictions;
      if (!P) return;
      const N = P.token.shape[0], K = P.token.shape[2];
      const masked = p.tokens.filter(t => t.masked).map(t => t.i);
      const which = masked.length ? masked : [focusOf(p)];
      parts.push(E("p", {class: "note"}, masked.length
        ? "The masked-LM head's answer for each [MASK] (last layer):"
        : "No [MASK] in the input; the head's answer for the focused token (last layer):"));
      for (const i of which.slice(0, 8)) {
        fig(bars(`token ${i} "${BL.tokenLabel(i)}"`, Array.from({length: K}, (_, k) => {
          const id = BL.at(P.token, N - 1, i, k);
          return {label: P.strings[String(id)] ?? `#${id}`, value: BL.at(P.prob, N - 1, i, k)};
        })));
      }
      if (which.length > 8) {
        parts.push(E("p", {class: "note"}, `(the first 8 of ${which.length} masks are shown)`));
      }
    };
    switch (o.kind) {
      case "base":
        parts.push(E("p", null, "The pooled vector (the [CLS] hidden state through the pooler's dense + " +
          "tanh) has norm ", E("span", {class: "num"}, BL.fmt(o.pooled_norm, 4)), "."),
        E("p", {class: "note"}, `This model (${p.model.class}) has no task head: what it answers is the ` +
          "hidden states and this pooled vector, which a task head (or a sentence embedding) would be trained on."));
        break;
      case "masked-lm": mlm(); break;
      case "pretraining": mlm(); nsp(); break;
      case "nsp": nsp(); break;
      case "sequence-classification":
        fig(bars("Class probabilities (softmax of the logits)", o.labels.map((l, k) => ({label: l,
          value: o.probs[k], note: `logit ${BL.fmt(o.logits[k], 3)}`}))));
        break;
      case "token-classification":
        fig(tokenStrip(p, i => ({text: `${o.labels[o.per_token[i]]} ${(100 * o.probs[i]).toFixed(0)}%`,
          color: HUES[o.per_token[i] % HUES.length]})));
        parts.push(E("p", {class: "note"}, "The label the head gives each token, with its probability."));
        break;
      case "question-answering": {
        const b = o.best;
        parts.push(E("p", null, "Best span: tokens ", E("span", {class: "num"}, `${b.start}–${b.end}`), " “",
          E("b", null, b.text), "”, score (start + end logit) ", E("span", {class: "num"}, BL.fmt(b.score, 3)), "."));
        fig(tokenStrip(p, null, i => (i >= b.start && i <= b.end ? "#ffe2c6" : "#fff")));
        fig(logitRows(p, o));
        break;
      }
      default:
        parts.push(E("p", {class: "note"}, `This page does not know how to draw a "${o.kind}" head's output.`));
    }
    return {figs, parts};
  }

  BL.view({
    id: "output", title: "Output: what the head answers", order: 60,
    render(container, p) {
      let {figs, parts} = outputOf(p);
      const box = E("div", {id: "head-output", "data-kind": p.output.kind}, ...parts);
      container.append(box);
      if (p.predictions && !p.tokens.some(t => t.masked)) { // no [MASK]: the answer follows the focused token
        BL.on((st, ch) => {
          if (!ch.includes("token")) return;
          ({figs, parts} = outputOf(p));
          box.replaceChildren(...parts);
        });
      }
      // a figure for export even when the head has nothing to draw: the sentences as SVG text
      this.figure = () => figs.length ? figs : (() => {
        const s = svgRoot(720, 20 + 18 * parts.length);
        parts.forEach((e, k) => s.append(txt(6, 20 + 18 * k, e.textContent, {"font-size": 12})));
        return s;
      })();
    },
  });
})();
